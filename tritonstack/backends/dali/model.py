"""Triton's entry points of the dali backend: auto-complete, load, execute (the
contract it keeps: this package's docstring)."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import numpy as np
import nvidia.dali.backend
import triton_python_backend_utils as pb_utils

from tritonstack.backends.dali.allocator import malloc_trim, pool_threshold_bytes
from tritonstack.backends.dali.requests import BudgetError, ClipInputs, InputError, UndecodableError, samples_of
from tritonstack.backends.dali.runner import PipelineError, PipelineRunner
from tritonstack.backends.dali.source import load_serialized, warn_on_version_skew
from tritonstack.backends.stub_memory import StubMemoryGauge
from tritonstack.contract import (
    CONFIG_FILENAME,
    DALI_HOST_POOL_ENV,
    DEFAULT_MALLOC_TRIM_EVERY,
    DEFAULT_MAX_INPUT_BYTES,
    MALLOC_TRIM_ENV,
    MAX_INPUT_BYTES_ENV,
    MEMORY_TRACE_ENV,
    REPOSITORY_ENV,
    TRITON_TO_NUMPY,
    latest_version_dir,
)

# The one reader of model.dali and the one set of load rules, shared with `tritonstack check`.
from tritonstack.dali_proto import parse_pipeline
from tritonstack.decode_budget import DecodeBudget, plan_parts
from tritonstack.rules.common import raise_problems, stated_max_batch_size
from tritonstack.rules.dali import dali_autocomplete, dali_problems, split_flags


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        """Fill what the config leaves out from the pipeline, as the C++ backend
        does. Triton does not tell auto-complete where the model lives: the
        launcher exports the repository root."""
        cfg = auto_complete_model_config
        config = cfg.as_dict()
        root = os.environ.get(REPOSITORY_ENV)
        model_dir = Path(root or "") / config["name"]
        if not root or not model_dir.is_dir():
            return cfg
        serialized = load_serialized(latest_version_dir(model_dir), config)
        config_path = model_dir / CONFIG_FILENAME
        stated = stated_max_batch_size(config_path.read_text() if config_path.is_file() else None)
        spec = parse_pipeline(serialized)
        merged, problems = dali_autocomplete(config, spec, spec.max_batch_size or 1, stated)
        raise_problems(problems)
        # pb_utils' add_input/add_output refuse allow_ragged_batch, but the dict that
        # as_dict() returns is the one the stub hands back to Triton, which accepts
        # every ModelConfig field from it (tests/test_foreign_repositories.py).
        config.clear()
        config.update(merged)
        return cfg

    def initialize(self, args):
        config = json.loads(args["model_config"])
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self._serialized = load_serialized(version_dir, config, cpu_only=args["model_instance_kind"] == "CPU")
        spec = parse_pipeline(self._serialized)
        raise_problems(dali_problems(config, spec, args["model_instance_kind"]))
        warn_on_version_skew(version_dir)
        parameters = config.get("parameters", {})
        device_id = int(args["model_instance_device_id"]) if args["model_instance_kind"] == "GPU" else None
        self._batched = int(config.get("max_batch_size", 0)) > 0
        batch_size = max(int(config.get("max_batch_size", 0)), 1)
        self._budget = DecodeBudget.from_parameters(parameters)
        raise_budget_problems(self._budget)
        self._max_input_bytes = (_int_parameter(parameters, "max_input_bytes")
                                 or int(os.environ.get(MAX_INPUT_BYTES_ENV) or DEFAULT_MAX_INPUT_BYTES))
        self._itemsizes = {tensor["name"]: np.dtype(TRITON_TO_NUMPY[tensor["data_type"]]).itemsize
                           for tensor in config["input"]}
        self._input_names = [port.name for port in spec.inputs]
        self._decoded_inputs = [name for name in self._input_names if name in spec.decoded_inputs]
        video_inputs = [name for name in self._input_names if name in spec.video_inputs]
        self._clips = ClipInputs(video_inputs, device_id is not None, spec.clip_frames) if video_inputs else None
        self._outputs = [
            (tensor["name"], TRITON_TO_NUMPY[tensor["data_type"]])
            for tensor in config["output"]
        ]
        self._runner = PipelineRunner(self._serialized, batch_size, device_id, _int_parameter(parameters, "num_threads"),
                                      self._input_names, self._batched, split_flags(spec, config))
        # With DALI's host pool on, a rebuilt pipeline's buffers go back to the pool,
        # not to the system: releasing after large runs would only cost a rebuild.
        self._buffers_return = pool_threshold_bytes(os.environ[DALI_HOST_POOL_ENV]) == 0
        self._memory_trace = None
        if os.environ.get(MEMORY_TRACE_ENV):  # the memory probe's switch: tracing slows every allocation
            from tritonstack.backends.dali.memory_trace import MemoryTrace

            self._memory_trace = MemoryTrace(os.environ[MEMORY_TRACE_ENV])
        self._trim_every = int(os.environ.get(MALLOC_TRIM_ENV) or DEFAULT_MALLOC_TRIM_EVERY)
        self._batches = 0
        self._memory_gauge = StubMemoryGauge(args["model_name"], args["model_instance_name"])

    def execute(self, requests):
        responses = [None] * len(requests)
        runnable, pixels = [], []
        for index, request in enumerate(requests):
            try:
                feed, declared = samples_of(request, self._input_names, self._decoded_inputs, self._itemsizes,
                                            self._max_input_bytes, self._batched, self._budget, self._clips)
            except UndecodableError as error:
                # The status the decoder's own failure has (as in the C++ backend).
                responses[index] = _error_response(error)
                continue
            except (InputError, BudgetError) as error:
                responses[index] = _error_response(error, pb_utils.TritonError.INVALID_ARG)
                continue
            runnable.append((index, feed))
            pixels.append(declared)
        # No decoder run holds more declared pixels than max_batch_pixels.
        for part in plan_parts(pixels, self._budget.max_batch_pixels):
            fed = [runnable[i] for i in part]
            for (index, _), response in zip(fed, self._execute_fed(fed)):
                responses[index] = response
            if self._buffers_return and sum(pixels[i] for i in part) > self._budget.release_above_pixels:
                self._release_buffers()
        self._batches += 1
        if self._trim_every and self._batches % self._trim_every == 0:
            # Pages freed inside glibc's heaps (DALI's image buffers of varied sizes)
            # go back to the system now, not when they happen to reach a heap's top.
            malloc_trim()
        if self._memory_trace is not None:
            self._memory_trace.after_batch()
        self._memory_gauge.update()
        return responses

    def _release_buffers(self) -> None:
        """Return the buffers a run of large images grew: a new pipeline (the old
        one's buffers are freed), DALI's unused pools, glibc's free heap."""
        self._runner.rebuild(while_down=_return_freed_memory)

    def _execute_fed(self, runnable):
        feeds = [feed for _, feed in runnable]
        try:
            return [self._respond(outputs) for outputs in self._runner.run(feeds)]
        except PipelineError as batch_error:
            if len(feeds) == 1:
                return [_error_response(batch_error)]
        # Isolate the culprit: run each merged request on its own.
        return [self._execute_one(feed) for feed in feeds]

    def _execute_one(self, feed):
        try:
            return self._respond(self._runner.run([feed])[0])
        except PipelineError as error:
            return _error_response(error)

    def _respond(self, outputs):
        tensors = [
            pb_utils.Tensor(name, array.astype(dtype, copy=False))
            for (name, dtype), array in zip(self._outputs, outputs)
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)


def _return_freed_memory() -> None:
    gc.collect()
    nvidia.dali.backend.ReleaseUnusedMemory()
    malloc_trim()


def raise_budget_problems(budget: DecodeBudget) -> None:
    problems = budget.problems()
    if problems:
        raise ValueError("decode budget: " + "; ".join(problems))


def _int_parameter(parameters: dict, key: str) -> int | None:
    value = parameters.get(key, {}).get("string_value")
    return int(value) if value else None


def _error_response(error: Exception, code=None):
    # UNKNOWN is what the C++ DALI backend returns: HTTP 400, gRPC UNKNOWN.
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(str(error), code if code is not None else pb_utils.TritonError.UNKNOWN)
    )
