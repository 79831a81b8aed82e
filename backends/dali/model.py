"""Triton backend "dali", Python-based: serves a DALI pipeline on the CPU.

It keeps the contract of the C++ DALI backend (triton-inference-server/dali_backend)
so that one model repository serves with either:
- the pipeline is `<version>/model.dali` (or `default_model_filename`), else
  `<version>/dali.py` whose single `@autoserialize` pipeline is serialized at load;
- config inputs match the pipeline's external sources by name (checked both ways),
  outputs match by position; a data type, rank or count mismatch fails the load
  with a message naming the tensor, the config value and the pipeline value;
- a partial config, or none at all (a `<name>.dali` folder), is auto-completed
  from the pipeline as the C++ backend merges it (tritonstack.rules.dali_autocomplete:
  names, types, dims, allow_ragged_batch, max_batch_size, dynamic_batching);
- a dali.py written for a GPU machine (`device_id=0`) with only CPU operators is
  serialized with `device_id=None` for KIND_CPU instances, as it runs on them in
  the NGC container;
- `max_batch_size` from the config overrides the serialized batch size, and
  `parameters { key: "num_threads" }` overrides the serialized thread count;
- a pipeline error answers TRITONSERVER_ERROR_UNKNOWN (HTTP 400, gRPC UNKNOWN)
  naming the failing operator, and the pipeline is rebuilt for the next request;
- GPU or mixed operators on a KIND_CPU instance fail the load.
Beyond the C++ backend: when several requests merged into one batch fail together,
each is run again alone, so only the bad request gets the error; and encoded images
that declare more than `max_pixels` pixels are refused from their header, before
the decoder allocates anything (a decompression bomb); and an input tensor larger
than `max_input_bytes` (parameter, else $TRITONSTACK_MAX_INPUT_BYTES from the
launcher, else 64 MiB) is refused before its data is read.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import nvidia.dali
import triton_python_backend_utils as pb_utils
from nvidia.dali import Pipeline
from PIL import Image, UnidentifiedImageError

from tritonstack.contract import (
    CONFIG_FILENAME,
    DALI_MODEL_FILENAME,
    DALI_SCRIPT_FILENAME,
    DALI_VERSION_FILENAME,
    DEFAULT_MAX_INPUT_BYTES,
    MAX_INPUT_BYTES_ENV,
    REPOSITORY_ENV,
    TRITON_TO_NUMPY,
    latest_version_dir,
)
# The one reader of model.dali and the one set of load rules, shared with
# build_pipelines.py check.
from tritonstack.dali_proto import parse_pipeline
from tritonstack.rules import dali_autocomplete, dali_problems, raise_problems, stated_max_batch_size

# Pillow's own bomb threshold is 89.5 MP; 100 MP covers a 10000x10000 photo.
DEFAULT_MAX_PIXELS = 100_000_000

Image.MAX_IMAGE_PIXELS = None  # our own limit applies, per model


class PipelineError(Exception):
    """A DALI pipeline run failed on the data it was given."""


class InputError(Exception):
    """A request's data was refused before it reached the pipeline."""


# --- where the pipeline comes from ------------------------------------------------

def load_serialized(version_dir: Path, config: dict, cpu_only: bool = True) -> bytes:
    """model.dali (or default_model_filename), else dali.py's @autoserialize
    pipeline, serialized now by the serving DALI (with device_id=None when it will
    run on CPU instances only)."""
    filename = config.get("default_model_filename") or DALI_MODEL_FILENAME
    serialized_path = version_dir / filename
    script_path = version_dir / DALI_SCRIPT_FILENAME
    if serialized_path.is_file():
        return serialized_path.read_bytes()
    if script_path.is_file():
        return _autoserialize(script_path, cpu_only)
    raise FileNotFoundError(
        f"no DALI pipeline for model '{config.get('name')}': looked for "
        f"{serialized_path} (default_model_filename) and {script_path} (@autoserialize)"
    )


def _autoserialize(script_path: Path, cpu_only: bool) -> bytes:
    """As nvidia.dali._utils.autoserialize.invoke_autoserialize (what the C++
    backend runs), but on CPU instances the pipeline is built with device_id=None:
    DALI refuses any device id where there is no CUDA, even for CPU operators. GPU
    operators still serialize, and are refused by the load rules."""
    from nvidia.dali._utils.autoserialize import _discover_autoserialize

    spec = importlib.util.spec_from_file_location(f"_dali_model_{abs(hash(script_path))}", script_path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(script_path.parent))  # dali.py may import its neighbours
    # No __pycache__ in the user's repository (the stub's interpreter is isolated:
    # it ignores PYTHONDONTWRITEBYTECODE).
    writes_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
        functions = _discover_autoserialize(module, visited=[])
        if len(functions) != 1:
            raise RuntimeError(f"precisely one @autoserialize function must exist, found {len(functions)}")
        pipeline = functions[0](device_id=None) if cpu_only else functions[0]()
        serialized = pipeline.serialize()  # in memory: the repository is never written
    except Exception as error:
        raise RuntimeError(f"{script_path}: @autoserialize failed: {error}") from error
    finally:
        sys.path.remove(str(script_path.parent))
        sys.dont_write_bytecode = writes_bytecode
    return serialized


# --- load-time checks -----------------------------------------------------------

def warn_on_version_skew(version_dir: Path) -> None:
    stamp = version_dir / DALI_VERSION_FILENAME
    if stamp.is_file():
        built_with = stamp.read_text().strip()
        if built_with != nvidia.dali.__version__:
            pb_utils.Logger.log_warn(
                f"{version_dir}: pipeline serialized with DALI {built_with}, served with "
                f"DALI {nvidia.dali.__version__}; rebuild it if outputs differ"
            )


# --- the model -------------------------------------------------------------------

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
        self._device_id = int(args["model_instance_device_id"]) if args["model_instance_kind"] == "GPU" else None
        self._batched = int(config.get("max_batch_size", 0)) > 0
        self._batch_size = max(int(config.get("max_batch_size", 0)), 1)
        self._num_threads = _int_parameter(parameters, "num_threads")
        self._max_pixels = _int_parameter(parameters, "max_pixels") or DEFAULT_MAX_PIXELS
        self._max_input_bytes = (_int_parameter(parameters, "max_input_bytes")
                                 or int(os.environ.get(MAX_INPUT_BYTES_ENV) or DEFAULT_MAX_INPUT_BYTES))
        self._itemsizes = {tensor["name"]: np.dtype(TRITON_TO_NUMPY[tensor["data_type"]]).itemsize
                           for tensor in config["input"]}
        self._input_names = [port.name for port in spec.inputs]
        self._decoded_inputs = [name for name in self._input_names if name in spec.decoded_inputs]
        self._outputs = [
            (tensor["name"], TRITON_TO_NUMPY[tensor["data_type"]])
            for tensor in config["output"]
        ]
        self._pipeline = self._build_pipeline()

    def _build_pipeline(self) -> Pipeline:
        # prefetch_queue_depth=1: each run() consumes exactly the batch just fed.
        # Without a num_threads parameter the serialized pipeline's count stands,
        # as in the C++ backend.
        overrides = {"num_threads": self._num_threads} if self._num_threads else {}
        pipeline = Pipeline.deserialize(
            serialized_pipeline=self._serialized,
            batch_size=self._batch_size,
            device_id=self._device_id,
            prefetch_queue_depth=1,
            **overrides,
        )
        pipeline.build()
        return pipeline

    def execute(self, requests):
        responses = [None] * len(requests)
        runnable = []
        for index, request in enumerate(requests):
            try:
                runnable.append((index, self._samples_of(request)))
            except InputError as error:
                responses[index] = _error_response(error, pb_utils.TritonError.INVALID_ARG)
        if runnable:
            for index, response in zip([i for i, _ in runnable], self._execute_fed(runnable)):
                responses[index] = response
        return responses

    def _execute_fed(self, runnable):
        feeds = [feed for _, feed in runnable]
        try:
            return [self._respond(outputs) for outputs in self._run(feeds)]
        except PipelineError as batch_error:
            if len(feeds) == 1:
                return [_error_response(batch_error)]
        # Isolate the culprit: run each merged request on its own.
        return [self._execute_one(feed) for feed in feeds]

    def _execute_one(self, feed):
        try:
            return self._respond(self._run([feed])[0])
        except PipelineError as error:
            return _error_response(error)

    def _samples_of(self, request) -> dict[str, np.ndarray]:
        """A request's inputs; each row of a batched input is one sample."""
        tensors = {name: pb_utils.get_input_tensor_by_name(request, name) for name in self._input_names}
        for name, tensor in tensors.items():
            _check_size(name, tensor.shape(), self._itemsizes[name], self._max_input_bytes)
        feed = {name: tensor.as_numpy() for name, tensor in tensors.items()}
        if not self._batched:
            feed = {name: array[np.newaxis] for name, array in feed.items()}
        for name in self._decoded_inputs:
            for row, sample in enumerate(feed[name]):
                _check_pixels(name, row, sample, self._max_pixels)
        return feed

    def _respond(self, outputs):
        tensors = [
            pb_utils.Tensor(name, array.astype(dtype, copy=False))
            for (name, dtype), array in zip(self._outputs, outputs)
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _run(self, feeds):
        """Run the requests' samples as one DALI batch; return each request's outputs."""
        try:
            for name in self._input_names:
                if len(feeds) == 1:
                    self._pipeline.feed_input(name, feeds[0][name])  # dense: no per-row views
                else:
                    self._pipeline.feed_input(name, [row for feed in feeds for row in feed[name]])
            pipeline_outputs = self._pipeline.run()
        except RuntimeError as error:
            # The failed pipeline object is no longer valid: rebuild it.
            self._pipeline = self._build_pipeline()
            raise PipelineError(_explain(error)) from error
        sizes = [len(feed[self._input_names[0]]) for feed in feeds]
        return _split(pipeline_outputs, sizes, self._batched)


def _check_size(name: str, shape, itemsize: int, max_bytes: int) -> None:
    """From the tensor's shape: nothing has read or copied its data yet."""
    size = int(np.prod(shape, dtype=np.int64)) * itemsize
    if size > max_bytes:
        raise InputError(f"input '{name}' is {size} bytes, above this model's max_input_bytes "
                         f"{max_bytes}: send smaller images or fewer per request")


def _check_pixels(name: str, row: int, sample: np.ndarray, max_pixels: int) -> None:
    """Read the image header only (Pillow decodes nothing at open)."""
    try:
        with Image.open(io.BytesIO(sample.data)) as header:
            width, height = header.size
    except (UnidentifiedImageError, OSError, ValueError):
        return  # not an image Pillow knows: the decoder gives its own error
    if width * height > max_pixels:
        raise InputError(
            f"input '{name}' sample {row}: image declares {width}x{height} = "
            f"{width * height} pixels, above this model's max_pixels {max_pixels}"
        )


def _split(pipeline_outputs, request_sizes, batched):
    """Each request's rows of each output. A ragged merged batch leaves DALI as
    samples of different shapes: those are stacked per request."""
    outputs = [output.as_array() if output.is_dense_tensor() else output
               for output in pipeline_outputs]
    offsets = np.cumsum([0] + request_sizes)
    return [
        [_rows(output, start, end, batched) for output in outputs]
        for start, end in zip(offsets[:-1], offsets[1:])
    ]


def _rows(output, start: int, end: int, batched: bool) -> np.ndarray:
    if isinstance(output, np.ndarray):
        return output[start:end] if batched else output[start]
    samples = [np.asarray(output[index]) for index in range(start, end)]
    if not batched:
        return samples[0]
    if len({sample.shape for sample in samples}) > 1:
        raise PipelineError(
            f"DALI pipeline output has samples of shapes {[s.shape for s in samples]} in one "
            "request: a Triton output is one dense tensor per request"
        )
    return np.stack(samples)


def _int_parameter(parameters: dict, key: str) -> int | None:
    value = parameters.get(key, {}).get("string_value")
    return int(value) if value else None


def _explain(error: RuntimeError) -> str:
    """DALI's message (it names the operator) without the lines about the pipeline
    object, plus what a decoder failure means for the client."""
    noise = ("Critical error in pipeline:", "Current pipeline object is no longer valid.")
    lines = [line.strip() for line in str(error).splitlines()]
    text = " ".join(line for line in lines if line and line not in noise)
    if "decoders" in text:
        text += " (the input is not a complete image in a format the decoder supports)"
    return "DALI pipeline failed: " + text


def _error_response(error: Exception, code=None):
    # UNKNOWN is what the C++ DALI backend returns: HTTP 400, gRPC UNKNOWN.
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(str(error), code if code is not None else pb_utils.TritonError.UNKNOWN)
    )
