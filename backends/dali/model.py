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
Beyond the C++ backend: an encoded image the decoder is certain to refuse (no image,
a format it does not read, a truncated JPEG or PNG: tritonstack.decodable) gets the
decoder's status before the pipeline runs, so it costs no rebuild; when several
requests merged into one batch fail together,
each is run again alone, so only the bad request gets the error; and encoded images
and requests are held to a decode budget read from the images' headers before the
decoder allocates anything (tritonstack.decode_budget: pixels per image, per
request, per decoder run; a merged batch above the per-run budget runs in parts,
and, with DALI's host pool off, after a run above `release_above_pixels` the
decoder's buffers are returned);
and an input tensor larger than `max_input_bytes` (parameter, else
$TRITONSTACK_MAX_INPUT_BYTES from the launcher, else 64 MiB) is refused before its
data is read.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import json
import os
import sys
import tracemalloc
from pathlib import Path

# DALI's own pool for its host buffers of DALI_HOST_POOL_THRESHOLD and more (decoded
# images, resized and normalized batches): kept and reused from batch to batch and
# across pipeline rebuilds rather than taken from malloc, whose heaps fragment under
# images of varied sizes (the stub's RSS crept by ~0.2 MiB every 1 200 requests,
# docs/memory.md). The pool keeps the largest run's buffers (DALI 2.4 never hands
# them back), which the decode budget's max_batch_pixels bounds.
# DALI reads it when it loads: set before the import.
# The environment may set another value (0: every buffer from malloc).
from tritonstack.contract import DALI_HOST_POOL_ENV, DALI_HOST_POOL_THRESHOLD  # noqa: E402

os.environ.setdefault(DALI_HOST_POOL_ENV, DALI_HOST_POOL_THRESHOLD)

import numpy as np  # noqa: E402
import nvidia.dali  # noqa: E402
import nvidia.dali.backend  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402
from nvidia.dali import Pipeline  # noqa: E402

from tritonstack.contract import (  # noqa: E402
    CONFIG_FILENAME,
    DALI_MODEL_FILENAME,
    DALI_SCRIPT_FILENAME,
    DALI_VERSION_FILENAME,
    DEFAULT_MALLOC_TRIM_EVERY,
    DEFAULT_MAX_INPUT_BYTES,
    MALLOC_TRIM_ENV,
    MAX_INPUT_BYTES_ENV,
    MEMORY_TRACE_ENV,
    REPOSITORY_ENV,
    TRITON_TO_NUMPY,
    latest_version_dir,
)
# The one reader of model.dali and the one set of load rules, shared with
# build_pipelines.py check.
from tritonstack.dali_proto import parse_pipeline  # noqa: E402
from tritonstack.decodable import undecodable_reason  # noqa: E402
from tritonstack.decode_budget import BudgetError, DecodeBudget, plan_parts  # noqa: E402
from tritonstack.rules import (  # noqa: E402
    dali_autocomplete,
    dali_problems,
    raise_problems,
    stated_max_batch_size,
)


class PipelineError(Exception):
    """A DALI pipeline run failed on the data it was given."""


class InputError(Exception):
    """A request's data was refused before it reached the pipeline."""


class UndecodableError(InputError):
    """An encoded image the decoder is certain to refuse, refused before it runs:
    its failure would cost a pipeline rebuild (tritonstack.decodable)."""


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


# --- memory diagnostics (loadtests/memory_probe.py) --------------------------------

_LIBC = ctypes.CDLL(None)  # the C library this process runs on (malloc_trim, mallinfo2)

class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (glibc >= 2.33): totals over all arenas.
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


class MemoryTrace:
    """With $TRITONSTACK_MEMORY_TRACE naming a file: Python's traced allocations
    (tracemalloc) and glibc's heap (mallinfo2) written there after every batch, so
    that a probe outside the stub can tell live objects from allocator slack. Off by
    default: tracing slows every allocation."""

    TOP_EVERY = 200  # batches between tracemalloc snapshots (they are slow)

    def __init__(self, path: str):
        self.path = Path(path)
        self.batches = 0
        self._first_snapshot = None
        self._top: list[str] = []
        self._mallinfo2 = getattr(_LIBC, "mallinfo2", None)
        if self._mallinfo2 is not None:
            self._mallinfo2.restype = _MallInfo2
        tracemalloc.start()

    def after_batch(self) -> None:
        self.batches += 1
        current, peak = tracemalloc.get_traced_memory()
        figures = {"batches": self.batches, "traced_bytes": current, "traced_peak_bytes": peak}
        if self._mallinfo2 is not None:
            info = self._mallinfo2()
            figures["mallinfo2"] = {name: getattr(info, name) for name, _ in info._fields_}
        if self.batches % self.TOP_EVERY == 0:
            snapshot = tracemalloc.take_snapshot()
            if self._first_snapshot is None:
                self._first_snapshot = snapshot
            self._top = [str(stat) for stat in snapshot.compare_to(self._first_snapshot, "lineno")[:8]]
        figures["top_growth_since_first_snapshot"] = self._top
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(figures))
        os.replace(partial, self.path)  # the probe never reads half a file


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
        self._budget = DecodeBudget.from_parameters(parameters)
        raise_budget_problems(self._budget)
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
        # With DALI's host pool on, a rebuilt pipeline's buffers go back to the pool,
        # not to the system: releasing after large runs would only cost a rebuild.
        self._buffers_return = _pool_threshold_bytes(os.environ[DALI_HOST_POOL_ENV]) == 0
        self._memory_trace = MemoryTrace(os.environ[MEMORY_TRACE_ENV]) if os.environ.get(MEMORY_TRACE_ENV) else None
        self._trim_every = int(os.environ.get(MALLOC_TRIM_ENV) or DEFAULT_MALLOC_TRIM_EVERY)
        self._batches = 0

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
        runnable, pixels = [], []
        for index, request in enumerate(requests):
            try:
                feed, declared = self._samples_of(request)
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
            _malloc_trim()
        if self._memory_trace is not None:
            self._memory_trace.after_batch()
        return responses

    def _release_buffers(self) -> None:
        """Return the buffers a run of large images grew: a new pipeline (the old
        one's buffers are freed), DALI's unused pools, glibc's free heap."""
        self._pipeline = None
        gc.collect()
        nvidia.dali.backend.ReleaseUnusedMemory()
        _malloc_trim()
        self._pipeline = self._build_pipeline()

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

    def _samples_of(self, request) -> tuple[dict[str, np.ndarray], int]:
        """A request's inputs (each row of a batched input is one sample) and the
        pixels its images declare."""
        tensors = {name: pb_utils.get_input_tensor_by_name(request, name) for name in self._input_names}
        for name, tensor in tensors.items():
            _check_size(name, tensor.shape(), self._itemsizes[name], self._max_input_bytes)
        feed = {name: tensor.as_numpy() for name, tensor in tensors.items()}
        if not self._batched:
            feed = {name: array[np.newaxis] for name, array in feed.items()}
        pixels = sum(self._budget.request_pixels((sample.data for sample in feed[name]), name)
                     for name in self._decoded_inputs)
        for name in self._decoded_inputs:
            for row, sample in enumerate(feed[name]):
                reason = undecodable_reason(sample.data)
                if reason:
                    raise UndecodableError(f"input '{name}' sample {row} cannot be decoded: {reason}; refused "
                                           "before the pipeline's image decoder (decoders.image) ran")
        return feed, pixels

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


def raise_budget_problems(budget: DecodeBudget) -> None:
    problems = budget.problems()
    if problems:
        raise ValueError("decode budget: " + "; ".join(problems))


# glibc only (None elsewhere: nothing to trim).
_MALLOC_TRIM = getattr(_LIBC, "malloc_trim", None)


def _malloc_trim() -> None:
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


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


def _pool_threshold_bytes(value: str) -> int:
    """DALI_MALLOC_POOL_THRESHOLD's value ("128k", "1M", "0") in bytes."""
    units = {"k": 1 << 10, "M": 1 << 20}
    return int(value[:-1]) * units[value[-1]] if value[-1:] in units else int(value or 0)


def _int_parameter(parameters: dict, key: str) -> int | None:
    value = parameters.get(key, {}).get("string_value")
    return int(value) if value else None


def _explain(error: RuntimeError) -> str:
    """DALI's message (it names the operator) without the lines about the pipeline
    object, plus what a decoder failure means for the client."""
    noise = ("Critical error in pipeline:", "Current pipeline object is no longer valid.")
    lines = [line.strip() for line in str(error).splitlines()]
    text = " ".join(line for line in lines if line and line not in noise)
    if "bad_alloc" in text:  # the stub's memory ceiling (tritonstack.serve.limits)
        text += " (out of memory: this model's memory ceiling was reached; send fewer or smaller images)"
    elif "decoders" in text:
        text += " (the input is not a complete image in a format the decoder supports)"
    return "DALI pipeline failed: " + text


def _error_response(error: Exception, code=None):
    # UNKNOWN is what the C++ DALI backend returns: HTTP 400, gRPC UNKNOWN.
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(str(error), code if code is not None else pb_utils.TritonError.UNKNOWN)
    )
