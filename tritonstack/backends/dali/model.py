"""Triton's entry points of the dali backend: auto-complete, load, execute (the
contract it keeps: this package's docstring)."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import nvidia.dali.backend
import triton_python_backend_utils as pb_utils

from tritonstack.backends.cancellation import cancelled_response, is_cancelled
from tritonstack.backends.dali.allocator import malloc_trim
from tritonstack.backends.dali.memory_policy import MemoryPolicy
from tritonstack.backends.dali.pipeline import PipelineError, PipelineRunner
from tritonstack.backends.dali.requests import (
    AudioInputs,
    BudgetError,
    ClipInputs,
    InputError,
    RegionInputs,
    RequestLimits,
    UndecodableError,
)
from tritonstack.backends.dali.source import load_serialized, warn_on_version_skew
from tritonstack.backends.settings import BackendSettings
from tritonstack.backends.stub_memory import StubMemoryGauge
from tritonstack.contract import (
    BOXES_INPUT_PARAMETER,
    MAX_AUDIO_SECONDS_PARAMETER,
    MAX_BOXES_PARAMETER,
    TRITON_TO_NUMPY,
)
from tritonstack.media.decode_budget import DecodeBudget, int_parameter, plan_parts
from tritonstack.repository_files import CONFIG_FILENAME, latest_version_dir
from tritonstack.rules.common import dims_of, raise_problems, stated_max_batch_size
from tritonstack.rules.dali import dali_autocomplete, dali_problems, split_flags

# The one reader of model.dali and the one set of load rules, shared with `tritonstack check`.
from tritonstack.rules.dali_proto import PipelineSpec, parse_pipeline


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        """Fill what the config leaves out from the pipeline, as the C++ backend
        does. Triton does not tell auto-complete where the model lives: the
        launcher exports the repository root."""
        cfg = auto_complete_model_config
        config = cfg.as_dict()
        root = BackendSettings.of_this_process().repository
        if root is None or not (root / config["name"]).is_dir():
            return cfg
        model_dir = root / config["name"]
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
        settings = BackendSettings.of_this_process()
        self._backend_config = settings.dali_backend_config
        load_plugins(self._backend_config.get("plugin_libs", ""))
        config = json.loads(args["model_config"])
        serialized, spec = _checked_pipeline(args, config)
        # An unbatched model runs a request's samples in one batch of up to the
        # pipeline's own batch size (the C++ backend's for max_batch_size 0).
        batch_size = int(config.get("max_batch_size", 0)) or spec.max_batch_size or 1
        on_gpu = args["model_instance_kind"] == "GPU"
        self._limits = request_limits(config, spec, settings, batch_size, on_gpu)
        # An input operator (fn.experimental.inputs.video) streams: a response per run.
        self._streamed = bool(spec.streamed_inputs)
        self._outputs = [(tensor["name"], TRITON_TO_NUMPY[tensor["data_type"]]) for tensor in config["output"]]
        self._runner = PipelineRunner(
            serialized,
            batch_size,
            int(args["model_instance_device_id"]) if on_gpu else None,
            int_parameter(config.get("parameters", {}), "num_threads"),
            self._limits.input_names,
            split_flags(spec, config),
        )
        gauge = StubMemoryGauge(args["model_name"], args["model_instance_name"])
        self._memory = MemoryPolicy(settings, config.get("parameters", {}), gauge)

    def execute(self, requests):
        if self._streamed:  # a decoupled model: each request answered through its sender
            for request in requests:
                self._stream(request)
            self._memory.account()
            return None
        responses = [None] * len(requests)
        runnable, pixels, large_run = [], [], False
        for index, request in enumerate(requests):
            if is_cancelled(request):
                responses[index] = cancelled_response()
                continue
            try:
                feed, declared = self._limits.samples_of(request)
            except (InputError, BudgetError) as error:
                responses[index] = _refusal(error)
                continue
            runnable.append((index, feed))
            pixels.append(declared)
        # No decoder run holds more declared pixels than max_batch_pixels.
        parts = plan_parts(pixels, self._limits.budget.max_batch_pixels)
        for number, part in enumerate(parts, start=1):
            fed = [runnable[i] for i in part]
            large = sum(pixels[i] for i in part) > self._limits.budget.release_above_pixels
            release = large and self._memory.buffers_return
            # Only the last run before the responses leave may lend DALI's buffers.
            lend = number == len(parts) and not release
            for (index, _), response in zip(fed, self._execute_fed(fed, lend)):
                responses[index] = response
            large_run = large_run or large
            if release:
                self._release_buffers()
        self._memory.after_batch(large_run)
        return responses

    def _stream(self, request) -> None:
        """One response per pipeline run until the request's input is consumed (the
        C++ backend's ProcessRequest loop), then the final flag; a failure ends the
        stream with an error response."""
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if is_cancelled(request):
            sender.send(cancelled_response(), flags=final)
            return
        try:
            feed, _ = self._limits.samples_of(request)
            clips = len(next(iter(feed.values())))
            if clips != 1:
                raise InputError(
                    f"the pipeline's input operator (fn.experimental.inputs.video) takes one clip "
                    f"per request, got {clips}: send each clip in a request of its own"
                )
            for outputs in self._runner.stream(feed):
                sender.send(self._respond(outputs))
        except (InputError, BudgetError) as error:
            sender.send(_refusal(error), flags=final)
        except PipelineError as error:
            sender.send(_error_response(error), flags=final)
        else:
            sender.send(flags=final)

    def finalize(self):
        """--backend-config=dali,release_after_unload=true (dali_backend's config.md): DALI's
        pools go back when the model unloads. The stub exits after this anyway."""
        if self._backend_config.get("release_after_unload", "").lower() in ("true", "1"):
            self._runner = None
            _return_freed_memory()

    def _release_buffers(self) -> None:
        """Return the buffers a run of large images grew: a new pipeline (the old
        one's buffers are freed), DALI's unused pools, glibc's free heap."""
        self._runner.rebuild(while_down=_return_freed_memory)

    def _execute_fed(self, runnable, lend: bool = False):
        feeds = [feed for _, feed in runnable]
        try:
            return [self._respond(outputs) for outputs in self._runner.run(feeds, borrow=lend)]
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


def _checked_pipeline(args, config: dict) -> tuple[bytes, PipelineSpec]:
    """The instance's serialized pipeline and what it declares, checked against the config."""
    version_dir = Path(args["model_repository"]) / args["model_version"]
    serialized = load_serialized(version_dir, config, cpu_only=args["model_instance_kind"] == "CPU")
    spec = parse_pipeline(serialized)
    raise_problems(dali_problems(config, spec, args["model_instance_kind"]))
    warn_on_version_skew(version_dir)
    return serialized, spec


def request_limits(
    config: dict, spec: PipelineSpec, settings: BackendSettings, batch_size: int, on_gpu: bool
) -> RequestLimits:
    """What a request to this instance may hold: sizes, the decode budget, clips and boxes."""
    parameters = config.get("parameters", {})
    budget = DecodeBudget.from_parameters(parameters, settings.stub_memory_bytes)
    raise_budget_problems(budget)
    input_names = [port.name for port in spec.inputs]
    decoded_inputs = [name for name in input_names if name in spec.decoded_inputs]
    streamed = bool(spec.streamed_inputs)
    # A streamed clip's runs decode at most batch_size sequences of it at once.
    frames = spec.clip_frames * batch_size if streamed and spec.clip_frames else spec.clip_frames
    video_inputs = [name for name in input_names if name in spec.video_inputs]
    return RequestLimits(
        input_names=input_names,
        decoded_inputs=decoded_inputs,
        # A TYPE_STRING input's size is its data's, not its shape's: bounded after it is read.
        itemsizes={
            tensor["name"]: np.dtype(TRITON_TO_NUMPY.get(tensor["data_type"], np.uint8)).itemsize
            for tensor in config["input"]
        },
        max_input_bytes=int_parameter(parameters, "max_input_bytes") or settings.max_input_bytes,
        budget=budget,
        batch_size=batch_size,
        clips=ClipInputs(video_inputs, on_gpu, frames, streamed=streamed) if video_inputs else None,
        regions=_region_inputs(config, decoded_inputs),
        audio=_audio_inputs(parameters, input_names, spec),
    )


def _audio_inputs(parameters: dict, input_names: list[str], spec: PipelineSpec) -> AudioInputs | None:
    names = [name for name in input_names if name in spec.audio_inputs]
    return AudioInputs(names, int_parameter(parameters, MAX_AUDIO_SECONDS_PARAMETER)) if names else None


def _region_inputs(config: dict, decoded_inputs: list[str]) -> RegionInputs | None:
    """A regions model's (parameters boxes_input and max_boxes, our extension of the
    contract: the C++ backend ignores them): its boxes are checked per request."""
    parameters = config.get("parameters", {})
    boxes = parameters.get(BOXES_INPUT_PARAMETER, {}).get("string_value")
    if not boxes:
        return None
    if len(decoded_inputs) != 1 or not int_parameter(parameters, MAX_BOXES_PARAMETER):
        raise ValueError(
            f"parameter {BOXES_INPUT_PARAMETER} needs one image input that feeds a decoder (found "
            f"{decoded_inputs or 'none'}) and a positive {MAX_BOXES_PARAMETER}"
        )
    height, width = dims_of(config["output"][0])[-2:]
    return RegionInputs(boxes, decoded_inputs[0], int_parameter(parameters, MAX_BOXES_PARAMETER), height * width)


def load_plugins(plugin_libs: str) -> None:
    """--backend-config=dali,plugin_libs=a.so:b.so: DALI plugin libraries loaded before
    the pipeline is built; a failure is logged, not fatal (src/dali_backend.cc
    TRITONBACKEND_Initialize, src/parameters.h GetPluginNames)."""
    import nvidia.dali.plugin_manager as plugin_manager

    for path in filter(None, plugin_libs.split(":")):
        try:
            plugin_manager.load_library(path)
        except Exception as error:  # DALI raises RuntimeError; anything else is as fatal to the load
            pb_utils.Logger.log_error(f"Failed to load plugin libs: {path}: {error}")


def _return_freed_memory() -> None:
    gc.collect()
    nvidia.dali.backend.ReleaseUnusedMemory()
    malloc_trim()


def raise_budget_problems(budget: DecodeBudget) -> None:
    problems = budget.problems()
    if problems:
        raise ValueError("decode budget: " + "; ".join(problems))


def _refusal(error: InputError | BudgetError):
    """A request refused before the pipeline ran: an undecodable input has the status
    the decoder's own failure has (as in the C++ backend), anything else is INVALID_ARG."""
    if isinstance(error, UndecodableError):
        return _error_response(error)
    return _error_response(error, pb_utils.TritonError.INVALID_ARG)


def _error_response(error: Exception, code=None):
    # UNKNOWN is what the C++ DALI backend returns: HTTP 400, gRPC UNKNOWN.
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(str(error), code if code is not None else pb_utils.TritonError.UNKNOWN)
    )
