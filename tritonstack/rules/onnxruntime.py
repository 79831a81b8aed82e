"""The onnxruntime backend's load-time rules: a config against its ONNX graph, the
C++ backend's parameters, and auto-complete as the C++ backend does it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tritonstack.contract import onnx_type
from tritonstack.rules.common import MISSING_TYPES, Problem, dims_of, is_batched

# --- ONNX: config vs graph -------------------------------------------------------------


@dataclass(frozen=True)
class GraphTensor:
    """An input or output of an ONNX graph: Triton's type, shape with -1 where dynamic."""

    name: str
    data_type: str
    shape: tuple[int, ...]


def graph_io(path: Path) -> tuple[list[GraphTensor], list[GraphTensor]]:
    """An ONNX file's graph inputs (initializers left out) and outputs, read without
    its weights' external data."""
    import onnx  # not in the stubs' imports: they read the graph from their session

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {tensor.name for tensor in graph.initializer}
    inputs = [_graph_tensor(value) for value in graph.input if value.name not in initializers]
    return inputs, [_graph_tensor(value) for value in graph.output]


def _graph_tensor(value_info) -> GraphTensor:
    tensor_type = value_info.type.tensor_type
    shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim)
    return GraphTensor(value_info.name, onnx_type(tensor_type.elem_type), shape)


# Boolean `parameters` of the C++ onnxruntime backend (src/onnxruntime.cc) and the
# ONNX Runtime session option each sets: the CPU memory arena (on by default; off, a
# session's memory follows its batches down again, at a cost in throughput:
# docs/performance.md) and memory pattern planning.
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
# of one batch, at a cost in throughput (docs/performance.md).
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
        problems.append(
            Problem(
                model,
                "parameters",
                ARENA_SHRINKAGE_PARAMETER,
                "shrinks the CPU arena, which enable_mem_arena turns off",
                "drop one of the two parameters",
            )
        )
    return problems


def onnx_problems(config: dict, inputs: list[GraphTensor], outputs: list[GraphTensor]) -> list[Problem]:
    """Config tensors map by name to the graph's; types equal; shapes compatible
    (the config's dims after a batch axis when batching, -1 matching anything);
    boolean parameters readable."""
    model = config.get("name", "")
    problems = onnx_parameter_problems(config)
    for kind, tensors, graph in (
        ("input", config.get("input", []), inputs),
        ("output", config.get("output", []), outputs),
    ):
        by_name = {tensor.name: tensor for tensor in graph}
        for tensor in tensors:
            found = by_name.get(tensor["name"])
            if found is None:
                problems.append(
                    Problem(
                        model,
                        kind,
                        tensor["name"],
                        "is not in the ONNX graph",
                        f"use one of the graph's {kind}s: {', '.join(by_name)}",
                    )
                )
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


def onnx_autocomplete(
    config: dict,
    inputs: list[GraphTensor],
    outputs: list[GraphTensor],
    default_max_batch_size: int = DEFAULT_ONNX_MAX_BATCH_SIZE,
) -> tuple[dict, list[Problem]]:
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
        return dict(config), [
            Problem(
                model,
                "max_batch_size",
                "",
                f"is {max_batch_size}, but the graph cannot batch "
                "(not every input and output has a dynamic first axis)",
                "set max_batch_size: 0",
            )
        ]
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
            if tensor.get("data_type", "") in MISSING_TYPES:
                problems.append(
                    Problem(
                        model,
                        f"{kind}.data_type",
                        tensor["name"],
                        f"not in the config (the onnxruntime backend completes only a config that lists no {kind}s)",
                        f"set data_type: {found.data_type if found else '?'}",
                    )
                )
            if not dims_of(tensor):
                problems.append(
                    Problem(
                        model,
                        f"{kind}.dims",
                        tensor["name"],
                        f"not in the config (the onnxruntime backend completes only a config that lists no {kind}s)",
                        f"set dims: {list(found.shape[skip:]) if found else '?'}",
                    )
                )
    return problems


def _onnx_tensor(model: str, kind: str, tensor: dict, graph: GraphTensor, batched: bool) -> list[Problem]:
    problems = []
    if tensor.get("data_type") and tensor["data_type"] != graph.data_type:
        problems.append(
            Problem(
                model,
                f"{kind}.data_type",
                tensor["name"],
                f"config says {tensor['data_type']}, the graph {graph.data_type}",
                f"set data_type: {graph.data_type}",
            )
        )
    if "dims" not in tensor:
        return problems
    # the model sees `reshape.shape` where the config gives one (dims are the wire shape)
    shape = dims_of({"dims": tensor["reshape"].get("shape", [])}) if "reshape" in tensor else dims_of(tensor)
    dims = ([-1] if batched else []) + shape
    compatible = len(dims) == len(graph.shape) and all(c == g or -1 in (c, g) for c, g in zip(dims, graph.shape))
    if not compatible:
        shown = f"[batch] + {dims[1:]}" if batched else str(dims)
        problems.append(
            Problem(
                model,
                f"{kind}.dims",
                tensor["name"],
                f"shape mismatch: config {shown}, the graph {list(graph.shape)}",
                "make dims the graph's shape without its batch axis",
            )
        )
    return problems
