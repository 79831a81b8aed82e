"""The load-time rules of our backends, in one place: a model's config against its
DALI pipeline or its ONNX graph.

The `dali` and `onnxruntime` backends apply them when Triton loads a model (and
refuse the model with the problems' text); `build_pipelines.py check` applies the
same functions offline. Change a rule here and both change.

Configs are Triton's JSON form of config.pbtxt, as a backend receives it
(`data_type: "TYPE_FP32"`, `dims: [3, 224, 224]`); the checker converts its parsed
protobuf to that form (`config_dict`). Each rule returns Problems; none raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tritonstack.contract import CONFIG_FILENAME, MODEL_FILES, version_dirs
from tritonstack.dali_proto import PipelineSpec, Port


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a model: where, what, and what to do."""

    model: str
    field: str  # the config field, e.g. "input", "output.data_type", "instance_group"
    tensor: str
    message: str
    fix: str

    def __str__(self) -> str:
        where = f"{self.field} {self.tensor!r}" if self.tensor else self.field
        return f"{self.model}: {where}: {self.message}; {self.fix}"


class LoadError(ValueError):
    """A model the backend refuses to load: every problem, one per line."""

    def __init__(self, problems: list[Problem]):
        super().__init__("\n".join(str(problem) for problem in problems))
        self.problems = problems


def raise_problems(problems: list[Problem]) -> None:
    if problems:
        raise LoadError(problems)


def dims_of(tensor: dict) -> list[int]:
    # Triton's JSON gives ints; protobuf's JSON gives int64 as strings.
    return [int(d) for d in tensor.get("dims", [])]


def is_batched(config: dict) -> bool:
    return int(config.get("max_batch_size", 0)) > 0


# --- DALI: config vs pipeline --------------------------------------------------------------

def dali_problems(config: dict, spec: PipelineSpec, instance_kind: str = "KIND_CPU") -> list[Problem]:
    """Inputs are the pipeline's external sources, by name both ways; outputs map by
    position, as many as the pipeline's; types and ranks agree where the pipeline
    declares them; a CPU instance has no GPU operator."""
    model = config.get("name", "")
    problems = _dali_names(model, config, spec)
    config_inputs = {tensor["name"]: tensor for tensor in config.get("input", [])}
    pairs = [(config_inputs[port.name], port, "input", f"external source '{port.name}'")
             for port in spec.inputs if port.name in config_inputs]
    pairs += [(tensor, port, "output", f"output {index}")
              for index, (tensor, port) in enumerate(zip(config.get("output", []), spec.outputs))]
    for tensor, port, kind, source in pairs:
        problems += _dali_tensor(model, kind, tensor, port, source)
    return problems + gpu_operators_on_cpu(model, spec, instance_kind)


def _dali_names(model: str, config: dict, spec: PipelineSpec) -> list[Problem]:
    config_inputs = [tensor["name"] for tensor in config.get("input", [])]
    sources = list(spec.input_names)
    problems = [
        Problem(model, "input", name, "no external source of the pipeline has this name",
                f"rename it to one of {', '.join(sources) or 'none'}")
        for name in config_inputs if name not in sources
    ]
    problems += [
        Problem(model, "input", name, "the pipeline's external source has no config input",
                f"add an input named {name!r} (config inputs: {', '.join(config_inputs) or 'none'})")
        for name in sources if name not in config_inputs
    ]
    outputs = config.get("output", [])
    if len(outputs) != len(spec.outputs):
        problems.append(Problem(
            model, "output", ",".join(t["name"] for t in outputs),
            f"config has {len(outputs)} outputs, the pipeline has {len(spec.outputs)}",
            "declare one config output per pipeline output, in order (outputs map by position)"))
    return problems


def _dali_tensor(model: str, kind: str, tensor: dict, port: Port, source: str) -> list[Problem]:
    problems = []
    if port.dtype and tensor.get("data_type") and tensor["data_type"] != port.dtype:
        problems.append(Problem(model, f"{kind}.data_type", tensor["name"],
                                f"data type mismatch: config says {tensor['data_type']}, "
                                f"the pipeline's {source} gives {port.dtype}",
                                f"set data_type: {port.dtype}"))
    dims = dims_of(tensor)
    if port.ndim is not None and "dims" in tensor and len(dims) != port.ndim:
        problems.append(Problem(model, f"{kind}.dims", tensor["name"],
                                f"rank mismatch: config dims {dims} (rank {len(dims)}), "
                                f"the pipeline's {source} has ndim {port.ndim}",
                                f"give dims {port.ndim} values (-1 where they vary)"))
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

_MISSING_TYPES = ("", "TYPE_INVALID")
_STATED_MAX_BATCH_SIZE = re.compile(r"^\s*max_batch_size\s*:\s*(-?\d+)", re.MULTILINE)


def stated_max_batch_size(config_text: str | None) -> int | None:
    """max_batch_size as config.pbtxt states it; None when it does not (or there is
    no config.pbtxt): Triton's JSON says 0 either way (dali_model.h ReadMBSFromPBtxt)."""
    found = _STATED_MAX_BATCH_SIZE.search(config_text or "")
    return int(found.group(1)) if found else None


def dali_autocomplete(config: dict, spec: PipelineSpec, pipeline_max_batch_size: int,
                      stated_batch_size: int | None) -> tuple[dict, list[Problem]]:
    """The config as the C++ DALI backend completes it from the pipeline, and the
    problems that leave a field it cannot fill."""
    merged = {**config, "input": [dict(t) for t in config.get("input", [])],
              "output": [dict(t) for t in config.get("output", [])]}
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
    if tensor.get("data_type", "") in _MISSING_TYPES:
        if port.dtype:
            tensor["data_type"] = port.dtype
        else:
            problems.append(Problem(model, f"{kind}.data_type", tensor["name"],
                                    f"not in the config, and the pipeline's {source} declares no type",
                                    "set data_type in the config (or output_dtype in pipeline_def)"))
    if port.ndim is None:
        if not dims_of(tensor):
            problems.append(Problem(model, f"{kind}.dims", tensor["name"],
                                    f"not in the config, and the pipeline's {source} declares no rank",
                                    "set dims in the config (or output_ndim in pipeline_def)"))
    elif not dims_of(tensor):
        tensor["dims"] = [-1] * port.ndim
    elif len(dims_of(tensor)) == port.ndim:
        tensor["dims"] = dims_of(tensor)  # MatchShapes: the pipeline's dims are all -1
    return problems


def gpu_operators_on_cpu(model: str, spec: PipelineSpec, instance_kind: str) -> list[Problem]:
    """No silent CPU substitution: GPU work on a CPU instance is a load error."""
    if instance_kind.removeprefix("KIND_") != "CPU" or not spec.gpu_operators:
        return []
    operators = ", ".join(f"{op.display_name} ({op.name}, device='{op.device}')"
                          for op in spec.operators if op.device != "cpu")
    return [Problem(model, "instance_group", "", f"KIND_CPU instances cannot run GPU operators {operators}",
                    "serve it with KIND_GPU on a GPU, or build a CPU pipeline (--device cpu)")]


# --- ONNX: config vs graph -------------------------------------------------------------

@dataclass(frozen=True)
class GraphTensor:
    """An input or output of an ONNX graph: Triton's type, shape with -1 where dynamic."""

    name: str
    data_type: str
    shape: tuple[int, ...]


# Boolean `parameters` of the C++ onnxruntime backend (src/onnxruntime.cc) and the
# ONNX Runtime session option each sets: the CPU memory arena (on by default; off, a
# session's memory follows its batches down again, at a cost in throughput measured
# in docs/performance.md) and memory pattern planning.
ONNX_BOOL_PARAMETERS = {"enable_mem_arena": "enable_cpu_mem_arena", "enable_mem_pattern": "enable_mem_pattern"}
_BOOL_WORDS = {"true": True, "1": True, "false": False, "0": False}


def bool_parameter(parameters: dict, key: str) -> bool | None:
    """A boolean `parameters` entry ("true"/"false"/"1"/"0", any case) or None when
    absent; ValueError naming the parameter otherwise."""
    value = parameters.get(key, {}).get("string_value")
    if value is None:
        return None
    if value.lower() not in _BOOL_WORDS:
        raise ValueError(f"failed to convert {key} '{value}' to boolean value")
    return _BOOL_WORDS[value.lower()]


# The C++ backend passes this parameter to every run as ONNX Runtime's run option
# of the same name: after each run, the listed devices' arenas give their unused
# memory back ("cpu:0", "gpu:0" or both, ";"-separated). Memory returns to the size
# of one batch; the throughput cost is measured in docs/performance.md.
ARENA_SHRINKAGE_PARAMETER = "memory.enable_memory_arena_shrinkage"
_ARENA_DEVICE = re.compile(r"(cpu|gpu):\d+")


def arena_shrinkage_devices(parameters: dict) -> list[str]:
    """The devices whose arenas shrink after each run ([] when the parameter is
    absent); ValueError naming the parameter when it is not such a list."""
    value = parameters.get(ARENA_SHRINKAGE_PARAMETER, {}).get("string_value")
    if value is None:
        return []
    devices = value.split(";")
    if not all(_ARENA_DEVICE.fullmatch(device) for device in devices):
        raise ValueError(f"{ARENA_SHRINKAGE_PARAMETER} '{value}' is not a ';'-separated list of cpu:N or gpu:N")
    return devices


def onnx_parameter_problems(config: dict) -> list[Problem]:
    """The memory parameters readable and consistent: checked before a session is
    built from them."""
    model, parameters = config.get("name", ""), config.get("parameters", {})
    problems, switches = [], {}
    for key in ONNX_BOOL_PARAMETERS:
        try:
            switches[key] = bool_parameter(parameters, key)
        except ValueError as error:
            problems.append(Problem(model, "parameters", key, str(error), "use true or false"))
    try:
        devices = arena_shrinkage_devices(parameters)
    except ValueError as error:
        problems.append(Problem(model, "parameters", ARENA_SHRINKAGE_PARAMETER, str(error), "use cpu:0"))
        devices = []
    if switches.get("enable_mem_arena") is False and any(device.startswith("cpu:") for device in devices):
        problems.append(Problem(model, "parameters", ARENA_SHRINKAGE_PARAMETER,
                                "shrinks the CPU arena, which enable_mem_arena turns off",
                                "drop one of the two parameters"))
    return problems


def onnx_problems(config: dict, inputs: list[GraphTensor], outputs: list[GraphTensor]) -> list[Problem]:
    """Config tensors map by name to the graph's; types equal; shapes compatible
    (the config's dims after a batch axis when batching, -1 matching anything);
    boolean parameters readable."""
    model = config.get("name", "")
    problems = onnx_parameter_problems(config)
    for kind, tensors, graph in (("input", config.get("input", []), inputs),
                                 ("output", config.get("output", []), outputs)):
        by_name = {tensor.name: tensor for tensor in graph}
        for tensor in tensors:
            found = by_name.get(tensor["name"])
            if found is None:
                problems.append(Problem(model, kind, tensor["name"], "is not in the ONNX graph",
                                        f"use one of the graph's {kind}s: {', '.join(by_name)}"))
            else:
                problems += _onnx_tensor(model, kind, tensor, found, is_batched(config))
    return problems


# --- ONNX: auto-complete, as the C++ backend does ------------------------------------------
#
# triton-inference-server/onnxruntime_backend, src/onnxruntime.cc: AutoCompleteConfig,
# AutoCompleteMaxBatch, AutoCompleteIO. Unlike the DALI backend it merges lists, not
# tensors: a config listing both inputs and outputs is left as it is; an empty input
# (or output) list is filled with every graph input (output): name, type, dims
# without the batch axis. Batching: every graph input and output has a dynamic first
# axis; then a max_batch_size of 0 becomes the backend's default-max-batch-size (4)
# and a dynamic batcher is added when above 1; a graph that cannot batch refuses a
# non-zero max_batch_size. A listed tensor missing its type or dims is not completed:
# Triton refuses it ("must specify 'data_type'"); ours names the graph's value.

DEFAULT_ONNX_MAX_BATCH_SIZE = 4


def onnx_autocomplete(config: dict, inputs: list[GraphTensor], outputs: list[GraphTensor],
                      default_max_batch_size: int = DEFAULT_ONNX_MAX_BATCH_SIZE) -> tuple[dict, list[Problem]]:
    model = config.get("name", "")
    listed_inputs, listed_outputs = config.get("input", []), config.get("output", [])
    if listed_inputs and listed_outputs:
        return dict(config), _unfilled(model, config, inputs, outputs)
    merged = dict(config)
    batchable = all(tensor.shape and tensor.shape[0] == -1 for tensor in (*inputs, *outputs))
    max_batch_size = int(config.get("max_batch_size", 0))
    if batchable:
        if max_batch_size == 0:
            merged["max_batch_size"] = max_batch_size = default_max_batch_size
        if max_batch_size > 1 and not ({"dynamic_batching", "sequence_batching"} & merged.keys()):
            merged["dynamic_batching"] = {}
    elif max_batch_size != 0:
        return dict(config), [Problem(model, "max_batch_size", "", f"is {max_batch_size}, but the graph cannot batch "
                                "(not every input and output has a dynamic first axis)",
                                "set max_batch_size: 0")]
    skip = 1 if max_batch_size > 0 else 0
    for key, listed, graph in (("input", listed_inputs, inputs), ("output", listed_outputs, outputs)):
        if not listed:
            merged[key] = [_graph_io(t, skip) for t in graph]
    return merged, []


def _graph_io(tensor: GraphTensor, skip: int) -> dict:
    io = {"name": tensor.name, "data_type": tensor.data_type, "dims": list(tensor.shape[skip:])}
    if not io["dims"]:  # a scalar per sample: dims [1], reshaped to [] when batched (AutoCompleteIO)
        io["dims"] = [1]
        if skip:
            io["reshape"] = {"shape": []}
    return io


def _unfilled(model: str, config: dict, inputs: list[GraphTensor], outputs: list[GraphTensor]) -> list[Problem]:
    """What Triton would refuse in a config the backend leaves as it is."""
    problems = []
    skip = 1 if is_batched(config) else 0
    for kind, graph in (("input", inputs), ("output", outputs)):
        by_name = {tensor.name: tensor for tensor in graph}
        for tensor in config.get(kind, []):
            found = by_name.get(tensor.get("name"))
            if tensor.get("data_type", "") in _MISSING_TYPES:
                problems.append(Problem(model, f"{kind}.data_type", tensor["name"], "not in the config (the "
                                        "onnxruntime backend completes only a config that lists no "
                                        f"{kind}s)", f"set data_type: {found.data_type if found else '?'}"))
            if not dims_of(tensor):
                problems.append(Problem(model, f"{kind}.dims", tensor["name"], "not in the config (the "
                                        "onnxruntime backend completes only a config that lists no "
                                        f"{kind}s)", f"set dims: {list(found.shape[skip:]) if found else '?'}"))
    return problems


def _onnx_tensor(model: str, kind: str, tensor: dict, graph: GraphTensor, batched: bool) -> list[Problem]:
    problems = []
    if tensor.get("data_type") and tensor["data_type"] != graph.data_type:
        problems.append(Problem(model, f"{kind}.data_type", tensor["name"],
                                f"config says {tensor['data_type']}, the graph {graph.data_type}",
                                f"set data_type: {graph.data_type}"))
    if "dims" not in tensor:
        return problems
    # the model sees `reshape.shape` where the config gives one (dims are the wire shape)
    shape = dims_of({"dims": tensor["reshape"].get("shape", [])}) if "reshape" in tensor else dims_of(tensor)
    dims = ([-1] if batched else []) + shape
    compatible = len(dims) == len(graph.shape) and all(
        c == g or -1 in (c, g) for c, g in zip(dims, graph.shape))
    if not compatible:
        shown = f"[batch] + {dims[1:]}" if batched else str(dims)
        problems.append(Problem(model, f"{kind}.dims", tensor["name"],
                                f"shape mismatch: config {shown}, the graph {list(graph.shape)}",
                                "make dims the graph's shape without its batch axis"))
    return problems


# --- a repository the build has not written yet ------------------------------------------

# A fresh clone cannot be served: model.onnx files are build outputs, and git keeps
# no empty version folder (an ensemble's `1/`). The launcher and `check` both say so
# in one line, instead of a server log full of load errors.
BUILD_FIX = "run `make build` (or build_pipelines.py build): model files are build outputs"
_TOP_LEVEL_FIELD = r'^\s*{}\s*:\s*"([^"]*)"'


def unbuilt_models(repository: Path) -> list[str]:
    """The models of `repository` that cannot load for want of files: a config but
    no numeric version folder, or version folders without any file the model's
    backend reads (model.onnx, model.dali or dali.py, model.py). A model naming its
    own `default_model_filename` is left to the backend."""
    unbuilt = []
    for model_dir in sorted(Path(repository).iterdir()):
        config_path = model_dir / CONFIG_FILENAME
        if not config_path.is_file():
            continue  # not a model, or a `<name>.dali` folder: judged at load
        text = config_path.read_text(errors="replace")
        if re.search(_TOP_LEVEL_FIELD.format("default_model_filename"), text, re.MULTILINE):
            continue
        backend = re.search(_TOP_LEVEL_FIELD.format("backend"), text, re.MULTILINE)
        expected = MODEL_FILES.get(backend.group(1) if backend else "", ())
        versions = version_dirs(model_dir)
        if not versions or (expected and not any((v / f).exists() for v in versions for f in expected)):
            unbuilt.append(model_dir.name)
    return unbuilt


def unbuilt_message(repository: Path, models: list[str]) -> str:
    """One line for an unbuilt repository."""
    shown = ", ".join(models[:3]) + (f" and {len(models) - 3} more" if len(models) > 3 else "")
    return f"{repository}: not built, {shown} without model files: {BUILD_FIX}"


def unservable_reason(repository: Path) -> str | None:
    """One line saying why a local repository cannot be served yet (no such folder,
    or not built), else None: the launcher, check, the benchmark and the soak say it
    alike."""
    if not Path(repository).is_dir():
        return f"{repository}: no such folder ({BUILD_FIX})"
    unbuilt = unbuilt_models(repository)
    return unbuilt_message(repository, unbuilt) if unbuilt else None
