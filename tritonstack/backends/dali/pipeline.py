"""The DALI pipeline of one model instance: built from the serialized pipeline with
the config's batch size and threads, fed the requests' samples as one batch, its
outputs split back per request (an output listed in split_along_outer_axis
concatenated along its samples' outer axis); rebuilt after a failure, since DALI invalidates a
pipeline object that failed."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Iterator

import numpy as np
from nvidia.dali import Pipeline
from nvidia.dali.backend import TensorListGPU
from nvidia.dali.types import to_numpy_type

from tritonstack.rules.dali_errors import meaningful_lines


class PipelineError(Exception):
    """A DALI pipeline run failed on the data it was given."""


# What DALI says when a run finds an input operator with nothing left to give.
_INPUT_DEPLETED = "No data was provided to the InputOperator"


class PipelineRunner:
    def __init__(
        self,
        serialized: bytes,
        batch_size: int,
        device_id: int | None,
        num_threads: int | None,
        input_names: list[str],
        split: tuple[bool, ...] = (),
    ):
        self._serialized = serialized
        self._batch_size = batch_size
        self._device_id = device_id
        self._num_threads = num_threads
        self._input_names = input_names
        self._split = split  # per pipeline output: split along its outer axis
        self._borrowed = None  # the outputs of a borrowing run, referenced while lent
        self._pipeline: Pipeline | None = self._build()

    def _build(self) -> Pipeline:
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

    def rebuild(self, while_down: Callable[[], None] | None = None) -> None:
        """A new pipeline; the old one (and its buffers) is dropped first, and
        `while_down` runs between the two (to hand the freed buffers back)."""
        self._borrowed = None
        self._pipeline = None
        if while_down is not None:
            while_down()
        self._pipeline = self._build()

    def run(self, feeds: list[dict[str, np.ndarray]], borrow: bool = False) -> list[list[np.ndarray]]:
        """Run the requests' samples as one DALI batch; return each request's outputs.

        borrow=True: dense outputs are views of DALI's own buffers, not copies, valid
        until this runner's next run or rebuild. The stub copies a response's tensors
        into shared memory once execute returns, so the last run before it returns can
        lend them: a copy of the batch (602 KB an image for a 224 x 224 FP32 crop)
        saved per run (docs/performance.md#where-the-serving-overhead-goes)."""
        try:
            for name in self._input_names:
                if len(feeds) == 1:
                    self._pipeline.feed_input(name, feeds[0][name])  # dense: no per-row views
                else:
                    self._pipeline.feed_input(name, [row for feed in feeds for row in feed[name]])
            pipeline_outputs = self._pipeline.run()
        except RuntimeError as error:
            # The failed pipeline object is no longer valid: rebuild it.
            self.rebuild()
            raise PipelineError(explain(error)) from error
        sizes = [len(feed[self._input_names[0]]) for feed in feeds]
        lent = [] if borrow else None
        self._borrowed = lent  # what the views point into stays referenced until the next run
        return _per_request(pipeline_outputs, sizes, self._split, lent)

    def stream(self, feed: dict[str, np.ndarray]) -> Iterator[list[np.ndarray]]:
        """Feed an input operator's request once, then run until it is consumed:
        each run's outputs, a batch of up to batch_size samples (sequences of a
        clip). DALI's Python API does not tell when an input operator is depleted
        (the C++ backend reads its "depleted" trace): a run of fewer samples than the
        batch size is the last; after a full one, the next run finds nothing, and
        the pipeline, which a failed run invalidates, is rebuilt."""
        finished = False
        try:
            for name in self._input_names:
                self._pipeline.feed_input(name, feed[name])
            while not finished:
                try:
                    outputs = self._pipeline.run()
                except RuntimeError as error:
                    self.rebuild()
                    finished = True
                    if _INPUT_DEPLETED in str(error):
                        return
                    raise PipelineError(explain(error)) from error
                samples = len(outputs[0])
                finished = samples < self._batch_size
                yield _per_request(outputs, [samples], self._split)[0]
        except RuntimeError as error:  # feed_input refused the data
            finished = True
            self.rebuild()
            raise PipelineError(explain(error)) from error
        finally:
            if not finished:  # the caller stopped early: what is left of the input must not reach the next request
                self.rebuild()


def _per_request(pipeline_outputs, request_sizes, split, lent: list | None = None):
    """Each request's rows of each output. A ragged merged batch leaves DALI as
    samples of different shapes: those are stacked per request. `lent`: see _on_host."""
    outputs = [_on_host(output, lent) for output in pipeline_outputs]
    split = list(split) + [False] * (len(outputs) - len(split))
    offsets = np.cumsum([0] + request_sizes)
    return [
        [
            _split_rows(output, start, end) if is_split else _rows(output, start, end)
            for output, is_split in zip(outputs, split)
        ]
        for start, end in zip(offsets[:-1], offsets[1:])
    ]


def _on_host(output, lent: list | None = None):
    """A pipeline output in host memory: an array where its samples share a shape, else
    the TensorList. The array is a copy, or, given a `lent` list, a view of DALI's buffer,
    whose owners are appended to `lent` (the caller keeps them while the view is used).
    A GPU instance's outputs are copied from the card first (the onnxruntime backend
    here reads host memory; the C++ backends pass GPU tensors on)."""
    if isinstance(output, TensorListGPU):
        output = output.as_cpu()
    if not output.is_dense_tensor():
        return output
    tensor = output.as_tensor()  # may be a new tensor of its own: it is kept with the list
    array = _viewed(tensor)
    if lent is None:
        return array.copy()
    lent.append((output, tensor))
    return array


def _viewed(tensor) -> np.ndarray:
    """A dense CPU tensor's memory as an array, by address (no copy). DALI's own as_array
    fails inside Triton's Python backend stub on Python 3.12 ("Unable to convert
    function return value to a Python type"), seen on a GPU machine."""
    dtype = np.dtype(to_numpy_type(tensor.dtype))
    shape = tuple(tensor.shape())
    memory = (ctypes.c_char * (math.prod(shape) * dtype.itemsize)).from_address(tensor.data_ptr())
    return np.frombuffer(memory, dtype=dtype).reshape(shape)


def _split_rows(output, start: int, end: int) -> np.ndarray:
    """As the C++ backend's split_outer_dim (src/dali_executor/utils/utils.h): the
    request's samples (n_i, d1..dD) become sum(n_i) rows of (d1..dD)."""
    samples = (
        [output[index] for index in range(start, end)]
        if isinstance(output, np.ndarray)
        else [np.asarray(output[index]) for index in range(start, end)]
    )
    if any(sample.ndim < 1 for sample in samples):
        raise PipelineError("To split outer dimension, the batch must be at least 2-dimensional.")
    if len({sample.shape[1:] for sample in samples}) > 1:
        raise PipelineError(
            f"DALI pipeline output split along its outer axis has samples of shapes "
            f"{[s.shape for s in samples]} in one request: their inner shapes must agree"
        )
    return np.concatenate(samples)


def _rows(output, start: int, end: int) -> np.ndarray:
    if isinstance(output, np.ndarray):
        return output[start:end]
    samples = [np.asarray(output[index]) for index in range(start, end)]
    if len({sample.shape for sample in samples}) > 1:
        raise PipelineError(
            f"DALI pipeline output has samples of shapes {[s.shape for s in samples]} in one "
            "request: a Triton output is one dense tensor per request"
        )
    return np.stack(samples)


def explain(error: RuntimeError) -> str:
    """DALI's message (it names the operator) without the lines about the pipeline
    object, plus what a decoder failure means for the client."""
    text = " ".join(meaningful_lines(error))
    if "bad_alloc" in text:  # the stub's memory ceiling (tritonstack.serve.limits)
        text += " (out of memory: this model's memory ceiling was reached; send fewer or smaller inputs)"
    elif "decoders.audio" in text:
        text += " (the input is not a complete clip the audio decoder reads: WAV, FLAC, OGG Vorbis or Opus)"
    elif "decoders.video" in text:
        text += " (the input is not a complete clip the video decoder reads, or has no frames)"
    elif "decoders" in text:
        text += " (the input is not a complete image in a format the decoder supports)"
    return "DALI pipeline failed: " + text
