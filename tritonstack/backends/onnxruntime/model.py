"""Triton backend "onnxruntime", Python-based: ONNX Runtime on the CPU.

It keeps the contract of the C++ backend (triton-inference-server/onnxruntime_backend):
- the model is `<version>/model.onnx` (or `default_model_filename`);
- config tensors map by name to the graph's inputs and outputs; a name, data type
  or shape that the graph contradicts fails the load, naming tensor and values;
- a config without inputs or without outputs is auto-completed from the graph as
  the C++ backend does (tritonstack.rules.onnxruntime.onnx_autocomplete): names, data types,
  dims; a dynamic first axis on every input and output means batching, with the
  config's `max_batch_size` or 4 (the C++ backend's default-max-batch-size) and
  `dynamic_batching`;
- `parameters` `intra_op_thread_count` and `inter_op_thread_count` size ONNX
  Runtime's thread pools; `enable_mem_arena` and `enable_mem_pattern` ("true" or
  "false") switch its CPU memory arena and memory pattern planning;
  `memory.enable_memory_arena_shrinkage` ("cpu:0") is passed to every run, as the
  C++ backend passes it: the arena gives its unused memory back after each run
  (a "gpu:N" entry is dropped: this backend has no GPU arena);
- all requests of one execute call run as one batch; a run that ONNX Runtime
  refuses answers HTTP 400 / gRPC INVALID_ARGUMENT with its message, and a merged
  batch that fails is re-run per request so only the bad request fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

from tritonstack.backends.cancellation import cancelled_response, is_cancelled
from tritonstack.backends.settings import BackendSettings
from tritonstack.backends.stub_memory import StubMemoryGauge
from tritonstack.contract import onnx_type
from tritonstack.repository_files import ONNX_MODEL_FILENAME, latest_version_dir

# The load rules shared with `tritonstack check`.
from tritonstack.rules.common import raise_problems
from tritonstack.rules.onnxruntime import (
    ARENA_SHRINKAGE_PARAMETER,
    ONNX_BOOL_PARAMETERS,
    GraphTensor,
    arena_shrinkage_devices,
    bool_parameter,
    onnx_autocomplete,
    onnx_parameter_problems,
    onnx_problems,
)


class RunError(Exception):
    """ONNX Runtime refused the data of a request."""


def model_path(version_dir: Path, config: dict) -> Path:
    path = version_dir / (config.get("default_model_filename") or ONNX_MODEL_FILENAME)
    if not path.is_file():
        raise FileNotFoundError(f"model '{config.get('name')}': no ONNX model at {path}")
    return path


def graph_tensors(nodes) -> list[GraphTensor]:
    """ONNX Runtime's view of graph inputs or outputs, with -1 for a dynamic axis."""
    return [
        GraphTensor(
            node.name,
            onnx_type(node.type),
            tuple(dim if isinstance(dim, int) and dim >= 0 else -1 for dim in node.shape),
        )
        for node in nodes
    ]


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        """Fill names, types and dims from the graph. Triton does not tell
        auto-complete where the model lives: the launcher exports the repository."""
        cfg = auto_complete_model_config
        config = cfg.as_dict()
        root = BackendSettings.of_this_process().repository
        if root is None or not (root / config["name"]).is_dir():
            return cfg
        session = _session(model_path(latest_version_dir(root / config["name"]), config), {})
        merged, problems = onnx_autocomplete(
            config, graph_tensors(session.get_inputs()), graph_tensors(session.get_outputs())
        )
        raise_problems(problems)
        config.clear()  # the dict the stub hands back to Triton (see backends/dali)
        config.update(merged)
        return cfg

    def initialize(self, args):
        config = json.loads(args["model_config"])
        version_dir = Path(args["model_repository"]) / args["model_version"]
        raise_problems(onnx_parameter_problems(config))  # before a session is built from them
        self._session = _session(model_path(version_dir, config), config.get("parameters", {}))
        self._run_options = _run_options(config.get("parameters", {}))
        raise_problems(
            onnx_problems(config, graph_tensors(self._session.get_inputs()), graph_tensors(self._session.get_outputs()))
        )
        self._input_names = [tensor["name"] for tensor in config["input"]]
        self._output_names = [tensor["name"] for tensor in config["output"]]
        self._batched = int(config.get("max_batch_size", 0)) > 0
        self._memory_gauge = StubMemoryGauge(args["model_name"], args["model_instance_name"])

    def execute(self, requests):
        responses = [cancelled_response() if is_cancelled(request) else None for request in requests]
        live = [index for index, response in enumerate(responses) if response is None]
        for index, response in zip(live, self._execute_batch([requests[index] for index in live]) if live else []):
            responses[index] = response
        self._memory_gauge.update()
        return responses

    def _execute_batch(self, requests):
        feeds = [self._inputs_of(request) for request in requests]
        if not self._batched or len(feeds) == 1:
            return [self._execute_one(feed) for feed in feeds]
        merged = {name: np.concatenate([feed[name] for feed in feeds]) for name in self._input_names}
        try:
            outputs = self._run(merged)
        except RunError:
            return [self._execute_one(feed) for feed in feeds]  # only bad requests fail
        offsets = np.cumsum([0] + [len(feed[self._input_names[0]]) for feed in feeds])
        return [
            self._respond([output[start:end] for output in outputs]) for start, end in zip(offsets[:-1], offsets[1:])
        ]

    def _execute_one(self, feed):
        try:
            return self._respond(self._run(feed))
        except RunError as error:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG))

    def _inputs_of(self, request):
        return {
            name: _as_onnx(pb_utils.get_input_tensor_by_name(request, name).as_numpy()) for name in self._input_names
        }

    def _run(self, feed):
        try:
            return self._session.run(self._output_names, feed, self._run_options)
        except (
            ort.capi.onnxruntime_pybind11_state.InvalidArgument,
            ort.capi.onnxruntime_pybind11_state.Fail,
            ort.capi.onnxruntime_pybind11_state.RuntimeException,
        ) as error:
            raise RunError(f"ONNX Runtime refused the request: {error}") from error

    def _respond(self, outputs):
        tensors = [pb_utils.Tensor(name, array) for name, array in zip(self._output_names, outputs)]
        return pb_utils.InferenceResponse(output_tensors=tensors)


def _as_onnx(array: np.ndarray) -> np.ndarray:
    """Triton hands BYTES as an object array of bytes; ONNX Runtime's strings are
    str (given bytes, it would store their repr, "b'...'"). Bytes that are not
    UTF-8 cannot be an ONNX Runtime string unchanged: invalid sequences become U+FFFD."""
    if array.dtype != np.object_:
        return array
    return np.vectorize(_utf8, otypes=[np.object_])(array)


def _utf8(value) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _session(path: Path, parameters: dict) -> ort.InferenceSession:
    return ort.InferenceSession(
        str(path), sess_options=_session_options(parameters), providers=["CPUExecutionProvider"]
    )


def _run_options(parameters) -> ort.RunOptions:
    options = ort.RunOptions()
    cpu_devices = [device for device in arena_shrinkage_devices(parameters) if device.startswith("cpu:")]
    if cpu_devices:
        options.add_run_config_entry(ARENA_SHRINKAGE_PARAMETER, ";".join(cpu_devices))
    return options


def _session_options(parameters) -> ort.SessionOptions:
    options = ort.SessionOptions()
    # ONNX Runtime's pool threads spin between runs by default. On a CPU machine
    # this backend shares the cores with DALI's threads, which the spinning starves
    # (docs/performance.md). Results are unchanged.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    intra = parameters.get("intra_op_thread_count", {}).get("string_value")
    inter = parameters.get("inter_op_thread_count", {}).get("string_value")
    if intra:
        options.intra_op_num_threads = int(intra)
    if inter:
        options.inter_op_num_threads = int(inter)
    for key, option in ONNX_BOOL_PARAMETERS.items():
        value = bool_parameter(parameters, key)  # readable: onnx_parameter_problems came first
        if value is not None:
            setattr(options, option, value)
    return options
