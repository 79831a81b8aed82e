"""The DALI stub's memory made resident as it is reserved, so that steady traffic
cannot raise the stub's RSS in late steps. Two kinds of memory grow that way.

DALI's host pool takes blocks from malloc that double in size
(include/dali/core/mm/pool_resource.h, next_block_size) and keeps them; the kernel
counts a block's pages only once something writes them, so a batch placed on pages
no earlier batch reached raises the stub's RSS long after warm-up
(docs/decisions.md#pool-pages-are-counted-when-reserved). After a batch that mapped a
new block or raised the stub's memory,
each mapping made since the model loaded is faulted in whole (MADV_POPULATE_WRITE, Linux 5.14: the
kernel reads and writes none of the data, so it is safe beside the threads using
it): steady traffic would reach its pages anyway. Except the mappings a batch with a
large decoder run made (above the model's release_above_pixels: a burst of huge
images), whose slack steady traffic never needs: those only when they miss at most
MISSING_BYTES; the launcher's recycling answers bursts.

The Python backend's shared region (tritonserver writes requests there, the stub
its outputs) grows by new mappings of the whole file, the old ones kept
(python_backend src/shm_manager.cc, GrowIfNeeded), and every mapping's pages count
once touched through it: the same pages counted twice and more, reached late. The
stub keeps its newest mapping whole and resident and drops the older ones' page
tables (MADV_DONTNEED, which on a shared mapping keeps the data: a later access
maps the same page again). The launcher sizes the region for a full batch from the
start (settings.STUB_REGION_BYTES), so ordinary traffic does not grow it.
"""

from __future__ import annotations

import ctypes
import os
from typing import NamedTuple

import numpy as np

from tritonstack.backends.settings import SHM_DIR

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_LIBC.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_MADV_DONTNEED = 4  # <linux/mman.h>
_MADV_POPULATE_WRITE = 23
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# glibc's per-thread heaps sit at multiples of their maximum size (HEAP_MAX_SIZE, 64 MiB
# on 64-bit) and keep trimmed pages mapped: faulting those in would undo the trim.
_GLIBC_HEAP_BYTES = 64 << 20
# A batch may add a little anonymous memory (Python objects, small buffers): only a
# rise of this much looks for pool pages that are not resident yet.
_RISE_BYTES = 1 << 20
# A mapping a large decoder run made is faulted in when it misses at most this many
# bytes (a block the burst nearly filled), not when it misses more (the doubling's slack).
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


class Statm(NamedTuple):
    """/proc/self/statm in bytes: the address space mapped, the resident bytes, and of
    them those backed by a file or shared memory; the rest is anonymous memory."""

    size: int
    resident: int
    shared: int


def statm_bytes() -> Statm:
    """This process's memory now, read once (/proc/self/statm)."""
    with open("/proc/self/statm") as statm:
        fields = statm.read().split()
    return Statm(*(int(field) * _PAGE_BYTES for field in fields[:3]))


def _anonymous(statm: Statm) -> int:
    return statm.resident - statm.shared


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
        self._last_seen = self._at_load
        self._burst: list[Range] = []  # made by batches with a large decoder run
        self._looked_at = statm_bytes()
        self.enabled = populate_supported()

    def after_batch(self, statm: Statm, large_run: bool = False) -> bool:
        """`statm`: statm_bytes() after the batch; `large_run`: one of its decoder
        runs was above the model's release_above_pixels. True when the mappings
        were looked at (and pages faulted in)."""
        if not self.enabled or not self._changed(statm):
            return False
        mapped = private_anonymous_ranges(_own_maps())
        if large_run:  # made since the last look: by this batch, which raised the memory
            self._burst += subtract(mapped, self._last_seen)
        self._last_seen = mapped
        grown = subtract(mapped, self._at_load)
        ordinary = subtract(grown, self._burst)
        for start, end in ordinary:
            _populate(start, end)
        for start, end in subtract(grown, ordinary):  # a burst's
            if missing_bytes(start, end) <= MISSING_BYTES:
                _populate(start, end)
        self._looked_at = statm_bytes()
        return True

    def _changed(self, statm: Statm) -> bool:
        """A mapping was made or dropped since the last look (a new pool block is
        one), or the anonymous memory rose: pages of a burst's block reached. The
        rise alone would miss new blocks: the last look may have counted a batch's
        transient buffers, which later batches free."""
        return statm.size != self._looked_at.size or _anonymous(statm) - _anonymous(self._looked_at) >= _RISE_BYTES


def _populate(start: int, end: int) -> None:
    # One unmapped since the maps were read answers ENOMEM: nothing to fill.
    _LIBC.madvise(start, end - start, _MADV_POPULATE_WRITE)


def shared_file_ranges(maps_text: str, path: str) -> list[Range]:
    """The [start, end) ranges of /proc/<pid>/maps that map the file `path` shared."""
    ranges = []
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[1][3] == "s" and fields[5] == path:
            start, end = (int(address, 16) for address in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def stub_region_path() -> str:
    """The Python backend's shared region of this stub: the stub's second argument
    names it (python_backend src/pb_stub.cc, main), shm_open puts it in SHM_DIR."""
    with open("/proc/self/cmdline", "rb") as cmdline:
        arguments = cmdline.read().split(b"\0")
    return str(SHM_DIR / arguments[2].decode()) if len(arguments) > 2 else ""


class RegionResidency:
    """The stub's mappings of the Python backend's region: the newest (the whole
    file as it is now) resident, the older ones' page tables dropped. Checks the
    file's size after every batch (one stat); reads the maps when it changed."""

    def __init__(self, path: str | None = None):
        self.path = stub_region_path() if path is None else path
        self.enabled = populate_supported() and os.path.exists(self.path)
        self._mapped_bytes = 0  # the newest mapping's size when last made resident
        if self.enabled:
            self.after_batch()

    def after_batch(self) -> bool:
        """True when the mappings changed and were made resident again."""
        if not self.enabled:
            return False
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:  # the server is shutting down
            return False
        if size == self._mapped_bytes:
            return False
        ranges = shared_file_ranges(_own_maps(), self.path)
        if not ranges:
            return False
        newest = max(ranges, key=lambda mapped: mapped[1] - mapped[0])
        _populate(*newest)
        for start, end in ranges:
            if (start, end) != newest:
                _LIBC.madvise(start, end - start, _MADV_DONTNEED)
        # The file may have grown before this process mapped it again (tritonserver
        # grows it for requests): then the next batch looks again.
        self._mapped_bytes = newest[1] - newest[0]
        return True
