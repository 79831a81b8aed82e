"""Triton backend "dali", Python-based: serves a serialized DALI pipeline on the CPU.

It keeps the contract of the C++ DALI backend (triton-inference-server/dali_backend)
so that one model repository serves with either:
- the pipeline is `<version>/model.dali` (or `default_model_filename`);
- config inputs are matched by name to the pipeline's external sources; outputs by
  position;
- `max_batch_size` from the config overrides the serialized batch size, and
  `parameters { key: "num_threads" }` sets DALI's CPU worker threads;
- a pipeline error answers TRITONSERVER_ERROR_UNKNOWN (HTTP 400, gRPC UNKNOWN)
  and the pipeline is rebuilt for the next request.
Beyond the C++ backend: when several requests merged into one batch fail together,
each is run again alone, so only the bad request gets the error.
"""

import json
import os
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from nvidia.dali import Pipeline

DEFAULT_MODEL_FILENAME = "model.dali"


class PipelineError(Exception):
    """A DALI pipeline run failed on the data it was given."""


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        version_dir = Path(args["model_repository"]) / args["model_version"]
        filename = config.get("default_model_filename") or DEFAULT_MODEL_FILENAME
        self._serialized = (version_dir / filename).read_bytes()
        self._batch_size = max(int(config.get("max_batch_size", 0)), 1)
        self._batched = int(config.get("max_batch_size", 0)) > 0
        self._num_threads = _num_threads(config)
        self._input_names = [tensor["name"] for tensor in config["input"]]
        self._outputs = [
            (tensor["name"], pb_utils.triton_string_to_numpy(tensor["data_type"]))
            for tensor in config["output"]
        ]
        self._pipeline = self._build_pipeline()

    def _build_pipeline(self) -> Pipeline:
        # prefetch_queue_depth=1: each run() consumes exactly the batch just fed.
        pipeline = Pipeline.deserialize(
            serialized_pipeline=self._serialized,
            batch_size=self._batch_size,
            num_threads=self._num_threads,
            device_id=None,
            prefetch_queue_depth=1,
        )
        pipeline.build()
        return pipeline

    def execute(self, requests):
        try:
            return [self._respond(outputs) for outputs in self._run(requests)]
        except PipelineError as batch_error:
            if len(requests) == 1:
                return [_error_response(batch_error)]
        # Isolate the culprit: run each merged request on its own.
        return [self._execute_one(request) for request in requests]

    def _execute_one(self, request):
        try:
            return self._respond(self._run([request])[0])
        except PipelineError as error:
            return _error_response(error)

    def _respond(self, outputs):
        tensors = [
            pb_utils.Tensor(name, array.astype(dtype, copy=False))
            for (name, dtype), array in zip(self._outputs, outputs)
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _run(self, requests):
        """Run all requests as one DALI batch; return each request's outputs."""
        samples = {name: [] for name in self._input_names}
        request_sizes = []
        for request in requests:
            for name in self._input_names:
                array = pb_utils.get_input_tensor_by_name(request, name).as_numpy()
                # Each row of a batched request is one sample; rows are views.
                samples[name].extend(array if self._batched else [array])
            request_sizes.append(len(array) if self._batched else 1)
        try:
            for name, batch in samples.items():
                self._pipeline.feed_input(name, batch)
            pipeline_outputs = self._pipeline.run()
        except RuntimeError as error:
            # The failed pipeline object is no longer valid: rebuild it.
            self._pipeline = self._build_pipeline()
            raise PipelineError(_explain(error)) from error
        return _split(pipeline_outputs, request_sizes, self._batched)


def _split(pipeline_outputs, request_sizes, batched):
    outputs = [np.asarray(output.as_tensor()) for output in pipeline_outputs]
    offsets = np.cumsum([0] + request_sizes)
    per_request = []
    for start, end in zip(offsets[:-1], offsets[1:]):
        if batched:
            per_request.append([output[start:end] for output in outputs])
        else:
            per_request.append([output[start] for output in outputs])
    return per_request


def _num_threads(config) -> int:
    parameter = config.get("parameters", {}).get("num_threads", {})
    return int(parameter.get("string_value") or os.cpu_count() or 1)


def _explain(error: RuntimeError) -> str:
    """DALI's message without the lines that only concern the pipeline object."""
    noise = ("Critical error in pipeline:", "Current pipeline object is no longer valid.")
    lines = [line for line in str(error).splitlines() if line.strip() and line.strip() not in noise]
    return "DALI pipeline failed: " + " ".join(lines)


def _error_response(error: Exception):
    # UNKNOWN is what the C++ DALI backend returns: HTTP 400, gRPC UNKNOWN.
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(str(error), pb_utils.TritonError.UNKNOWN)
    )
