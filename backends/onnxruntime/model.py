"""Triton backend "onnxruntime", Python-based: ONNX Runtime on the CPU.

It keeps the contract of the C++ backend (triton-inference-server/onnxruntime_backend):
the model is `<version>/model.onnx` (or `default_model_filename`), config tensors map
by name to the graph's inputs and outputs, `parameters` `intra_op_thread_count` and
`inter_op_thread_count` set ONNX Runtime's thread pools, and all requests of one
execute call run as one batch.
"""

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

DEFAULT_MODEL_FILENAME = "model.onnx"


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        version_dir = Path(args["model_repository"]) / args["model_version"]
        filename = config.get("default_model_filename") or DEFAULT_MODEL_FILENAME
        self._session = ort.InferenceSession(
            str(version_dir / filename),
            sess_options=_session_options(config.get("parameters", {})),
            providers=["CPUExecutionProvider"],
        )
        self._input_names = [tensor["name"] for tensor in config["input"]]
        self._output_names = [tensor["name"] for tensor in config["output"]]
        self._batched = int(config.get("max_batch_size", 0)) > 0

    def execute(self, requests):
        inputs = [self._inputs_of(request) for request in requests]
        if not self._batched or len(requests) == 1:
            return [self._respond(self._run(feed)) for feed in inputs]
        merged = {name: np.concatenate([feed[name] for feed in inputs]) for name in self._input_names}
        outputs = self._run(merged)
        offsets = np.cumsum([0] + [len(feed[self._input_names[0]]) for feed in inputs])
        return [
            self._respond([output[start:end] for output in outputs])
            for start, end in zip(offsets[:-1], offsets[1:])
        ]

    def _inputs_of(self, request):
        return {
            name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            for name in self._input_names
        }

    def _run(self, feed):
        return self._session.run(self._output_names, feed)

    def _respond(self, outputs):
        tensors = [pb_utils.Tensor(name, array) for name, array in zip(self._output_names, outputs)]
        return pb_utils.InferenceResponse(output_tensors=tensors)


def _session_options(parameters) -> ort.SessionOptions:
    options = ort.SessionOptions()
    intra = parameters.get("intra_op_thread_count", {}).get("string_value")
    inter = parameters.get("inter_op_thread_count", {}).get("string_value")
    if intra:
        options.intra_op_num_threads = int(intra)
    if inter:
        options.inter_op_num_threads = int(inter)
    return options
