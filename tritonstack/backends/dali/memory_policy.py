"""How a dali stub keeps its memory, decided once at load: DALI's host pool or
buffers handed back after large runs, a pool block reserved ahead, pool pages
counted when reserved, glibc's heap trimmed every N batches, the memory probe's
trace (docs/memory.md)."""

from __future__ import annotations

import time

from tritonstack.backends.dali.allocator import malloc_trim, pool_threshold_bytes, reserve_host_pool
from tritonstack.backends.residency import PoolResidency, RegionResidency, statm_bytes
from tritonstack.backends.settings import BackendSettings
from tritonstack.backends.stub_memory import StubMemoryGauge
from tritonstack.media.decode_budget import int_parameter

# Memory is looked at after a batch at most this often, and after every batch with a
# large decoder run (a burst's mappings must be told from ordinary ones in that batch):
# a look costs a /proc read, and now and then a read of the maps (0.15-0.2 ms of CPU an
# image when done after every batch of a 2-core server's ~2 images).
ACCOUNT_EVERY_S = 0.25


class MemoryPolicy:
    def __init__(self, settings: BackendSettings, parameters: dict, gauge: StubMemoryGauge):
        # With DALI's host pool on, a rebuilt pipeline's buffers go back to the pool,
        # not to the system: releasing after large runs would only cost a rebuild.
        # Unset (a tritonserver the launcher did not start): DALI's own default, a pool.
        threshold = settings.dali_host_pool_threshold
        self.buffers_return = threshold is not None and pool_threshold_bytes(threshold) == 0
        reserve = int_parameter(parameters, "host_pool_reserve_bytes")
        if reserve and not self.buffers_return:  # with the pool off, malloc would hand it back
            reserve_host_pool(reserve)
        # The pool's blocks and the Python backend's region counted in RSS when
        # reserved, not when a late batch reaches them.
        residency = not self.buffers_return and settings.pool_residency
        self._pool = PoolResidency() if residency else None
        self._region = RegionResidency() if residency else None
        self._trace = None
        if settings.memory_trace:  # imported only then: tracing slows every allocation
            from tritonstack.backends.dali.memory_trace import MemoryTrace

            self._trace = MemoryTrace(settings.memory_trace)
        self._trim_every = settings.malloc_trim_every
        self._batches = 0
        self._gauge = gauge
        self._accounted_at = float("-inf")

    def after_batch(self, large_run: bool) -> None:
        """After an execute call's batch: trim and trace when asked, then `account`."""
        self._batches += 1
        if self._trim_every and self._batches % self._trim_every == 0:
            # Pages freed inside glibc's heaps (DALI's image buffers of varied sizes)
            # go back to the system now, not when they happen to reach a heap's top.
            malloc_trim()
        if self._trace is not None:
            self._trace.after_batch()
        self.account(large_run)

    def account(self, large_run: bool = False) -> None:
        """Count the pool's and the region's new pages, and report the stub's RSS:
        after a large run, else at most every ACCOUNT_EVERY_S."""
        now = time.monotonic()
        if not large_run and now - self._accounted_at < ACCOUNT_EVERY_S:
            return
        self._accounted_at = now
        statm = statm_bytes()  # one read for both
        if self._pool is not None:
            populated = self._pool.after_batch(statm, large_run)
            if self._region.after_batch() or populated:
                statm = statm_bytes()
        self._gauge.update(statm.resident)
