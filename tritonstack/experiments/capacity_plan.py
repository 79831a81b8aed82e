"""Capacity plan from a benchmark: how many replicas a target load needs, and the
queue time to give the autoscaler (the chart's autoscaling.targetQueueTimeUs).

    tritonstack plan reports/benchmark.json --target-rps 400 --p99-ms 150

Reads what tritonstack/benchmark measured on one server (one replica):
- its saturation throughput (`server_images_per_s`, one image per request),
- the latency with nothing queued (`latency_ms_p50_concurrency_1`),
- an open-loop run at a fixed fraction of saturation (`open_loop_rate`,
  `open_loop_ms_p50`, `open_loop_ms_p99`).

The model between those points is a single queue's (M/M/1): time spent waiting
grows as u/(1-u) with the utilization u. From the open-loop point it gives the
highest utilization whose p99 stays within the budget, capped at the measured
utilization (beyond it nothing was measured); replicas = ceil(target / (u *
saturation)). The queue time to target is the waiting time at that utilization:
the open-loop p50 minus the unloaded p50, scaled by the same u/(1-u). It stands
for Triton's queue time summed over the ensemble's steps (what the chart's query
averages); client and network time are in the latency figures too, so the target
errs low: the autoscaler adds replicas a little early, not late.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from tritonstack import cli

# What the plan reads from a benchmark JSON (tritonstack/benchmark writes them).
PLAN_KEYS = (
    "server_images_per_s",
    "latency_ms_p50_concurrency_1",
    "open_loop_rate",
    "open_loop_ms_p50",
    "open_loop_ms_p99",
)


class InfeasiblePlan(ValueError):
    """No utilization meets the budget: the unloaded latency already exceeds it."""


def waiting_factor(utilization: float) -> float:
    """u/(1-u): how a single queue's waiting time grows with its utilization."""
    return utilization / (1.0 - utilization)


@dataclass(frozen=True)
class Plan:
    target_rps: float
    p99_budget_ms: float
    saturation_rps: float  # one replica
    unloaded_ms: float  # p50 at concurrency 1
    measured_utilization: float
    measured_p50_ms: float
    measured_p99_ms: float
    utilization: float  # chosen operating point per replica
    model_utilization: float  # before the cap at the measured point
    replicas: int
    target_queue_time_us: int

    @property
    def replica_rps(self) -> float:
        return self.utilization * self.saturation_rps

    def explain(self) -> str:
        u_m = self.measured_utilization
        k = (self.measured_p99_ms - self.unloaded_ms) / waiting_factor(u_m)
        lines = [
            f"one replica: saturates at {self.saturation_rps:.1f} req/s; unloaded p50 {self.unloaded_ms:.1f} ms",
            f"measured at u = {u_m:.2f} ({u_m * self.saturation_rps:.1f} req/s): "
            f"p50 {self.measured_p50_ms:.1f} ms, p99 {self.measured_p99_ms:.1f} ms",
            f"waiting grows as u/(1-u): p99(u) = {self.unloaded_ms:.1f} + {k:.2f} * u/(1-u) ms "
            f"[{k:.2f} = ({self.measured_p99_ms:.1f} - {self.unloaded_ms:.1f}) / {waiting_factor(u_m):.3f}]",
            f"p99(u) <= {self.p99_budget_ms:.1f} ms  =>  u/(1-u) <= "
            f"{(self.p99_budget_ms - self.unloaded_ms) / k if k > 0 else math.inf:.3f}  =>  "
            f"u <= {self.model_utilization:.3f}",
            f"operating point: u = {self.utilization:.3f}"
            + (
                f" (capped at the measured {u_m:.2f}: nothing was measured beyond it)"
                if self.utilization < self.model_utilization
                else ""
            ),
            f"per replica: {self.utilization:.3f} * {self.saturation_rps:.1f} = {self.replica_rps:.1f} req/s",
            f"replicas: ceil({self.target_rps:.1f} / {self.replica_rps:.1f}) = {self.replicas}"
            f"  (maxReplicas >= {self.replicas + 1} keeps the target with one replica down)",
            f"queue time at u: ({self.measured_p50_ms:.1f} - {self.unloaded_ms:.1f}) ms * "
            f"{waiting_factor(self.utilization):.3f} / {waiting_factor(u_m):.3f} = "
            f"{self.target_queue_time_us / 1000:.2f} ms",
            f"autoscaling.targetQueueTimeUs: {self.target_queue_time_us}",
        ]
        return "\n".join(lines)


def plan(results: dict, target_rps: float, p99_budget_ms: float) -> Plan:
    missing = [key for key in PLAN_KEYS if results.get(key) is None]
    if missing:
        raise KeyError(f"the benchmark JSON lacks {missing} (run tritonstack/benchmark)")
    saturation = float(results["server_images_per_s"])
    unloaded = float(results["latency_ms_p50_concurrency_1"])
    measured_u = float(results["open_loop_rate"]) / saturation
    p50, p99 = float(results["open_loop_ms_p50"]), float(results["open_loop_ms_p99"])
    if p99_budget_ms <= unloaded:
        raise InfeasiblePlan(
            f"a p99 budget of {p99_budget_ms} ms is below the unloaded latency "
            f"{unloaded:.1f} ms: more replicas cannot help; a faster replica (GPU) can"
        )
    # p99(u) = unloaded + k * u/(1-u), k fitted at the measured point.
    k = max(p99 - unloaded, 1e-9) / waiting_factor(measured_u)
    ratio = (p99_budget_ms - unloaded) / k
    model_u = ratio / (1.0 + ratio)
    utilization = min(model_u, measured_u)
    replicas = max(1, math.ceil(target_rps / (utilization * saturation)))
    queue_ms = max(p50 - unloaded, 0.0) * waiting_factor(utilization) / waiting_factor(measured_u)
    return Plan(
        target_rps,
        p99_budget_ms,
        saturation,
        unloaded,
        measured_u,
        p50,
        p99,
        utilization,
        model_u,
        replicas,
        max(1, round(queue_ms * 1000)),
    )


if __name__ == "__main__":
    sys.exit(cli.replaced_by("tritonstack plan"))
