"""What a classification request and its answer look like, for both protocols:
the one module the sync client (tritonstack.client.classifier) and the asyncio
client (tritonstack.client.aio) share.

Images travel as encoded bytes (the server decodes them): one row per image,
zero-padded to the longest (tritonstack.contract.pad_batch), as binary tensor data
or in system shared memory; an audio clip as one row of its own per request. Input
and output names, data types and max_batch_size come from the model's metadata and
config; the ranking comes from Triton's
classification extension ("score:index:label").
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import triton_to_np_dtype

from tritonstack.address import parse_address, resolve_protocol
from tritonstack.client.retry import (
    RetryPolicy,
    RetryThrottle,
    ServerUnavailableError,
    is_overloaded,
    is_retryable,
    unavailable_message,
    wrong_protocol_message,
)
from tritonstack.client.shm import RequestRegions, SharedMemoryRegion
from tritonstack.client.throttle import DEFAULT_RATIO, AdaptiveThrottle
from tritonstack.contract import (
    BATCH_PRIORITY,
    DEFAULT_MODEL,
    ENSEMBLE_BOXES,
    ENSEMBLE_FRAME_PROBABILITIES,
    ENSEMBLE_SEGMENTS,
    QUEUES_PER_REQUEST,
    SEGMENT_WIDTH,
    boxes_array,
    pad_batch,
)
from tritonstack.media.audio_header import AudioHeaderError, read_audio_header
from tritonstack.media.regions import check_boxes, oriented_size

PROTOCOLS = ("http", "grpc")
DEFAULT_URLS = {"http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001"}  # `make serve`
SHM_MODES = ("none", "system")
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Prediction:
    label: str
    index: int
    score: float


def labels_from(predictions: list[Prediction], num_classes: int) -> list[str]:
    """The model's labels by index, from one classification of all its classes:
    Triton tells labels only in classification results."""
    labels = [""] * num_classes
    for prediction in predictions:
        labels[prediction.index] = prediction.label
    return labels


def parse_classification(entries) -> list[Prediction]:
    """Triton's classification strings, "score:index:label", best first."""
    predictions = []
    for entry in entries:
        text = entry.decode() if isinstance(entry, bytes) else str(entry)
        score, index, label = text.split(":", 2)
        predictions.append(Prediction(label=label, index=int(index), score=float(score)))
    return predictions


def top_predictions(probabilities: np.ndarray, top_k: int, labels: Sequence[str]) -> list[list[Prediction]]:
    """What the classification extension computes, done here for outputs that come
    back in shared memory (Triton cannot classify into a region)."""
    ranked = np.argsort(-probabilities, axis=1, kind="stable")[:, :top_k]
    return [
        [Prediction(label=labels[i], index=int(i), score=float(row[i])) for i in order]
        for row, order in zip(probabilities, ranked)
    ]


@dataclass(frozen=True)
class ClipPredictions:
    """A clip's answer from a video model (tritonstack.contract.is_video_model)."""

    top: list[Prediction]  # the mean of its frames' probabilities, ranked
    frames: list[list[Prediction]]  # each frame's own ranking, in the clip's order


def clip_predictions(
    probabilities: np.ndarray, clip_count: int, top_k: int, labels: Sequence[str]
) -> list[ClipPredictions]:
    """A video model answers with the same number of frames for every clip (its
    pipeline repeats a short clip's last frame), the clips' rows in order."""
    if clip_count == 0 or len(probabilities) % clip_count:
        raise ValueError(f"{len(probabilities)} frames of probabilities do not divide among {clip_count} clips")
    return [
        ClipPredictions(
            top=top_predictions(frames.mean(axis=0, keepdims=True), top_k, labels)[0],
            frames=top_predictions(frames, top_k, labels),
        )
        for frames in np.split(probabilities, clip_count)
    ]


@dataclass(frozen=True)
class Segment:
    """A span of speech in a clip (tritonstack.contract.is_audio_model)."""

    start_s: float
    end_s: float
    probability: float  # the mean speech probability of its frames


@dataclass(frozen=True)
class SpeechSegments:
    """An audio model's answer for one clip: its speech segments, in order, and when
    asked, the speech probability of each 32 ms frame."""

    segments: list[Segment]
    frame_probabilities: np.ndarray | None = None


def build_audio_request(protocol: str, info: ModelInfo, clip: bytes, frames: bool):
    """One clip per request ([1, bytes]: clips differ in length); SEGMENTS, and
    FRAME_PROBABILITIES with `frames`."""
    api = httpclient if protocol == "http" else grpcclient
    binary = {"binary_data": True} if protocol == "http" else {}
    tensor = np.frombuffer(clip, np.uint8)[None]
    model_input = api.InferInput(info.input_name, list(tensor.shape), info.input_datatype)
    model_input.set_data_from_numpy(tensor, **binary)
    names = (ENSEMBLE_SEGMENTS, ENSEMBLE_FRAME_PROBABILITIES) if frames else (ENSEMBLE_SEGMENTS,)
    return [model_input], [api.InferRequestedOutput(name, **binary) for name in names]


def speech_segments(result, frames: bool) -> SpeechSegments:
    rows = result.as_numpy(ENSEMBLE_SEGMENTS).reshape(-1, SEGMENT_WIDTH)
    segments = [Segment(float(start), float(end), float(p)) for start, end, p in rows]
    probabilities = result.as_numpy(ENSEMBLE_FRAME_PROBABILITIES).reshape(-1) if frames else None
    return SpeechSegments(segments, probabilities)


def checked_clip(clip: bytes) -> bytes:
    """A clip the model's decoder will read, or ValueError saying why not, before it is sent."""
    try:
        read_audio_header(clip)
    except AudioHeaderError as error:
        raise ValueError(f"not a clip the audio model reads: {error}") from error
    return clip


@dataclass(frozen=True)
class ModelInfo:
    """What a client needs to know about a model, from the server."""

    name: str
    input_name: str
    input_datatype: str
    output_name: str
    output_datatype: str
    output_shape: tuple[int, ...]  # per image
    max_batch_size: int  # 0: the model takes one image per request, without a batch axis
    boxes_name: str | None = None  # a regions model's boxes input (tritonstack.contract)

    @classmethod
    def from_server(cls, metadata: dict, config: dict) -> "ModelInfo":
        """From get_model_metadata / get_model_config as JSON (gRPC: as_json=True)."""
        config = config.get("config", config)
        boxes = [tensor for tensor in metadata["inputs"] if tensor["name"] == ENSEMBLE_BOXES]
        (model_input,) = [tensor for tensor in metadata["inputs"] if tensor["name"] != ENSEMBLE_BOXES]
        model_output = metadata["outputs"][0]
        batched = int(config.get("max_batch_size", 0)) > 0
        output_shape = tuple(int(d) for d in model_output["shape"])[1 if batched else 0 :]
        info = cls(
            name=metadata["name"],
            input_name=model_input["name"],
            input_datatype=model_input["datatype"],
            output_name=model_output["name"],
            output_datatype=model_output["datatype"],
            output_shape=output_shape,
            max_batch_size=int(config.get("max_batch_size", 0)),
            boxes_name=boxes[0]["name"] if boxes else None,
        )
        if info.input_datatype != "UINT8":
            raise ValueError(
                f"model {info.name!r} takes {info.input_datatype} input {info.input_name!r}, "
                "not encoded image bytes (UINT8)"
            )
        return info

    @property
    def num_classes(self) -> int:
        return math.prod(self.output_shape)

    def chunks(self, images: Sequence[bytes]) -> Iterator[list[bytes]]:
        """The images split into requests the model accepts."""
        size = max(self.max_batch_size, 1)
        for start in range(0, len(images), size):
            yield list(images[start : start + size])

    def encode(self, images: list[bytes]) -> np.ndarray:
        """The input tensor: rows of encoded bytes, or one row without batch axis."""
        if not images or any(len(image) == 0 for image in images):
            raise ValueError("empty image: nothing to classify")
        batch = pad_batch(images)
        return batch if self.max_batch_size else batch[0]

    def output_batch_shape(self, batch_size: int) -> list[int]:
        return [batch_size, *self.output_shape] if self.max_batch_size else list(self.output_shape)


def build_request(
    protocol: str,
    info: ModelInfo,
    tensor: np.ndarray,
    class_count: int,
    regions: RequestRegions | None = None,
):
    """Inputs and requested outputs for one inference, for either protocol."""
    api = httpclient if protocol == "http" else grpcclient
    model_input = api.InferInput(info.input_name, list(tensor.shape), info.input_datatype)
    binary = {"binary_data": True} if protocol == "http" else {}
    if regions is None:
        model_input.set_data_from_numpy(tensor, **binary)
        output = api.InferRequestedOutput(info.output_name, class_count=class_count, **binary)
    else:
        model_input.set_shared_memory(regions.input.name, tensor.nbytes)
        output = api.InferRequestedOutput(info.output_name, **binary)
        output.set_shared_memory(regions.output.name, output_nbytes(info, tensor))
    return [model_input], [output]


def region_boxes(info: ModelInfo, image: bytes, boxes) -> np.ndarray:
    """An image's boxes as a regions model takes them, checked as the server will
    (tritonstack.media.regions) except for the model's max_boxes, which only the server knows."""
    if info.boxes_name is None:
        raise ValueError(f"model {info.name!r} takes no boxes: name a regions model (ensemble_regions_...)")
    boxes = boxes_array(boxes)
    if len(boxes):
        check_boxes(boxes, oriented_size(image), max_boxes=None)
    return boxes


def build_regions_request(protocol: str, info: ModelInfo, image: bytes, boxes: np.ndarray, class_count: int):
    """One image and its boxes (FP32 [N, 4]) in one request: the answer has a row per box."""
    inputs, outputs = build_request(protocol, info, info.encode([image]), class_count)
    api = httpclient if protocol == "http" else grpcclient
    batched = boxes[None] if info.max_batch_size else boxes
    box_input = api.InferInput(info.boxes_name, list(batched.shape), "FP32")
    box_input.set_data_from_numpy(batched, **({"binary_data": True} if protocol == "http" else {}))
    return [*inputs, box_input], outputs


def output_nbytes(info: ModelInfo, tensor: np.ndarray) -> int:
    batch_size = tensor.shape[0] if info.max_batch_size else 1
    itemsize = np.dtype(triton_to_np_dtype(info.output_datatype)).itemsize
    return math.prod(info.output_batch_shape(batch_size)) * itemsize


def batch_rows(info: ModelInfo, output: np.ndarray) -> np.ndarray:
    """Outputs with a batch axis, whether or not the model has one."""
    return output if info.max_batch_size else output[None]


def worth_splitting(error: BaseException, batch_size: int) -> bool:
    """Whether a failed request of several images should be retried image by image: not
    when the server (or the client's throttle) could not take it, only when one image
    may be what it refused."""
    return batch_size > 1 and not (is_retryable(error) or is_overloaded(error))


def request_deadline_options(protocol: str, timeout_s: float | None, wait_s: float | None = None) -> dict:
    """tritonclient infer() keywords that carry a deadline of `timeout_s` to the server:
    the request's `timeout` parameter (Triton's queue policy refuses a request still
    queued past it) and, over gRPC, the call's deadline (`wait_s`, by default the
    same). Triton starts a request's timeout afresh at each step's queue, so the
    deadline is shared between the ensemble's queues (QUEUES_PER_REQUEST). Over HTTP
    the client's own connection timeout bounds the wait."""
    options = {}
    if timeout_s:
        options["timeout"] = max(1, round(timeout_s / QUEUES_PER_REQUEST * 1_000_000))
    if protocol == "grpc" and (wait_s or timeout_s):
        options["client_timeout"] = wait_s or timeout_s
    return options


def check_transport(protocol: str, shm: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, not {protocol!r}")
    if shm not in SHM_MODES:
        raise ValueError(f"shm must be one of {SHM_MODES}, not {shm!r}")


class ClientBase:
    """What the sync and the asyncio client are given, checked once, and what
    they do alike; each subclass talks to the server in its own way."""

    def __init__(
        self,
        url: str,
        protocol: str = "http",
        model: str = DEFAULT_MODEL,
        *,
        timeout_s: float | None = None,
        wait_s: float | None = None,
        retry: RetryPolicy = RetryPolicy(),
        shm: str = "none",
        headers: dict[str, str] | None = None,
        batch: bool = False,
        throttle_ratio: float = DEFAULT_RATIO,
    ):
        check_transport(protocol, shm)
        # "http://host:port" and "grpc://host:port" too (tritonclient refuses a scheme);
        # a scheme that names the other protocol is refused here.
        address = parse_address(url)
        resolve_protocol(address, protocol)
        self.url, self.protocol, self.model = address.hostport, protocol, model
        self.timeout_s = timeout_s
        # How long the client waits for an answer: the deadline, unless told to wait
        # longer to see what the server does with a request past it (the overload soak).
        self.wait_s = wait_s or timeout_s
        self.retry = retry
        self.shm = shm
        self.headers = headers
        self.info: ModelInfo | None = None
        self._labels: list[str] | None = None
        # Refusals by a full queue are retried within this budget, shared by every
        # request of this client (tritonstack.client.retry).
        self.retry_budget = RetryThrottle()
        # A server that refuses most requests is spared some of them: refused here,
        # before the upload (tritonstack.client.throttle; 0: off).
        self.throttle = AdaptiveThrottle(throttle_ratio)
        # Per-call keyword arguments of tritonclient's infer: the deadline goes to the
        # server as the request's `timeout` (microseconds), so that a request still
        # queued when it passes is refused there instead of computed for nobody;
        # gRPC's own deadline (client_timeout) also cancels it in Triton's queues.
        self._infer_options = request_deadline_options(protocol, timeout_s, self.wait_s)
        # A batch client (a folder run, a closed-loop benchmark) would rather wait than be
        # refused at the server's latency objective (tritonstack.contract.BATCH_PRIORITY).
        if batch:
            self._infer_options["priority"] = BATCH_PRIORITY

    def _deadline(self) -> float | None:
        """When the caller stops waiting for a request started now (time.monotonic())."""
        return time.monotonic() + self.timeout_s if self.timeout_s else None

    def _retrying(self, attempt, on_retry=None):
        """An inference call under the retry policy, its budget and its deadline, each
        attempt admitted by the client-side throttle."""

        def admitted():
            with self.throttle.admitted(is_overloaded):
                return attempt()

        return self.retry.call(admitted, on_retry, throttle=self.retry_budget, deadline=self._deadline())

    async def _aretrying(self, attempt, on_retry=None):
        async def admitted():
            with self.throttle.admitted(is_overloaded):
                return await attempt()

        return await self.retry.acall(admitted, on_retry, throttle=self.retry_budget, deadline=self._deadline())

    def _headers(self) -> dict[str, str] | None:
        # A fresh copy per call: tritonclient's HTTP infer adds its
        # Inference-Header-Content-Length to the dict it is given, which would
        # then corrupt the next request without binary data.
        headers = dict(self.headers) if self.headers else {}
        if self.protocol == "http":
            # aiohttp (under tritonclient's asyncio client) asks for gzip by default, and
            # Triton then compresses every answer, which the client inflates again: CPU
            # on both sides for a few KB on a local network (seen in a profile of the
            # server). A caller's own Accept-Encoding stands.
            headers.setdefault("Accept-Encoding", "identity")
        return headers or None

    def _metadata_options(self) -> dict:
        return {"headers": self._headers(), **({"as_json": True} if self.protocol == "grpc" else {})}

    def _not_ready(self, server_ready: bool, model_ready: bool) -> None:
        if not server_ready:
            raise ServerUnavailableError(f"Triton at {self.url} is not ready")
        if not model_ready:
            raise ServerUnavailableError(f"model {self.model!r} is not ready at {self.url}")

    def _unreachable(self, error: Exception) -> Exception:
        """What wait_ready raises for `error`: a clear ServerUnavailableError when
        no server answers (a server that answered "not ready" said so already)."""
        wrong_protocol = wrong_protocol_message(self.url, self.protocol, error)
        if wrong_protocol:
            return ServerUnavailableError(wrong_protocol)
        if is_retryable(error) and not isinstance(error, ServerUnavailableError):
            return ServerUnavailableError(unavailable_message(self.url, self.protocol, error))
        return error


def region_steps(region: SharedMemoryRegion, byte_size: int) -> tuple[bool, bool, bool]:
    """(unregister, allocate, register): what makes `region` big enough and
    registered with the server, for a request of `byte_size` bytes."""
    if region.fits(byte_size) and region.registered:
        return False, False, False
    # Too small, or allocated but not known to be registered (a registration cut
    # short, a restarted server): unregister first, so that registering the name again
    # cannot meet an old registration of it. Triton accepts unregistering a name it
    # does not know.
    unregister = region.registered or region.allocated
    return unregister, not region.fits(byte_size), True
