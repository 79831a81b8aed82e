"""The DALI stub's pool residency (tritonstack/backends/residency.py): which
mappings it faults in, and that faulting in keeps their data, on this kernel."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from pathlib import Path

from tritonstack.backends.residency import (
    MISSING_BYTES,
    PoolResidency,
    RegionResidency,
    missing_bytes,
    private_anonymous_ranges,
    statm_bytes,
    subtract,
)
from tritonstack.backends.settings import SHM_DIR

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


def test_pool_blocks_become_resident_with_their_data_kept_but_a_bursts_slack_does_not():
    """Three mappings made after load, kept apart by read-only pages: 12 MiB written
    of 16 and 4 of 64 by ordinary batches (pool blocks steady traffic will fill), 4 of
    64 by a batch with a large decoder run (a burst's block: its slack stays out)."""
    residency = PoolResidency()
    kernel = Path("/proc/sys/kernel/osrelease").read_text().strip()
    assert residency.enabled, f"MADV_POPULATE_WRITE (Linux 5.14) keeps the DALI stub flat; this kernel is {kernel}"
    pattern = bytes(range(256)) * ((12 << 20) // 256)
    with mapped_blocks([16 << 20, 64 << 20]) as (nearly, fresh):
        write(nearly, pattern)
        write(fresh, pattern[: 4 << 20])
        assert missing_bytes(*nearly) == 4 << 20 and missing_bytes(*fresh) == 60 << 20
        assert residency.after_batch(statm_bytes())
        assert missing_bytes(*nearly) == missing_bytes(*fresh) == 0
        assert ctypes.string_at(nearly[0], 12 << 20) == pattern
        assert ctypes.string_at(nearly[0] + (12 << 20), 4 << 20) == bytes(4 << 20)
        with mapped_blocks([64 << 20]) as (burst,):
            write(burst, pattern[: 4 << 20])
            assert residency.after_batch(statm_bytes(), large_run=True)
            assert missing_bytes(*burst) == 60 << 20 > MISSING_BYTES
            assert missing_bytes(*fresh) == 0


def test_a_new_block_is_seen_when_its_batch_adds_little_memory():
    """A batch reserves a 64 MiB block and writes 512 KiB of it, after a look that
    counted an earlier batch's 8 MiB of transient buffers, since freed: the anonymous
    memory fell, but the mapped size changed, so the block is found and faulted in."""
    residency = PoolResidency()
    with mapped_blocks([8 << 20]) as (transient,):
        write(transient, bytes(8 << 20))
        assert residency.after_batch(statm_bytes())
    with mapped_blocks([64 << 20]) as (block,):
        write(block, bytes(512 << 10))
        assert residency.after_batch(statm_bytes())
        assert missing_bytes(*block) == 0
        assert not residency.after_batch(statm_bytes())  # nothing changed since: no look


def test_the_newest_mapping_of_the_shared_region_is_resident_and_older_ones_give_their_pages_back(tmp_path):
    """As the Python backend grows its region: the file mapped at 2 MiB, 1 MiB written
    through that mapping, the file grown to 4 MiB and mapped again. Afterwards the new
    mapping counts the whole file once, the old one nothing, and both read the data."""
    shm = SHM_DIR if SHM_DIR.is_dir() else tmp_path
    path = shm / f"tritonstack-test-region-{os.getpid()}"
    pattern = bytes(range(256)) * ((1 << 20) // 256)
    with open(path, "w+b") as region:
        try:
            region.truncate(2 << 20)
            old = mmap.mmap(region.fileno(), 2 << 20)
            old[: 1 << 20] = pattern
            region.truncate(4 << 20)
            new = mmap.mmap(region.fileno(), 4 << 20)
            residency = RegionResidency(str(path))
            assert residency.enabled
            assert resident_bytes(address_of(new)) == 4 << 20
            assert resident_bytes(address_of(old)) == 0
            assert old[: 1 << 20] == pattern == new[: 1 << 20]
            assert not residency.after_batch()  # the file did not change: nothing read
            old.close()
            new.close()
        finally:
            path.unlink()


def address_of(mapping: mmap.mmap) -> int:
    view = ctypes.c_char.from_buffer(mapping)
    try:
        return ctypes.addressof(view)
    finally:
        del view


def resident_bytes(start: int) -> int:
    """The Rss of this process's mapping that starts at `start` (/proc/self/smaps)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for index, line in enumerate(lines):
        if line.split("-", 1)[0] == f"{start:x}":
            rss = next(row for row in lines[index + 1 :] if row.startswith("Rss:"))
            return int(rss.split()[1]) << 10
    raise AssertionError(f"no mapping at {start:x}")


def write(block: tuple[int, int], data: bytes) -> None:
    ctypes.memmove(block[0], data, len(data))


@contextlib.contextmanager
def mapped_blocks(sizes: list[int]):
    """Anonymous private blocks of `sizes`, each followed by a read-only page so that
    the kernel keeps them apart; yields their (start, end) ranges."""
    page = mmap.PAGESIZE
    total = sum(sizes) + page * len(sizes)
    area = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = address_of(area)
    libc = ctypes.CDLL(None, use_errno=True)
    blocks, offset = [], start
    for size in sizes:
        blocks.append((offset, offset + size))
        assert libc.mprotect(ctypes.c_void_p(offset + size), ctypes.c_size_t(page), mmap.PROT_READ) == 0
        offset += size + page
    try:
        yield blocks
    finally:
        area.close()
