"""A backend stub's own memory as a Triton metric, on Triton's /metrics next to its
nv_* families: `tritonstack_stub_rss_bytes{model, instance}`, set after every batch
(and at load). Triton's nv_cpu_memory_used_bytes is the whole machine's; this is
the one process that grows when DALI keeps a burst's buffers (docs/memory.md)."""

from __future__ import annotations

import triton_python_backend_utils as pb_utils

from tritonstack.backends.residency import statm_bytes
from tritonstack.backends.server_watch import server_alive

METRIC = "tritonstack_stub_rss_bytes"


class StubMemoryGauge:
    def __init__(self, model: str, instance: str):
        # Every stub registers the same family; Triton keeps one, with a series per label set.
        self._family = pb_utils.MetricFamily(
            name=METRIC, description="Resident memory of a backend stub process", kind=pb_utils.MetricFamily.GAUGE
        )
        self._gauge = self._family.Metric(labels={"model": model, "instance": instance})
        self.update()

    def update(self, resident: int | None = None) -> None:
        """`resident`: the stub's resident bytes where the caller has just read them.
        Skipped once the server is gone: the update waits for its answer."""
        if server_alive():
            self._gauge.set(statm_bytes().resident if resident is None else resident)
