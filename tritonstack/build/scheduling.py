"""How a step of an ensemble queues, batches and takes the cores: the dynamic batcher's
settings that the latency objective and the admission bound give every step, and the
rate limiter's slots its instances hold (tritonstack.pacing)."""

from __future__ import annotations

from dataclasses import replace

from tritonstack.build.model_config import DynamicBatching, InstanceGroup, QueuePolicy
from tritonstack.build.presets import BuildOptions
from tritonstack.objective import OBJECTIVE_PARAMETER, step_queues
from tritonstack.pacing import step_slots


def step_batching(
    options: BuildOptions, preferred_batch_sizes: tuple[int, ...] = (), first_step: bool = False
) -> DynamicBatching:
    """Interactive requests wait at most their step's share of the latency objective,
    batch ones up to BATCH_CEILING_US, after them (tritonstack.objective). The first step
    may also bound its queue's length. A bound on a step that runs in parallel with
    another step of the same request would hang Triton 2.51's ensemble
    (docs/reliability.md#overload): our ensembles are chains, and the bound sits on the
    step before any split."""
    size = options.max_queue_size if first_step else 0
    queues = step_queues(options.latency_objective_ms, first_step)
    batching = DynamicBatching(
        max_queue_delay_us=options.max_queue_delay_us, preferred_batch_sizes=preferred_batch_sizes
    )
    if queues is None:
        return replace(batching, queue_policy=QueuePolicy(max_queue_size=size)) if size else batching
    return replace(
        batching,
        queue_policy=QueuePolicy(max_queue_size=size, timeout_us=queues.interactive_ceiling_us),
        priority_levels=queues.priority_levels,
        default_priority_level=queues.default_priority_level,
        level_policies=((queues.batch_priority, QueuePolicy(max_queue_size=size, timeout_us=queues.batch_ceiling_us)),),
    )


def step_instances(count: int, kind: str, first_step: bool = False, threads: int = 1) -> InstanceGroup:
    """A step's instances; on the CPU each holds its slots while it runs a batch, so
    that a first step's batch starts only on a core the classifiers leave free."""
    slots = step_slots(first_step, threads) if kind == "KIND_CPU" else 0
    return InstanceGroup(count=count, kind=kind, cpu_slots=slots)


def ensemble_parameters(options: BuildOptions) -> dict[str, str]:
    """An ensemble's record of the objective its steps' ceilings come from (none without one)."""
    return {OBJECTIVE_PARAMETER: str(options.latency_objective_ms)} if options.latency_objective_ms else {}
