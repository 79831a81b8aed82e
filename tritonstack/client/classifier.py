"""Classify encoded images with a Triton classification model, over HTTP or gRPC.

    with ClassifierClient("127.0.0.1:8000", protocol="http") as client:
        for top in client.classify([open("cat.jpg", "rb").read()], top_k=5):
            print(top[0].label, top[0].score)

The request and answer formats are in tritonstack.client.protocol; longer lists
are sent in several requests of at most max_batch_size images. The asyncio twin
is tritonstack.client.aio.

A client checks that the server and the model are ready before anything else,
retries (tritonstack.client.retry) only when the server cannot answer, and bounds
each request by `timeout_s`. The sync HTTP client is not thread-safe: use one
ClassifierClient per thread.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tritonstack.client import protocol
from tritonstack.client.retry import RELEASE_RETRY, is_lost_region, is_region_in_use, is_worth_releasing_again
from tritonstack.client.shm import RequestRegions, SharedMemoryRegion, check_released


def outcome_per_image(classify_chunk, images: list[bytes]) -> list:
    """classify_chunk(images) for all, or, when the server rejects the request,
    image by image: one broken file fails alone. Retryable failures (no server)
    and timeouts are not split: they would fail again for every image."""
    try:
        return list(classify_chunk(images))
    except Exception as error:
        if not protocol.worth_splitting(error, len(images)):
            return [error] * len(images)
    outcomes = []
    for image in images:
        try:
            outcomes.extend(classify_chunk([image]))
        except Exception as error:
            outcomes.append(error)
    return outcomes


class ClassifierClient(protocol.ClientBase):
    """Connects and checks readiness when made; arguments: see protocol.ClientBase."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._regions = RequestRegions() if self.shm == "system" else None
        self._retired: list[RequestRegions] = []  # regions a failed request may still hold
        if self.protocol == "http":
            limit = self.wait_s or protocol.DEFAULT_TIMEOUT_S
            self._client = httpclient.InferenceServerClient(self.url, connection_timeout=limit, network_timeout=limit)
        else:
            self._client = grpcclient.InferenceServerClient(self.url)
        try:
            self.wait_ready()
            self.info = protocol.ModelInfo.from_server(*self.retry.call(self._fetch_model_info))
        except BaseException:
            self.close()
            raise

    def wait_ready(self) -> None:
        """Raise ServerUnavailableError, with a message saying what to do, unless
        the server and the model are ready (within the retry policy)."""
        try:
            self.retry.call(self._check_ready)
        except Exception as error:
            raise self._unreachable(error) from error

    def _check_ready(self) -> None:
        self._not_ready(
            self._client.is_server_ready(headers=self._headers()),
            self._client.is_model_ready(self.model, headers=self._headers()),
        )

    def _fetch_model_info(self) -> tuple[dict, dict]:
        return (
            self._client.get_model_metadata(self.model, **self._metadata_options()),
            self._client.get_model_config(self.model, **self._metadata_options()),
        )

    def classify(self, images: Sequence[bytes], top_k: int = 5) -> list[list[protocol.Prediction]]:
        return [top for chunk in self.info.chunks(images) for top in self._classify_chunk(chunk, top_k)]

    def classify_each(self, images: Sequence[bytes], top_k: int = 5) -> list[list[protocol.Prediction] | Exception]:
        """One outcome per image, predictions or the error for that image alone."""
        return [
            outcome
            for chunk in self.info.chunks(images)
            for outcome in outcome_per_image(lambda part: self._classify_chunk(part, top_k), chunk)
        ]

    def classify_clips_each(self, clips: Sequence[bytes], top_k: int = 5) -> list[protocol.ClipPredictions | Exception]:
        """With a video model: one outcome per encoded clip, its frames' mean ranking
        and each frame's, or the error for that clip alone."""
        return [
            outcome
            for chunk in self.info.chunks(clips)
            for outcome in outcome_per_image(lambda part: self._classify_clips_chunk(part, top_k), chunk)
        ]

    def classify_audio(
        self, clips: Sequence[bytes], frame_probabilities: bool = False
    ) -> list[protocol.SpeechSegments]:
        """With an audio model: each clip's speech segments (and its frames' speech
        probabilities, when asked), a request per clip; the first failure raises."""
        return [self._speech(clip, frame_probabilities) for clip in clips]

    def classify_audio_each(
        self, clips: Sequence[bytes], frame_probabilities: bool = False
    ) -> list[protocol.SpeechSegments | Exception]:
        """One outcome per clip: its segments, or the error for that clip alone (a clip
        the decoder would refuse fails here, before it is sent)."""
        outcomes = []
        for clip in clips:
            try:
                outcomes.append(self._speech(clip, frame_probabilities))
            except Exception as error:
                outcomes.append(error)
        return outcomes

    def _speech(self, clip: bytes, frames: bool) -> protocol.SpeechSegments:
        inputs, outputs = protocol.build_audio_request(self.protocol, self.info, protocol.checked_clip(clip), frames)
        return protocol.speech_segments(self._retrying(lambda: self._infer(inputs, outputs)), frames)

    def classify_regions(self, image: bytes, boxes, top_k: int = 5) -> list[list[protocol.Prediction]]:
        """With a regions model: each box's ranking, in the boxes' order. Boxes are
        x0, y0, x1, y1 in the image's pixels after EXIF orientation; none: an empty list,
        nothing sent. Bad boxes raise tritonstack.media.regions.BoxError before any request."""
        boxes = protocol.region_boxes(self.info, image, boxes)
        if not len(boxes):
            return []
        inputs, outputs = protocol.build_regions_request(self.protocol, self.info, image, boxes, top_k)
        result = self._retrying(lambda: self._infer(inputs, outputs))
        return [protocol.parse_classification(row) for row in result.as_numpy(self.info.output_name)]

    def probabilities(self, images: Sequence[bytes]) -> np.ndarray:
        parts = [self._probabilities_chunk(chunk) for chunk in self.info.chunks(images)]
        return np.concatenate(parts) if parts else np.empty((0, *self.info.output_shape), np.float32)

    def labels(self, image: bytes) -> list[str]:
        """The model's labels, by index. Triton tells them only in classification
        results: one request for all classes of one image gives them all."""
        if self._labels is None:
            everything = self._infer_classification([image], self.info.num_classes)[0]
            self._labels = protocol.labels_from(everything, self.info.num_classes)
        return self._labels

    def _classify_chunk(self, images: list[bytes], top_k: int) -> list[list[protocol.Prediction]]:
        if self._regions is None:
            return self._infer_classification(images, top_k)
        return protocol.top_predictions(self._probabilities_chunk(images), top_k, self.labels(images[0]))

    def _classify_clips_chunk(self, clips: list[bytes], top_k: int) -> list[protocol.ClipPredictions]:
        # Never in shared memory: the answer's size is the model's frames per clip.
        inputs, outputs = protocol.build_request(self.protocol, self.info, self.info.encode(clips), class_count=0)
        result = self._retrying(lambda: self._infer(inputs, outputs))
        frames = protocol.batch_rows(self.info, result.as_numpy(self.info.output_name))
        return protocol.clip_predictions(frames, len(clips), top_k, self.labels(clips[0]))

    def _infer_classification(self, images: list[bytes], class_count: int) -> list[list[protocol.Prediction]]:
        inputs, outputs = protocol.build_request(self.protocol, self.info, self.info.encode(images), class_count)
        result = self._retrying(lambda: self._infer(inputs, outputs))
        return [
            protocol.parse_classification(row)
            for row in protocol.batch_rows(self.info, result.as_numpy(self.info.output_name))
        ]

    def _probabilities_chunk(self, images: list[bytes]) -> np.ndarray:
        tensor = self.info.encode(images)
        if self._regions is None:
            inputs, outputs = protocol.build_request(self.protocol, self.info, tensor, class_count=0)
            result = self._retrying(lambda: self._infer(inputs, outputs))
            return protocol.batch_rows(self.info, result.as_numpy(self.info.output_name))
        # No registration is forgotten on a retry: a failed call says nothing of what the
        # server knows. A restarted server says so itself (_shared_memory_attempt).
        try:
            return self._retrying(lambda: self._shared_memory_attempt(tensor))
        except BaseException:
            self._reclaim_regions()
            raise

    def _reclaim_regions(self) -> None:
        """After a failed request, which the server may still be running (a timeout
        given up on): the regions serve the next request only once the server let go of
        them (it refuses to unregister a region in use), else a fresh pair does."""
        try:
            for region in self._regions:
                if region.allocated:
                    self._unregister(region)
        except Exception:
            self._retired.append(self._regions)  # released on close
            self._regions = RequestRegions()

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
        self._fit(regions.output, protocol.output_nbytes(self.info, tensor))
        regions.input.write(tensor)
        self._infer(*protocol.build_request(self.protocol, self.info, tensor, 0, regions))
        shape = self.info.output_batch_shape(tensor.shape[0])
        return protocol.batch_rows(self.info, regions.output.read(self.info.output_datatype, shape))

    def _fit(self, region: SharedMemoryRegion, byte_size: int) -> None:
        """Make the region big enough and registered with this server."""
        unregister, allocate, register = protocol.region_steps(region, byte_size)
        if unregister:
            self._unregister(region)
        if allocate:
            region.allocate(byte_size)
        if register:
            self._client.register_system_shared_memory(
                region.name, region.key, region.byte_size, headers=self._headers()
            )
            region.registered = True

    def _unregister(self, region: SharedMemoryRegion, retry_if=is_region_in_use) -> None:
        """Raises while the server keeps the region: registering its name again would
        fail, and it would stay mapped there. (A name it does not know is no error.)"""
        RELEASE_RETRY.call(
            lambda: self._client.unregister_system_shared_memory(region.name, headers=self._headers()),
            retry_if=retry_if,
        )
        region.registered = False

    def _release(self, region: SharedMemoryRegion) -> Exception | None:
        """Unregister on close, also again when the server cannot answer right now; the
        error if it still failed."""
        try:
            self._unregister(region, retry_if=is_worth_releasing_again)
        except Exception as error:
            return error
        return None

    def _release_all(self) -> dict[str, Exception]:
        """Every allocated region unregistered; the failures by name."""
        failures = {}
        for region in [region for regions in [self._regions or (), *self._retired] for region in regions]:
            # Also when `registered` is False: a registration cut short (a
            # timeout, a cancelled task) may have reached the server.
            if region.allocated and (error := self._release(region)) is not None:
                failures[region.name] = error
        return failures

    def _status_or_error(self):
        """The server's list of system shared-memory regions, or why it could not be had."""
        try:
            return self._client.get_system_shared_memory_status(**self._metadata_options())
        except Exception as error:
            return error

    def close(self) -> None:
        """Unregister and destroy the shared-memory regions (always), then disconnect.
        RegionsLeftRegistered when the server keeps one it would not unregister."""
        try:
            failures = self._release_all()
            if failures:
                check_released(failures, self._status_or_error())
        finally:
            for regions in [self._regions, *self._retired]:
                if regions is not None:
                    regions.destroy()
            self._client.close()

    def __enter__(self) -> "ClassifierClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
