"""`tritonstack check` for ensembles: each step's model exists, the tensors agree along
the chain, every output is produced, and no step that runs beside another step of the
same request bounds its queue.

That last rule is a defect of Triton 2.51 (triton-inference-server/server#8631,
fixed in core#466 after that release): when a step that runs in parallel with
another step of the same request refuses a request at its `max_queue_size`, the
ensemble frees the request's bookkeeping too early, the request is never answered
and the steps before the split stop serving for good (reproduced in
tests/test_overload.py). A bound on a step before any split is safe: that is where
`tritonstack build` puts it.
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as pb

from tritonstack.repository_files import config_dict
from tritonstack.rules.common import Problem
from tritonstack.rules.dali import max_boxes, split_outputs


def type_name(data_type: int) -> str:
    return pb.DataType.Name(data_type).removeprefix("TYPE_")


def _dims_agree(a, b) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b))


def _check_step_inputs(
    name: str, field: str, step, model: pb.ModelConfig, known: dict, steps: list, configs: dict[str, pb.ModelConfig]
) -> list[Problem]:
    """A step's input_map: each names an input of its model and a tensor of the chain
    (an ensemble input, or some step's output) of the same type and dims."""
    problems = []
    model_inputs = {t.name: t for t in model.input}
    for model_tensor, ensemble_tensor in step.input_map.items():
        target = model_inputs.get(model_tensor)
        if target is None:
            problems.append(_not_a_tensor(name, f"{field}.input_map", model_tensor, step.model_name, model_inputs))
            continue
        source = known.get(ensemble_tensor) or _produced_later(ensemble_tensor, steps, configs)
        if source is None:
            problems.append(
                Problem(
                    name,
                    f"{field}.input_map",
                    ensemble_tensor,
                    "no ensemble input or step output has this name",
                    "map an ensemble input or another step's output to it",
                )
            )
        elif source[0] != target.data_type or not _dims_agree(source[1], list(target.dims)):
            problems.append(
                Problem(
                    name,
                    f"{field}.input_map",
                    ensemble_tensor,
                    f"is {type_name(source[0])} {source[1]} but {step.model_name} input "
                    f"{model_tensor!r} takes {type_name(target.data_type)} {list(target.dims)}",
                    "make the types and dims agree along the chain",
                )
            )
    return problems


def check_ensemble(config: pb.ModelConfig, configs: dict[str, pb.ModelConfig]) -> list[Problem]:
    """The chain of steps: models that exist, tensors that agree along it, outputs
    produced, and no queue bound where Triton 2.51 would hang."""
    name = config.name
    # ensemble tensor -> (data_type, dims) as known so far
    known = {t.name: (t.data_type, list(t.dims)) for t in config.input}
    produced: dict[str, tuple[int, list[int]]] = {}
    # ensemble tensor -> (the regions model that splits it into crops, the most rows per request)
    crops: dict[str, tuple[str, int]] = {}
    problems = []
    steps = list(config.ensemble_scheduling.step)
    for index, step in enumerate(steps):
        field = f"ensemble_scheduling.step[{index}]"
        model = configs.get(step.model_name)
        if model is None:
            problems.append(
                Problem(
                    name,
                    f"{field}.model_name",
                    step.model_name,
                    "no such model in the repository",
                    f"build it or use one of {', '.join(sorted(configs))}",
                )
            )
            continue
        problems += _check_step_batch_size(config, step, model)
        problems += _check_step_inputs(name, field, step, model, known, steps, configs)
        problems += _check_crop_batches(name, field, step, model, crops)
        crops.update(_split_crops(step, model))
        outputs, output_problems = _step_outputs(name, field, step, model)
        known.update(outputs)
        produced.update(outputs)
        problems += output_problems
    if any(step.model_name not in configs for step in steps):
        return problems  # its outputs are unknown: do not report them as unproduced too
    problems += _check_parallel_queue_bounds(config, configs)
    return problems + _check_outputs(config, produced)


def _check_step_batch_size(config: pb.ModelConfig, step, model: pb.ModelConfig) -> list[Problem]:
    if config.max_batch_size <= model.max_batch_size and (config.max_batch_size > 0) == (model.max_batch_size > 0):
        return []
    return [
        Problem(
            config.name,
            "max_batch_size",
            step.model_name,
            f"ensemble has {config.max_batch_size}, step model {model.max_batch_size}",
            "make the ensemble's max_batch_size at most every step's, both > 0 or both 0",
        )
    ]


def _step_outputs(
    name: str, field: str, step, model: pb.ModelConfig
) -> tuple[dict[str, tuple[int, list[int]]], list[Problem]]:
    """The ensemble tensors a step's output_map produces, and the entries naming no output of its model."""
    model_outputs = {t.name: t for t in model.output}
    outputs, problems = {}, []
    for model_tensor, ensemble_tensor in step.output_map.items():
        origin = model_outputs.get(model_tensor)
        if origin is None:
            problems.append(_not_a_tensor(name, f"{field}.output_map", model_tensor, step.model_name, model_outputs))
            continue
        outputs[ensemble_tensor] = (origin.data_type, list(origin.dims))
    return outputs, problems


def _check_outputs(config: pb.ModelConfig, produced: dict[str, tuple[int, list[int]]]) -> list[Problem]:
    """Every ensemble output produced by some step, with the type and dims it declares."""
    problems = []
    for output in config.output:
        source = produced.get(output.name)
        if source is None:
            problems.append(
                Problem(
                    config.name, "output", output.name, "no step's output_map produces it", "map a step output to it"
                )
            )
        elif source[0] != output.data_type or not _dims_agree(source[1], list(output.dims)):
            problems.append(
                Problem(
                    config.name,
                    "output",
                    output.name,
                    f"declared {type_name(output.data_type)} {list(output.dims)}, the step gives "
                    f"{type_name(source[0])} {source[1]}",
                    "make them agree",
                )
            )
    return problems


def _split_crops(step, model: pb.ModelConfig) -> dict[str, tuple[str, int]]:
    """The ensemble tensors a regions model's split outputs feed, with the most rows one
    request can hold: max_batch_size images of max_boxes crops."""
    as_dict = config_dict(model)
    boxes, split = max_boxes(as_dict), split_outputs(as_dict)
    if not boxes:
        return {}
    rows = max(model.max_batch_size, 1) * boxes
    return {tensor: (step.model_name, rows) for output, tensor in step.output_map.items() if output in split}


def _check_crop_batches(name: str, field: str, step, model: pb.ModelConfig, crops: dict) -> list[Problem]:
    """A request's crops reach the next step as one request: its max_batch_size must hold them."""
    problems = []
    for tensor in step.input_map.values():
        source, rows = crops.get(tensor, ("", 0))
        if rows > model.max_batch_size:
            problems.append(
                Problem(
                    name,
                    f"{field}.input_map",
                    tensor,
                    f"{source} hands on up to {rows} crops per request (max_batch_size x max_boxes), "
                    f"{step.model_name} takes at most {model.max_batch_size}",
                    f"lower {source}'s max_batch_size or max_boxes (tritonstack build --max-boxes), or raise "
                    f"{step.model_name}'s max_batch_size",
                )
            )
    return problems


def _not_a_tensor(ensemble: str, field: str, tensor: str, model: str, tensors: dict) -> Problem:
    kind = "input" if field.endswith("input_map") else "output"
    return Problem(
        ensemble, field, tensor, f"not an {kind} of {model}", f"map one of its {kind}s: {', '.join(tensors)}"
    )


def _produced_later(tensor: str, steps, configs) -> tuple[int, list[int]] | None:
    """Steps may be listed in any order: a tensor an earlier-listed step consumes
    may come from a later-listed one."""
    for step in steps:
        model = configs.get(step.model_name)
        for model_tensor, ensemble_tensor in step.output_map.items():
            if ensemble_tensor == tensor and model is not None:
                for output in model.output:
                    if output.name == model_tensor:
                        return output.data_type, list(output.dims)
    return None


def _check_parallel_queue_bounds(config: pb.ModelConfig, configs: dict[str, pb.ModelConfig]) -> list[Problem]:
    steps = list(config.ensemble_scheduling.step)
    parallel = _parallel_steps(steps)
    problems = []
    for index in sorted(parallel):
        model = configs[steps[index].model_name]
        if _queue_bound(model):
            problems.append(
                Problem(
                    config.name,
                    f"ensemble_scheduling.step[{index}]",
                    model.name,
                    f"runs beside another step of the same request, and bounds its queue (max_queue_size "
                    f"{_queue_bound(model)}): Triton 2.51 then leaves refused requests unanswered and its "
                    "ensemble stuck (server#8631)",
                    "bound the queue of the step before the split instead (tritonstack build --max-queue-size)",
                )
            )
    return problems


def _queue_bound(model: pb.ModelConfig) -> int:
    batching = model.dynamic_batching
    bounds = [batching.default_queue_policy.max_queue_size]
    bounds += [policy.max_queue_size for policy in batching.priority_queue_policy.values()]
    return max(bounds) if model.HasField("dynamic_batching") else 0


def _parallel_steps(steps: list) -> set[int]:
    """Indexes of the steps that some other step neither feeds nor is fed by, directly
    or through others: both may run at once for one request."""
    producers = {tensor: index for index, step in enumerate(steps) for tensor in step.output_map.values()}
    feeds = {
        index: {producers[t] for t in step.input_map.values() if t in producers} for index, step in enumerate(steps)
    }
    upstream = {index: _closure(index, feeds) for index in feeds}
    return {a for a in upstream for b in upstream if a != b and a not in upstream[b] and b not in upstream[a]}


def _closure(index: int, feeds: dict[int, set[int]]) -> set[int]:
    seen, todo = set(), list(feeds[index])
    while todo:
        step = todo.pop()
        if step not in seen:
            seen.add(step)
            todo.extend(feeds[step])
    return seen
