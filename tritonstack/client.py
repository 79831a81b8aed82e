"""Classify encoded images with a Triton classification model, over HTTP or gRPC.

    with ClassifierClient("127.0.0.1:8000", protocol="http") as client:
        for top in client.classify([open("cat.jpg", "rb").read()], top_k=5):
            print(top[0].label, top[0].score)

Images travel as encoded bytes (the server decodes them): one row per image,
zero-padded to the longest, as binary tensor data (or in system shared memory).
Input and output names, data types and max_batch_size come from the model's
metadata and config; longer lists are sent in several requests of at most
max_batch_size images. The ranking comes from Triton's classification extension
("score:index:label"). The asyncio twin is tritonstack.aio_client.

A client checks that the server and the model are ready before anything else,
retries (tritonstack.retry) only when the server cannot answer, and bounds each
request by `timeout_s`. The sync HTTP client is not thread-safe: use one
ClassifierClient per thread.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from tritonstack.retry import (
    RetryPolicy,
    ServerUnavailableError,
    is_lost_region,
    is_retryable,
    is_timeout,
    unavailable_message,
)
from tritonstack.server import admin_headers
from tritonstack.shm import RequestRegions, SharedMemoryRegion

DEFAULT_MODEL = "ensemble_dali_efficientnet_lite0"
PROTOCOLS = ("http", "grpc")
DEFAULT_URLS = {"http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001"}  # `make serve`
SHM_MODES = ("none", "system")
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Prediction:
    label: str
    index: int
    score: float


def pad_batch(images: list[bytes]) -> np.ndarray:
    """[len(images), longest] uint8, each row an encoded image, zero-padded.
    Decoders stop at the image's end marker, so the padding is never read."""
    longest = max(len(image) for image in images)
    batch = np.zeros((len(images), longest), dtype=np.uint8)
    for row, image in zip(batch, images):
        row[: len(image)] = np.frombuffer(image, dtype=np.uint8)
    return batch


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
class ModelInfo:
    """What a client needs to know about a model, from the server."""

    name: str
    input_name: str
    input_datatype: str
    output_name: str
    output_datatype: str
    output_shape: tuple[int, ...]  # per image
    max_batch_size: int  # 0: the model takes one image per request, without a batch axis

    @classmethod
    def from_server(cls, metadata: dict, config: dict) -> "ModelInfo":
        """From get_model_metadata / get_model_config as JSON (gRPC: as_json=True)."""
        config = config.get("config", config)
        (model_input,) = metadata["inputs"]
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


def output_nbytes(info: ModelInfo, tensor: np.ndarray) -> int:
    batch_size = tensor.shape[0] if info.max_batch_size else 1
    itemsize = np.dtype(triton_to_np_dtype(info.output_datatype)).itemsize
    return math.prod(info.output_batch_shape(batch_size)) * itemsize


def batch_rows(info: ModelInfo, output: np.ndarray) -> np.ndarray:
    """Outputs with a batch axis, whether or not the model has one."""
    return output if info.max_batch_size else output[None]


def worth_splitting(error: BaseException, batch_size: int) -> bool:
    """Whether a failed request of several images should be retried image by image."""
    return batch_size > 1 and not (is_retryable(error) or is_timeout(error))


def outcome_per_image(classify_chunk, images: list[bytes]) -> list:
    """classify_chunk(images) for all, or, when the server rejects the request,
    image by image: one broken file fails alone. Retryable failures (no server)
    and timeouts are not split: they would fail again for every image."""
    try:
        return list(classify_chunk(images))
    except Exception as error:
        if not worth_splitting(error, len(images)):
            return [error] * len(images)
    outcomes = []
    for image in images:
        try:
            outcomes.extend(classify_chunk([image]))
        except Exception as error:
            outcomes.append(error)
    return outcomes


def check_transport(protocol: str, shm: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, not {protocol!r}")
    if shm not in SHM_MODES:
        raise ValueError(f"shm must be one of {SHM_MODES}, not {shm!r}")


class ClassifierClient:
    def __init__(
        self,
        url: str,
        protocol: str = "http",
        model: str = DEFAULT_MODEL,
        *,
        timeout_s: float | None = None,
        retry: RetryPolicy = RetryPolicy(),
        shm: str = "none",
        headers: dict[str, str] | None = None,
    ):
        check_transport(protocol, shm)
        self.url, self.protocol, self.model = url, protocol, model
        self.timeout_s = timeout_s
        self.retry = retry
        self.headers = headers
        self._labels: list[str] | None = None
        self._regions = RequestRegions() if shm == "system" else None
        if protocol == "http":
            limit = timeout_s or DEFAULT_TIMEOUT_S
            self._client = httpclient.InferenceServerClient(url, connection_timeout=limit, network_timeout=limit)
            self._infer_options = {}
        else:
            self._client = grpcclient.InferenceServerClient(url)
            self._infer_options = {"client_timeout": timeout_s}
        try:
            self.wait_ready()
            self.info = ModelInfo.from_server(*self.retry.call(self._fetch_model_info))
        except BaseException:
            self.close()
            raise

    # The names of the first version of this client.
    @property
    def input_name(self) -> str:
        return self.info.input_name

    @property
    def output_name(self) -> str:
        return self.info.output_name

    def wait_ready(self) -> None:
        """Raise ServerUnavailableError, with a message saying what to do, unless
        the server and the model are ready (within the retry policy)."""
        try:
            self.retry.call(self._check_ready)
        except ServerUnavailableError:  # it answered, but is not ready: that message is the clear one
            raise
        except Exception as error:
            if is_retryable(error):
                raise ServerUnavailableError(unavailable_message(self.url, self.protocol, error)) from error
            raise

    def _headers(self) -> dict[str, str] | None:
        # A fresh copy per call: tritonclient's HTTP infer adds its
        # Inference-Header-Content-Length to the dict it is given, which would
        # then corrupt the next request without binary data.
        return dict(self.headers) if self.headers else None

    def _check_ready(self) -> None:
        if not self._client.is_server_ready(headers=self._headers()):
            raise ServerUnavailableError(f"Triton at {self.url} is not ready")
        if not self._client.is_model_ready(self.model, headers=self._headers()):
            raise ServerUnavailableError(f"model {self.model!r} is not ready at {self.url}")

    def _fetch_model_info(self) -> tuple[dict, dict]:
        as_json = {"as_json": True} if self.protocol == "grpc" else {}
        return (
            self._client.get_model_metadata(self.model, headers=self._headers(), **as_json),
            self._client.get_model_config(self.model, headers=self._headers(), **as_json),
        )

    def classify(self, images: Sequence[bytes], top_k: int = 5) -> list[list[Prediction]]:
        return [top for chunk in self.info.chunks(images) for top in self._classify_chunk(chunk, top_k)]

    def classify_each(self, images: Sequence[bytes], top_k: int = 5) -> list[list[Prediction] | Exception]:
        """One outcome per image, predictions or the error for that image alone."""
        return [
            outcome
            for chunk in self.info.chunks(images)
            for outcome in outcome_per_image(lambda part: self._classify_chunk(part, top_k), chunk)
        ]

    def probabilities(self, images: Sequence[bytes]) -> np.ndarray:
        parts = [self._probabilities_chunk(chunk) for chunk in self.info.chunks(images)]
        return np.concatenate(parts) if parts else np.empty((0, *self.info.output_shape), np.float32)

    def labels(self, image: bytes) -> list[str]:
        """The model's labels, by index. Triton tells them only in classification
        results: one request for all classes of one image gives them all."""
        if self._labels is None:
            everything = self._infer_classification([image], self.info.num_classes)[0]
            labels = [""] * self.info.num_classes
            for prediction in everything:
                labels[prediction.index] = prediction.label
            self._labels = labels
        return self._labels

    def _classify_chunk(self, images: list[bytes], top_k: int) -> list[list[Prediction]]:
        if self._regions is None:
            return self._infer_classification(images, top_k)
        return top_predictions(self._probabilities_chunk(images), top_k, self.labels(images[0]))

    def _infer_classification(self, images: list[bytes], class_count: int) -> list[list[Prediction]]:
        inputs, outputs = build_request(self.protocol, self.info, self.info.encode(images), class_count)
        result = self.retry.call(lambda: self._infer(inputs, outputs))
        return [parse_classification(row) for row in batch_rows(self.info, result.as_numpy(self.info.output_name))]

    def _probabilities_chunk(self, images: list[bytes]) -> np.ndarray:
        tensor = self.info.encode(images)
        if self._regions is None:
            inputs, outputs = build_request(self.protocol, self.info, tensor, class_count=0)
            result = self.retry.call(lambda: self._infer(inputs, outputs))
            return batch_rows(self.info, result.as_numpy(self.info.output_name))
        return self.retry.call(lambda: self._shared_memory_attempt(tensor), on_retry=self._lost_server)

    def _shared_memory_attempt(self, tensor: np.ndarray) -> np.ndarray:
        try:
            return self._infer_in_shared_memory(tensor)
        except InferenceServerException as error:
            if not is_lost_region(error):
                raise
        self._regions.forget_registration()  # a restarted server: register once more
        return self._infer_in_shared_memory(tensor)

    def _infer(self, inputs, outputs):
        return self._client.infer(self.model, inputs, outputs=outputs, headers=self._headers(), **self._infer_options)

    def _infer_in_shared_memory(self, tensor: np.ndarray) -> np.ndarray:
        regions = self._regions
        self._fit(regions.input, tensor.nbytes)
        self._fit(regions.output, output_nbytes(self.info, tensor))
        regions.input.write(tensor)
        self._infer(*build_request(self.protocol, self.info, tensor, 0, regions))
        shape = self.info.output_batch_shape(tensor.shape[0])
        return batch_rows(self.info, regions.output.read(self.info.output_datatype, shape))

    def _fit(self, region: SharedMemoryRegion, byte_size: int) -> None:
        """Make the region big enough and registered with this server."""
        if region.fits(byte_size) and region.registered:
            return
        if region.registered or region.fits(byte_size):
            self._unregister(region)  # too small, or maybe stale on a restarted server
        if not region.fits(byte_size):
            region.allocate(byte_size)
        self._client.register_system_shared_memory(region.name, region.key, region.byte_size, headers=self._headers())
        region.registered = True

    def _unregister(self, region: SharedMemoryRegion) -> None:
        try:
            self._client.unregister_system_shared_memory(region.name, headers=self._headers())
        except Exception:  # the server is gone or never knew it: nothing left to release there
            pass
        region.registered = False

    def _lost_server(self, error: BaseException) -> None:
        self._regions.forget_registration()

    def close(self) -> None:
        """Unregister and destroy the shared-memory regions (always), then disconnect."""
        if self._regions is not None:
            for region in self._regions:
                if region.registered:
                    self._unregister(region)
            self._regions.destroy()
        self._client.close()

    def __enter__(self) -> "ClassifierClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
