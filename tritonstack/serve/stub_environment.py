"""The environment the launcher gives tritonserver and, through it, the backend
stubs it spawns: a setting of the C library's allocator (docs/memory.md).

glibc's malloc serves a block of 128 KiB or more with mmap, and gives it back to
the system when freed; but after the first such free it raises that threshold to
the freed block's size (up to 32 MiB). In the DALI stub the freed blocks are
decoded images, so the threshold climbs to the largest image seen, and from then
on every image-sized buffer comes from the heap. Images of varied sizes, freed and
reallocated by DALI's threads in varied order, leave holes in the heap that glibc
keeps (it returns only the heap's top): the stub's RSS grew by several MiB per
round of the same requests while its live allocations stayed flat. Setting the
threshold explicitly turns the adjustment off: image buffers are mmapped and
returned whole, and RSS stays flat.

Opt-in (`tritonstack serve --compact-memory`), not the default: measured
side by side on a quiet 2-core machine (`tritonstack benchmark --quick`), these settings cost
20 % of the ensemble's throughput (144-150 against 182 images/s), a third of the DALI
model's and two thirds of the Pillow model's (every image-sized buffer is mapped,
faulted in and unmapped again). The DALI stub no longer needs them to stay flat: the
dali backend gives its image buffers to DALI's own pool (docs/memory.md); they keep
the other stubs' heaps and tritonserver's smaller, at that price.
"""

from __future__ import annotations

from tritonstack.backends.settings import MALLOC_TRIM_ENV, POOL_RESIDENCY_ENV

# glibc's own starting value, fixed. An M_MMAP_THRESHOLD set by the environment
# also fixes M_TRIM_THRESHOLD (no dynamic adjustment of either).
MMAP_THRESHOLD_BYTES = 128 * 1024

# ... the dali backend calls malloc_trim(0) after every batch, and leaves DALI's pool
# pages uncounted until a batch writes them (smaller, at the price of late steps).
STUB_ENVIRONMENT: dict[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES),
    MALLOC_TRIM_ENV: "1",
    POOL_RESIDENCY_ENV: "0",
}
