"""A latency objective applied at load (`tritonstack serve --latency-objective-ms`),
without writing the repository: each ensemble step whose queue ceiling differs from
the objective's is loaded again through Triton's model-control API with its own config
and the new `default_queue_policy` (the load API takes a config override; the files
stay as they are), and each ensemble records the objective in its parameters.

The ceilings are the build's (tritonstack.objective): a repository built with
`tritonstack build --latency-objective-ms N` and one served with the same N here get
the same queue policies.
"""

from __future__ import annotations

from tritonstack.objective import OBJECTIVE_PARAMETER, StepQueues, step_queues
from tritonstack.serve.loaded import differs, ensemble_steps
from tritonstack.serve.priority import front_steps


def with_queues(config: dict, queues: StepQueues | None) -> dict:
    """`config` whose dynamic batcher has `queues` (None: no ceiling), its queue-length
    bound kept."""
    batching = dict(config.get("dynamic_batching", {}))
    size = int(batching.get("default_queue_policy", {}).get("max_queue_size", 0))
    ceiling_us = queues.interactive_ceiling_us if queues else 0
    batching["default_queue_policy"] = _policy(ceiling_us, size)
    if queues is not None:
        batching.update(
            priority_levels=queues.priority_levels,
            default_priority_level=queues.default_priority_level,
            priority_queue_policy={str(queues.batch_priority): _policy(queues.batch_ceiling_us, size)},
        )
    return config | {"dynamic_batching": batching}


def _policy(timeout_us: int, max_queue_size: int) -> dict:
    """A queue policy as Triton's JSON config spells it (build.model_config.QueuePolicy's)."""
    return {
        "timeout_action": "REJECT",
        "default_timeout_microseconds": timeout_us,
        "allow_timeout_override": True,
        "max_queue_size": max_queue_size,
    }


def with_objective(config: dict, objective_ms: int) -> dict:
    parameters = dict(config.get("parameters", {}))
    parameters[OBJECTIVE_PARAMETER] = {"string_value": str(objective_ms)}
    return config | {"parameters": parameters}


def overridden(configs: list[dict], objective_ms: int) -> list[dict]:
    """The configs that change under `objective_ms`: steps first (an ensemble loads
    against its steps), then the ensembles."""
    first, steps = front_steps(configs), ensemble_steps(configs)
    changed_steps, ensembles = [], []
    for config in configs:
        name = config["name"]
        if config.get("platform") == "ensemble":
            recorded = with_objective(config, objective_ms)
            ensembles += [recorded] if differs(recorded, config) else []
        elif name in steps and config.get("dynamic_batching") is not None:
            changed = with_queues(config, step_queues(objective_ms, first_step=name in first))
            if differs(changed, config):
                changed_steps.append(changed)
    return changed_steps + ensembles
