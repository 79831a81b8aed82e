"""A backend stub's own memory as a Triton metric, on Triton's /metrics next to its
nv_* families: `tritonstack_stub_rss_bytes{model, instance}`, read after every batch
(and at load). Triton's nv_cpu_memory_used_bytes is the whole machine's; this is
the one process that grows when DALI keeps a burst's buffers (docs/memory.md).

Setting the gauge is a round trip to tritonserver, and reading /proc/self/statm is not
free either (together 0.1-0.2 ms of the stub's CPU an image at the batches a 2-core
server forms, docs/performance.md#where-the-serving-overhead-goes): the stub's memory
is read at most every READ_EVERY_S, and sent when it moved by a MiB or more, or a
second after the last one. The metric is at most a MiB, or a second, behind the stub."""

from __future__ import annotations

import time

import triton_python_backend_utils as pb_utils

from tritonstack.backends.residency import statm_bytes
from tritonstack.backends.server_watch import server_alive

METRIC = "tritonstack_stub_rss_bytes"
# A change the gauge reports at once; a smaller one waits for the next batch a second on.
REPORTED_CHANGE_BYTES = 2**20
REPORT_EVERY_S = 1.0
READ_EVERY_S = 0.25


class StubMemoryGauge:
    def __init__(self, model: str, instance: str):
        # Every stub registers the same family; Triton keeps one, with a series per label set.
        self._family = pb_utils.MetricFamily(
            name=METRIC, description="Resident memory of a backend stub process", kind=pb_utils.MetricFamily.GAUGE
        )
        self._gauge = self._family.Metric(labels={"model": model, "instance": instance})
        self._reported: tuple[int, float] | None = None  # (bytes, monotonic time) last sent
        self._read_at = float("-inf")
        self.update()

    def update(self, resident: int | None = None) -> None:
        """`resident`: the stub's resident bytes where the caller has just read them.
        Skipped once the server is gone: the update waits for its answer."""
        now = time.monotonic()
        if resident is None:
            if now - self._read_at < READ_EVERY_S:
                return
            self._read_at = now
        value = statm_bytes().resident if resident is None else resident
        if self._reported is not None:
            reported, at = self._reported
            if abs(value - reported) < REPORTED_CHANGE_BYTES and now - at < REPORT_EVERY_S:
                return
        if server_alive():
            self._gauge.set(value)
            self._reported = (value, now)
