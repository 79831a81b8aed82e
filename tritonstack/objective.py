"""The latency objective: the one figure an operator states ("an image is answered
within N ms, or refused"), and every ensemble step's queue ceiling derived from it.

    queue_ceiling_us(1000, first_step=True)    # the first step refuses what waited longer

The objective binds interactive requests, the ones that name no priority (Triton's
stock clients included). A client that would rather wait than be refused sends
contract.BATCH_PRIORITY: its requests are served after the interactive ones, each step
holding them up to BATCH_CEILING_US.

`tritonstack build --latency-objective-ms` writes the ceilings into the configs (each
step's `default_queue_policy`) and the objective into each ensemble's parameters;
`tritonstack serve --latency-objective-ms` applies another one at load, without writing
the repository. Both take the ceilings from here.

Why the server bounds the wait and not each client: most clients (Triton's stock
clients, gateways, proxies) never send Triton's `timeout`. Without a ceiling such a
request waits in a FIFO queue until its own deadline, and under overload every request
served is one that waited almost all of it. With the ceilings, a step refuses (HTTP
503 / gRPC UNAVAILABLE, "Request timeout expired") what waited past its share of the
objective, so that what it starts can still be answered within the objective. A
client's own shorter `timeout` still wins (`allow_timeout_override`); a longer one
cannot extend the ceiling.

The shares leave room for what a queue ceiling does not bound: Triton rejects an
expired request only when the step's scheduler next looks at its queue (at a batch's
end, so a refusal comes up to one batch later), and the time the steps compute.
Figures behind them: docs/reliability.md#latency-objective.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonstack.contract import BATCH_PRIORITY, INTERACTIVE_PRIORITY

# The first step's queue holds the backlog under overload, so it gets the larger share;
# later steps are fed at its pace. A refusal at a later step comes after the first
# step's wait and work and wastes that work, so a later step's share is large enough
# that few are refused there, and no larger: a longer later queue holds more FP32
# tensors in tritonserver, whose allocator keeps the peak (0.3 failed the overload
# soak's memory criterion). The runs behind both: docs/performance.md#overload.
FIRST_STEP_SHARE = 0.3
LATER_STEP_SHARE = 0.25
DEFAULT_OBJECTIVE_MS = 1000
# The ensemble parameter that records the objective a repository was built for.
OBJECTIVE_PARAMETER = "latency_objective_ms"
# Every step with a queue policy runs at least this many instances. A policy turns off
# Triton's payload prefetching (core#237), and its batcher then learns that a busy
# instance has finished only from a new arrival or its 500 ms tick (core's
# WaitForPayloadSlotAvailable). With one instance a backlog with no new arrivals is
# served one batch per tick; a second instance's taking of a batch wakes the batcher
# for the first. Measured: docs/performance.md#why-every-step-runs-two-instances.
MIN_QUEUED_STEP_INSTANCES = 2
# Batch requests (contract.BATCH_PRIORITY) wait this long at most, at every step.
BATCH_CEILING_US = 30_000_000
PRIORITY_LEVELS = max(INTERACTIVE_PRIORITY, BATCH_PRIORITY)


@dataclass(frozen=True)
class StepQueues:
    """What one step's dynamic batcher is told: two priority levels, interactive (the
    default) refused past `interactive_ceiling_us`, batch past BATCH_CEILING_US."""

    interactive_ceiling_us: int
    batch_ceiling_us: int = BATCH_CEILING_US
    priority_levels: int = PRIORITY_LEVELS
    default_priority_level: int = INTERACTIVE_PRIORITY
    batch_priority: int = BATCH_PRIORITY


def step_queues(objective_ms: int, first_step: bool) -> StepQueues | None:
    """A step's queues under `objective_ms`; None: no objective, no ceiling."""
    ceiling_us = queue_ceiling_us(objective_ms, first_step)
    return StepQueues(ceiling_us) if ceiling_us else None


def queue_ceiling_us(objective_ms: int, first_step: bool) -> int:
    """The longest a request may wait in one step's queue; 0: no objective, no ceiling."""
    share = FIRST_STEP_SHARE if first_step else LATER_STEP_SHARE
    return round(objective_ms * share * 1000)


def check_objective(objective_ms: int) -> None:
    if objective_ms < 0:
        raise ValueError(f"the latency objective must be >= 0 ms (0: none), not {objective_ms}")
