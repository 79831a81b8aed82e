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

# The first step's queue holds the backlog under overload (serve/priority.py runs the
# first steps last), so it gets the larger share; later steps are fed at its pace. A
# refusal at a later step comes after the first step's wait and work, and wastes that
# work: at 0.15 they were about 2 % of the refusals at 3x capacity and set their p99
# (stock gRPC clients: 599-612 ms, 4 % of the DALI step's images wasted); at 0.25 none
# wasted, refusals at p99 501-549 ms, answers at p99 742-886 ms (2-core AMD EPYC). Once
# the DALI step got cheaper (it resizes only the crop's region) 0.3 refused sooner at 3x
# (480-511 against 557-603 ms) but failed the overload soak twice, tritonserver's memory
# after the 2x periods +8.4 and +5.2 % (0.25: +0.07 %): a longer later queue holds more
# FP32 tensors in the server, whose allocator keeps the peak. docs/performance.md#overload.
FIRST_STEP_SHARE = 0.3
LATER_STEP_SHARE = 0.25
DEFAULT_OBJECTIVE_MS = 1000
# The ensemble parameter that records the objective a repository was built for.
OBJECTIVE_PARAMETER = "latency_objective_ms"
# Every step with a queue policy runs at least this many instances. A policy turns off
# Triton's payload prefetching (core#237), and its batcher then learns that a busy
# instance has finished only from a new arrival or its 500 ms tick (core's
# WaitForPayloadSlotAvailable: the finish is signalled before the instance waits for
# work again). With one instance, a backlog with no new arrivals is served one batch
# per tick: 64 requests at once took 1.1-2.8 s on 2 cores against 0.7-0.9 s with no
# policy, and the last refusals of an overload came up to 500 ms after their ceiling.
# A second instance's taking of a batch wakes the batcher for the first (0.6-0.8 s).
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
