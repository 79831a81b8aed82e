"""The dali backend's load-time rules: a config against its DALI pipeline, and
auto-complete as the C++ backend merges (dali_backend src/config_tools/config_tools.cc)."""

from __future__ import annotations

from dataclasses import replace

from tritonstack.contract import BOX_WIDTH, BOXES_INPUT_PARAMETER, MAX_BOXES_PARAMETER
from tritonstack.rules.common import MISSING_TYPES, Problem, dims_of, is_batched
from tritonstack.rules.dali_proto import PipelineSpec, Port

# --- DALI: outputs split along their outer axis ----------------------------------------------
#
# parameters { key: "split_along_outer_axis" value { string_value: "OUT_A:OUT_B" } }
# (dali_backend's config.md, src/parameters.h GetOutputsToSplit): each sample of
# such an output, of shape (n, d1..dD), leaves the model as n samples of (d1..dD);
# a request's samples are concatenated. Its config dims lose the outer axis
# (src/dali_model.h ReadPipelineProperties erases it from the declared shape).
SPLIT_PARAMETER = "split_along_outer_axis"
# Triton's words before a TRITONSERVER_ERROR_INVALID_ARG message, as a C++ backend's
# load failure reaches the client (the texts below follow src/config_tools/config_tools.cc).
CPP_INVALID_ARG = "Invalid argument: "


def split_outputs(config: dict) -> frozenset[str]:
    """The output names the config's split_along_outer_axis lists."""
    value = config.get("parameters", {}).get(SPLIT_PARAMETER, {}).get("string_value", "")
    return frozenset(name for name in value.split(":") if name)


def split_flags(spec: PipelineSpec, config: dict) -> tuple[bool, ...]:
    """Per pipeline output: is it split? The parameter names an output by the
    pipeline's name or by the config's name at its position (the C++ backend reads
    the one at load, the other when it answers)."""
    names = split_outputs(config)
    config_names = [tensor.get("name") for tensor in config.get("output", [])]
    return tuple(
        port.name in names or (index < len(config_names) and config_names[index] in names)
        for index, port in enumerate(spec.outputs)
    )


def as_served(spec: PipelineSpec, config: dict, batched: bool | None = None) -> PipelineSpec:
    """The pipeline as the model serves it: a split output's declared rank is one
    less; an unbatched model's tensors have the samples' axis first, one rank more
    (src/config_tools/config_tools.cc add_batch_dim: a request's first dimension is
    its samples whether or not Triton batches the model)."""
    flags = split_flags(spec, config)
    extra = 0 if (is_batched(config) if batched is None else batched) else 1

    def served(port: Port, split: bool = False) -> Port:
        if port.ndim is None:
            return port
        return replace(port, ndim=port.ndim - (1 if split and port.ndim else 0) + extra)

    return replace(
        spec,
        inputs=tuple(served(port) for port in spec.inputs),
        outputs=tuple(served(port, split) for port, split in zip(spec.outputs, flags)),
    )


# --- DALI: config vs pipeline --------------------------------------------------------------


def dali_problems(config: dict, spec: PipelineSpec, instance_kind: str = "KIND_CPU") -> list[Problem]:
    """Inputs are the pipeline's external sources, by name both ways; outputs map by
    position, as many as the pipeline's; types and ranks agree where the pipeline
    declares them; a CPU instance has no GPU operator."""
    spec = as_served(spec, config)
    model = config.get("name", "")
    problems = _dali_names(model, config, spec)
    config_inputs = {tensor["name"]: tensor for tensor in config.get("input", [])}
    pairs = [
        (config_inputs[port.name], port, "input", f"external source '{port.name}'")
        for port in spec.inputs
        if port.name in config_inputs
    ]
    pairs += [
        (tensor, port, "output", f"output {index}")
        for index, (tensor, port) in enumerate(zip(config.get("output", []), spec.outputs))
    ]
    for tensor, port, kind, source in pairs:
        problems += _dali_tensor(model, kind, tensor, port, source)
    problems += _streamed_inputs(model, config, spec) + _regions(model, config)
    return problems + gpu_operators_on_cpu(model, spec, instance_kind)


def max_boxes(config: dict) -> int | None:
    """A regions model's most boxes per image (our parameter), None for any other model."""
    value = config.get("parameters", {}).get(MAX_BOXES_PARAMETER, {}).get("string_value")
    return int(value) if value and value.lstrip("-").isdigit() else None


def _regions(model: str, config: dict) -> list[Problem]:
    """A regions model's parameters (tritonstack.contract): the boxes input is a config
    input of FP32 [-1, 4], max_boxes a positive integer, the crops' output split."""
    parameters = config.get("parameters", {})
    boxes = parameters.get(BOXES_INPUT_PARAMETER, {}).get("string_value")
    if not boxes:
        return []
    problems = []
    tensor = next((t for t in config.get("input", []) if t.get("name") == boxes), None)
    if tensor is None or tensor.get("data_type") != "TYPE_FP32" or dims_of(tensor)[-1:] != [BOX_WIDTH]:
        problems.append(
            Problem(
                model,
                f"parameters.{BOXES_INPUT_PARAMETER}",
                boxes,
                "names no config input of TYPE_FP32 with dims [-1, 4]",
                "name the input that carries the boxes, TYPE_FP32, dims [-1, 4]",
            )
        )
    if not max_boxes(config) or max_boxes(config) < 1:
        problems.append(
            Problem(
                model,
                f"parameters.{MAX_BOXES_PARAMETER}",
                "",
                f"is {parameters.get(MAX_BOXES_PARAMETER, {}).get('string_value')!r}",
                "give the pipeline's slot count, a positive integer",
            )
        )
    if not split_outputs(config):
        problems.append(
            Problem(
                model,
                f"parameters.{SPLIT_PARAMETER}",
                "",
                "is missing: a regions model's crops must leave as samples of their own",
                f"list its output in {SPLIT_PARAMETER}",
            )
        )
    return problems


def is_decoupled(config: dict) -> bool:
    return bool(config.get("model_transaction_policy", {}).get("decoupled"))


def _streamed_inputs(model: str, config: dict, spec: PipelineSpec) -> list[Problem]:
    """An input operator (fn.experimental.inputs.video) answers a request with one
    response per pipeline run until its input is consumed: only a decoupled model
    may (the C++ backend: src/dali_model_instance.cc ProcessRequest)."""
    if not spec.streamed_inputs or is_decoupled(config):
        return []
    names = ", ".join(sorted(spec.streamed_inputs))
    return [
        Problem(
            model,
            "model_transaction_policy",
            names,
            "the pipeline's input operator (fn.experimental.inputs.video) answers a request with a "
            "response per run until the input is consumed, which only a decoupled model may",
            "set model_transaction_policy { decoupled: true }",
        )
    ]


def _dali_names(model: str, config: dict, spec: PipelineSpec) -> list[Problem]:
    config_inputs = [tensor["name"] for tensor in config.get("input", [])]
    sources = list(spec.input_names)
    # The C++ texts: src/config_tools/config_tools.cc ValidateAgainstTooManyInputs, ValidateInputs.
    problems = [
        Problem(
            model,
            "input",
            name,
            "no external source of the pipeline has this name",
            f"rename it to one of {', '.join(sources) or 'none'}",
            f"{CPP_INVALID_ARG}Configuration file contains config for {name} but such input is not "
            "present in the pipeline.",
        )
        for name in config_inputs
        if name not in sources
    ]
    problems += [
        Problem(
            model,
            "input",
            name,
            "the pipeline's external source has no config input",
            f"add an input named {name!r} (config inputs: {', '.join(config_inputs) or 'none'})",
            f'{CPP_INVALID_ARG}Missing config for "{name}" input.',
        )
        for name in sources
        if name not in config_inputs
    ]
    outputs = config.get("output", [])
    if len(outputs) != len(spec.outputs):
        problems.append(
            Problem(
                model,
                "output",
                ",".join(t["name"] for t in outputs),
                f"config has {len(outputs)} outputs, the pipeline has {len(spec.outputs)}",
                "declare one config output per pipeline output, in order (outputs map by position)",
                f"{CPP_INVALID_ARG}The number of outputs specified in the DALI pipeline and the configuration file "
                f"do not match.\nModel config outputs: {len(outputs)}\nPipeline outputs: {len(spec.outputs)}",
            )
        )
    return problems


def _dali_tensor(model: str, kind: str, tensor: dict, port: Port, source: str) -> list[Problem]:
    problems = []
    if port.dtype and tensor.get("data_type") and tensor["data_type"] != port.dtype:
        problems.append(
            Problem(
                model,
                f"{kind}.data_type",
                tensor["name"],
                f"data type mismatch: config says {tensor['data_type']}, the pipeline's {source} gives {port.dtype}",
                f"set data_type: {port.dtype}",
                f'{CPP_INVALID_ARG}Mismatch of data_type config for "{tensor["name"]}".\n'
                f"Data type defined in config: {tensor['data_type']}\n"
                f"Data type defined in pipeline: {port.dtype}",
            )
        )
    dims = dims_of(tensor)
    if port.ndim is not None and "dims" in tensor and len(dims) != port.ndim:
        problems.append(
            Problem(
                model,
                f"{kind}.dims",
                tensor["name"],
                f"rank mismatch: config dims {dims} (rank {len(dims)}), the pipeline's {source} has ndim {port.ndim}",
                f"give dims {port.ndim} values (-1 where they vary)",
                f'{CPP_INVALID_ARG}Mismatch in number of dimensions for "{tensor["name"]}"\n'
                f"Number of dimensions defined in config: {len(dims)}\n"
                f"Number of dimensions defined in pipeline: {port.ndim}",
            )
        )
    return problems


# --- DALI: auto-complete, as the C++ backend merges ------------------------------------------
#
# triton-inference-server/dali_backend, src/config_tools/config_tools.cc
# (AutofillConfig, AutofillInputsConfig, AutofillOutputsConfig, AutofillIOConfig,
# MatchShapes) and src/dali_model.h (ReadMBSFromPBtxt, Batched); checked by its
# qa/L0_autoconfig (full_autoconfig: only `backend`; partial_autoconfig: some fields;
# no_config_file.dali: no config.pbtxt at all):
# - every pipeline input gets a config input (found by name, else appended): name,
#   data_type from the external source's dtype, dims [-1]*ndim, whatever the config
#   left out; what it states is kept (and checked at load, dali_problems);
# - an input the config did not list gets allow_ragged_batch: true (Triton's JSON
#   always carries the field for a listed one, false unless stated, so the C++
#   backend's "if absent" adds it only to appended inputs);
# - config outputs map by position: each is filled from the pipeline output at its
#   index (its name kept if stated), and missing ones are appended with the
#   pipeline's names;
# - dims the config states merge with the pipeline's: -1 takes the other's value;
# - max_batch_size: a config.pbtxt that states `max_batch_size: 0` is unbatched;
#   otherwise a missing or zero value becomes the pipeline's batch size.
# Where the pipeline does not declare a type or rank (output_dtype/output_ndim in
# pipeline_def), the C++ backend fills TYPE_INVALID and Triton refuses the model with a
# generic message; ours refuses it naming the tensor and what to declare.


def dali_autocomplete(
    config: dict, spec: PipelineSpec, pipeline_max_batch_size: int, stated_batch_size: int | None
) -> tuple[dict, list[Problem]]:
    """The config as the C++ DALI backend completes it from the pipeline, and the
    problems that leave a field it cannot fill."""
    spec = as_served(spec, config, batched=stated_batch_size != 0)
    merged = {
        **config,
        "input": [dict(t) for t in config.get("input", [])],
        "output": [dict(t) for t in config.get("output", [])],
    }
    model = config.get("name", "")
    problems = []
    listed = {tensor.get("name"): tensor for tensor in merged["input"]}
    for port in sorted(spec.inputs, key=lambda port: port.name):
        tensor = listed.get(port.name)
        if tensor is None:
            tensor = {"name": port.name, "allow_ragged_batch": True}
            merged["input"].append(tensor)
        problems += _fill_tensor(model, "input", tensor, port, f"external source '{port.name}'")
    for index, port in enumerate(spec.outputs):
        if index == len(merged["output"]):
            merged["output"].append({"name": port.name})
        problems += _fill_tensor(model, "output", merged["output"][index], port, f"output {index}")
    problems += _dali_names(model, merged, spec)  # inputs or outputs the pipeline lacks
    kinds = {group.get("kind", "KIND_AUTO") for group in merged.get("instance_group", [])}
    problems = [*gpu_operators_on_cpu(model, spec, "KIND_CPU" if "KIND_CPU" in kinds else ""), *problems]
    if stated_batch_size != 0 and int(merged.get("max_batch_size", 0)) <= 0:
        merged["max_batch_size"] = pipeline_max_batch_size
    if is_batched(merged) and not ({"dynamic_batching", "sequence_batching"} & merged.keys()):
        merged["dynamic_batching"] = {}
    return merged, problems


def _fill_tensor(model: str, kind: str, tensor: dict, port: Port, source: str) -> list[Problem]:
    problems = []
    if tensor.get("data_type", "") in MISSING_TYPES:
        if port.dtype:
            tensor["data_type"] = port.dtype
        else:
            problems.append(
                Problem(
                    model,
                    f"{kind}.data_type",
                    tensor["name"],
                    f"not in the config, and the pipeline's {source} declares no type",
                    "set data_type in the config (or output_dtype in pipeline_def)",
                    f'{CPP_INVALID_ARG}Missing data_type config for "{tensor["name"]}"',
                )
            )
    if port.ndim is None:
        if not dims_of(tensor):
            problems.append(
                Problem(
                    model,
                    f"{kind}.dims",
                    tensor["name"],
                    f"not in the config, and the pipeline's {source} declares no rank",
                    "set dims in the config (or output_ndim in pipeline_def)",
                )
            )
    elif not dims_of(tensor):
        tensor["dims"] = [-1] * port.ndim
    elif len(dims_of(tensor)) == port.ndim:
        tensor["dims"] = dims_of(tensor)  # MatchShapes: the pipeline's dims are all -1
    return problems


def gpu_operators_on_cpu(model: str, spec: PipelineSpec, instance_kind: str) -> list[Problem]:
    """No silent CPU substitution: GPU work on a CPU instance is a load error."""
    if instance_kind.removeprefix("KIND_") != "CPU" or not spec.gpu_operators:
        return []
    operators = ", ".join(
        f"{op.display_name} ({op.name}, device='{op.device}')" for op in spec.operators if op.device != "cpu"
    )
    return [
        Problem(
            model,
            "instance_group",
            "",
            f"KIND_CPU instances cannot run GPU operators {operators}",
            "serve it with KIND_GPU on a GPU, or build a CPU pipeline (--device cpu)",
        )
    ]
