"""The DALI stub's pool residency (tritonstack.backends.residency.py): which
mappings it faults in, and that faulting in keeps their data, on this kernel."""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

from tritonstack.backends.residency import (
    MISSING_BYTES,
    PoolResidency,
    missing_bytes,
    private_anonymous_ranges,
    statm_bytes,
    subtract,
)

MAPS = """\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/python3
01e1c000-01e3d000 rw-p 00000000 00:00 0           [heap]
7f0000000000-7f0000400000 rw-p 00000000 00:00 0
7f0000400000-7f0004000000 ---p 00000000 00:00 0
7f1000000000-7f1000001000 ---p 00000000 00:00 0
7f1000001000-7f1000801000 rw-p 00000000 00:00 0
7f2000100000-7f200a100000 rw-p 00000000 00:00 0
7f3000000000-7f3000100000 rw-p 00000000 08:02 88    /usr/lib/libdali.so
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0           [stack]
"""


def test_only_malloc_and_pool_mappings_are_candidates():
    """A glibc heap (at a multiple of 64 MiB), a thread stack (above its guard page),
    [heap], [stack] and file mappings are left alone."""
    assert private_anonymous_ranges(MAPS) == [(0x7F2000100000, 0x7F200A100000)]


def test_what_was_mapped_at_load_is_subtracted():
    assert subtract([(0, 100)], [(20, 30), (50, 60)]) == [(0, 20), (30, 50), (60, 100)]
    assert subtract([(0, 100)], [(0, 100)]) == []
    assert subtract([(10, 20)], [(0, 15)]) == [(15, 20)]
    assert subtract([(10, 20), (40, 50)], [(45, 60)]) == [(10, 20), (40, 45)]


def test_a_nearly_written_mapping_becomes_resident_with_its_data_kept_and_a_fresh_one_does_not():
    """One mapping of three parts, a read-only page between them so that the kernel
    keeps them apart: 4 MiB missing of 16 (a pool block nearly filled), 60 of 64 (a
    block a burst reserved)."""
    residency = PoolResidency()
    kernel = Path("/proc/sys/kernel/osrelease").read_text().strip()
    assert residency.enabled, f"MADV_POPULATE_WRITE (Linux 5.14) keeps the DALI stub flat; this kernel is {kernel}"
    nearly, fresh, page = 16 << 20, 64 << 20, mmap.PAGESIZE
    block = mmap.mmap(-1, nearly + page + fresh, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = ctypes.c_char.from_buffer(block)
    start = ctypes.addressof(view)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(start + nearly), ctypes.c_size_t(page), mmap.PROT_READ) == 0
    pattern = bytes(range(256)) * ((12 << 20) // 256)
    try:
        block[: 12 << 20] = pattern
        block[nearly + page : nearly + page + (4 << 20)] = pattern[: 4 << 20]
        assert missing_bytes(start, start + nearly) == 4 << 20
        residency.after_batch(statm_bytes())
        assert missing_bytes(start, start + nearly) == 0
        assert missing_bytes(start + nearly + page, start + nearly + page + fresh) == 60 << 20 > MISSING_BYTES
        assert block[: 12 << 20] == pattern and block[12 << 20 : nearly] == bytes(4 << 20)
    finally:
        del view  # the buffer export, before the block can close
        block.close()
