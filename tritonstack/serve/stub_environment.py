"""The environment `tritonstack serve --compact-memory` adds for tritonserver and,
through it, the backend stubs it spawns (docs/memory.md).

glibc raises its mmap threshold to the size of each large block freed, so in a
stub that decodes images of varied sizes image buffers end up on the heap, whose
holes glibc keeps: RSS creeps while live allocations stay flat. A threshold set
explicitly turns that adjustment off, and the dali backend trims the heap after
every batch and leaves DALI's pool pages uncounted until a batch writes them.

Opt-in, not the default: every image-sized buffer is then mapped, faulted in and
unmapped again, which costs throughput (docs/decisions.md#compact-memory-is-opt-in);
the DALI stub stays flat without it, its image buffers in DALI's own pool.
"""

from __future__ import annotations

from tritonstack.backends.settings import BackendSettings

# glibc's own starting value, fixed. An M_MMAP_THRESHOLD set by the environment
# also fixes M_TRIM_THRESHOLD (no dynamic adjustment of either).
MMAP_THRESHOLD_BYTES = 128 * 1024

STUB_ENVIRONMENT: dict[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES),
    **BackendSettings(malloc_trim_every=1, pool_residency=False).to_environ(),
}
