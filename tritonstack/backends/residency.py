"""DALI's host pool made resident as it fills, so that steady traffic cannot raise
the stub's RSS in late steps.

DALI's host pool takes blocks from malloc that double in size
(include/dali/core/mm/pool_resource.h, next_block_size) and keeps them; the kernel
counts a block's pages only once something writes them. A batch placed on pages of a
block that no earlier batch reached raised the stub's RSS long after warm-up: +1.7 to
+8.6 MiB, once, in one run of several, inside a mapping already 95 % resident
(docs/memory.md). After a batch that raised the stub's memory, each mapping made
since the model loaded that misses at most MISSING_BYTES is faulted in whole
(MADV_POPULATE_WRITE, Linux 5.14: the kernel reads and writes none of the data, so
it is safe beside the threads using it). A mapping missing more (a block a burst
made the pool reserve and barely use: the doubling's slack can be as large as the
burst's run) is left as it is: making it resident would keep far more than steady
traffic uses, and the launcher's recycling answers bursts (docs/memory.md).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_LIBC.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_MADV_POPULATE_WRITE = 23  # <linux/mman.h>
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# glibc's per-thread heaps sit at multiples of their maximum size (HEAP_MAX_SIZE, 64 MiB
# on 64-bit) and keep trimmed pages mapped: faulting those in would undo the trim.
_GLIBC_HEAP_BYTES = 64 << 20
# A batch may add a little anonymous memory (Python objects, small buffers): only a
# rise of this much looks for pool pages that are not resident yet.
_RISE_BYTES = 1 << 20
# A mapping missing at most this many bytes is faulted in.
MISSING_BYTES = 32 << 20

Range = tuple[int, int]


def private_anonymous_ranges(maps_text: str) -> list[Range]:
    """The [start, end) ranges of /proc/<pid>/maps that malloc's mmap and DALI's pool
    blocks are: private, readable and writable, backed by no file; neither a glibc
    heap nor a thread's stack (whose inaccessible guard pages sit just below it)."""
    ranges, below = [], (0, "")
    for line in maps_text.splitlines():
        fields = line.split()
        start, end = (int(address, 16) for address in fields[0].split("-"))
        guarded = below == (start, "---p")
        if len(fields) == 5 and fields[1] == "rw-p" and fields[4] == "0" and not guarded:
            if start % _GLIBC_HEAP_BYTES:
                ranges.append((start, end))
        below = (end, fields[1])
    return ranges


def subtract(ranges: list[Range], taken: list[Range]) -> list[Range]:
    """The parts of `ranges` outside every range of `taken`."""
    left = []
    for start, end in ranges:
        for taken_start, taken_end in sorted(taken):
            if taken_end <= start or taken_start >= end:
                continue
            if taken_start > start:
                left.append((start, taken_start))
            start = max(start, taken_end)
            if start >= end:
                break
        if start < end:
            left.append((start, end))
    return left


def statm_bytes() -> tuple[int, int]:
    """This process's resident bytes, and of them those backed by a file or shared
    memory (/proc/self/statm); the rest is its anonymous memory."""
    with open("/proc/self/statm") as statm:
        fields = statm.read().split()
    return int(fields[1]) * _PAGE_BYTES, int(fields[2]) * _PAGE_BYTES


def _anonymous(statm: tuple[int, int]) -> int:
    resident, shared = statm
    return resident - shared


def populate_supported() -> bool:
    """A kernel before 5.14 answers EINVAL to MADV_POPULATE_WRITE, even for no range."""
    return _LIBC.madvise(None, 0, _MADV_POPULATE_WRITE) == 0


def missing_bytes(start: int, end: int) -> int:
    """The bytes of [start, end) not in memory (mincore); 0 once it is unmapped."""
    pages = (end - start) // _PAGE_BYTES
    vector = (ctypes.c_ubyte * pages)()
    if _LIBC.mincore(ctypes.c_void_p(start), ctypes.c_size_t(end - start), vector):
        return 0
    return (pages - np.count_nonzero(np.frombuffer(vector, dtype=np.uint8) & 1)) * _PAGE_BYTES


def _own_maps() -> str:
    with open("/proc/self/maps") as maps:
        return maps.read()


class PoolResidency:
    """Created once the pipeline is built: what is mapped then (libraries, the
    interpreter's heaps, thread stacks) is never touched; call after_batch() after
    every batch."""

    def __init__(self):
        self._at_load = private_anonymous_ranges(_own_maps())
        self._populated = _anonymous(statm_bytes())
        self.enabled = populate_supported()

    def after_batch(self, statm: tuple[int, int]) -> bool:
        """`statm`: statm_bytes() after the batch. True when pages were faulted in."""
        if not self.enabled or _anonymous(statm) - self._populated < _RISE_BYTES:
            return False
        grown = subtract(private_anonymous_ranges(_own_maps()), self._at_load)
        for start, end in grown:
            if missing_bytes(start, end) <= MISSING_BYTES:
                # One unmapped since the maps were read answers ENOMEM: nothing to fill.
                _LIBC.madvise(start, end - start, _MADV_POPULATE_WRITE)
        self._populated = _anonymous(statm_bytes())
        return True
