"""The asyncio twin of tritonstack.client.classifier.ClassifierClient, over
tritonclient.http.aio or tritonclient.grpc.aio: many requests in flight from one
event loop.

    async with AsyncClassifierClient("127.0.0.1:8001", protocol="grpc") as client:
        tops = await asyncio.gather(*(client.classify([image]) for image in images))

Same request format, retries, timeout and readiness check as the sync client. In
shared-memory mode every in-flight request takes its own pair of regions from a
pool, all unregistered and destroyed on close. A request learns only about its own
regions: another request's failure leaves them as they are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio
from tritonclient.utils import InferenceServerException

from tritonstack.client import protocol
from tritonstack.client.retry import RELEASE_RETRY, is_lost_region, is_region_in_use, is_worth_releasing_again
from tritonstack.client.shm import RequestRegions, SharedMemoryRegion, check_released


class AsyncClassifierClient(protocol.ClientBase):
    """Connects and checks readiness in `async with` (or `await client.connect()`);
    arguments: see protocol.ClientBase."""

    def __init__(self, *args, max_connections: int = 100, **kwargs):
        super().__init__(*args, **kwargs)
        # HTTP only: requests beyond it wait in the client for a connection (an open
        # loop at a high rate needs as many as it has requests in flight).
        self.max_connections = max_connections
        self._labels_lock = asyncio.Lock()
        self._free_regions: list[RequestRegions] = []
        self._all_regions: list[RequestRegions] = []
        self._reclaiming: set[asyncio.Task] = set()  # _reclaim_later's tasks
        self._client = None

    async def connect(self) -> "AsyncClassifierClient":
        if self.protocol == "http":
            self._client = http_aio.InferenceServerClient(
                self.url, conn_limit=self.max_connections, conn_timeout=self.wait_s or protocol.DEFAULT_TIMEOUT_S
            )
        else:
            self._client = grpc_aio.InferenceServerClient(self.url)
        try:
            await self.wait_ready()
            self.info = protocol.ModelInfo.from_server(*await self.retry.acall(self._fetch_model_info))
        except BaseException:
            await self.close()
            raise
        return self

    async def wait_ready(self) -> None:
        try:
            await self.retry.acall(self._check_ready)
        except Exception as error:
            raise self._unreachable(error) from error

    async def _check_ready(self) -> None:
        self._not_ready(
            await self._client.is_server_ready(headers=self._headers()),
            await self._client.is_model_ready(self.model, headers=self._headers()),
        )

    async def _fetch_model_info(self) -> tuple[dict, dict]:
        return (
            await self._client.get_model_metadata(self.model, **self._metadata_options()),
            await self._client.get_model_config(self.model, **self._metadata_options()),
        )

    async def classify(self, images: Sequence[bytes], top_k: int = 5) -> list[list[protocol.Prediction]]:
        return [top for chunk in self.info.chunks(images) for top in await self._classify_chunk(chunk, top_k)]

    async def classify_each(
        self, images: Sequence[bytes], top_k: int = 5
    ) -> list[list[protocol.Prediction] | Exception]:
        """One outcome per image; see tritonstack.client.classifier.outcome_per_image."""
        return await self._outcome_per_item(images, lambda chunk: self._classify_chunk(chunk, top_k))

    async def classify_clips_each(
        self, clips: Sequence[bytes], top_k: int = 5
    ) -> list[protocol.ClipPredictions | Exception]:
        """See ClassifierClient.classify_clips_each."""
        return await self._outcome_per_item(clips, lambda chunk: self._classify_clips_chunk(chunk, top_k))

    async def _outcome_per_item(self, items: Sequence[bytes], classify_chunk) -> list:
        outcomes = []
        for chunk in self.info.chunks(items):
            try:
                outcomes += await classify_chunk(chunk)
                continue
            except Exception as error:
                if not protocol.worth_splitting(error, len(chunk)):
                    outcomes += [error] * len(chunk)
                    continue
            for item in chunk:
                try:
                    outcomes += await classify_chunk([item])
                except Exception as error:
                    outcomes.append(error)
        return outcomes

    async def classify_audio(
        self, clips: Sequence[bytes], frame_probabilities: bool = False
    ) -> list[protocol.SpeechSegments]:
        """See ClassifierClient.classify_audio."""
        return [await self._speech(clip, frame_probabilities) for clip in clips]

    async def classify_audio_each(
        self, clips: Sequence[bytes], frame_probabilities: bool = False
    ) -> list[protocol.SpeechSegments | Exception]:
        """See ClassifierClient.classify_audio_each."""
        outcomes = []
        for clip in clips:
            try:
                outcomes.append(await self._speech(clip, frame_probabilities))
            except Exception as error:
                outcomes.append(error)
        return outcomes

    async def _speech(self, clip: bytes, frames: bool) -> protocol.SpeechSegments:
        inputs, outputs = protocol.build_audio_request(self.protocol, self.info, protocol.checked_clip(clip), frames)
        return protocol.speech_segments(await self._aretrying(lambda: self._infer(inputs, outputs)), frames)

    async def classify_regions(self, image: bytes, boxes, top_k: int = 5) -> list[list[protocol.Prediction]]:
        """As ClassifierClient.classify_regions: each box's ranking, in order."""
        boxes = protocol.region_boxes(self.info, image, boxes)
        if not len(boxes):
            return []
        inputs, outputs = protocol.build_regions_request(self.protocol, self.info, image, boxes, top_k)
        result = await self._aretrying(lambda: self._infer(inputs, outputs))
        return [protocol.parse_classification(row) for row in result.as_numpy(self.info.output_name)]

    async def probabilities(self, images: Sequence[bytes]) -> np.ndarray:
        parts = [await self._probabilities_chunk(chunk) for chunk in self.info.chunks(images)]
        return np.concatenate(parts) if parts else np.empty((0, *self.info.output_shape), np.float32)

    async def labels(self, image: bytes) -> list[str]:
        """See ClassifierClient.labels."""
        async with self._labels_lock:  # one request, however many tasks ask at once
            if self._labels is None:
                everything = (await self._infer_classification([image], self.info.num_classes))[0]
                self._labels = protocol.labels_from(everything, self.info.num_classes)
        return self._labels

    async def _classify_chunk(self, images: list[bytes], top_k: int) -> list[list[protocol.Prediction]]:
        if self.shm == "none":
            return await self._infer_classification(images, top_k)
        probabilities = await self._probabilities_chunk(images)
        return protocol.top_predictions(probabilities, top_k, await self.labels(images[0]))

    async def _classify_clips_chunk(self, clips: list[bytes], top_k: int) -> list[protocol.ClipPredictions]:
        # Never in shared memory: the answer's size is the model's frames per clip.
        inputs, outputs = protocol.build_request(self.protocol, self.info, self.info.encode(clips), class_count=0)
        result = await self._aretrying(lambda: self._infer(inputs, outputs))
        frames = protocol.batch_rows(self.info, result.as_numpy(self.info.output_name))
        return protocol.clip_predictions(frames, len(clips), top_k, await self.labels(clips[0]))

    async def _infer_classification(self, images: list[bytes], class_count: int) -> list[list[protocol.Prediction]]:
        inputs, outputs = protocol.build_request(self.protocol, self.info, self.info.encode(images), class_count)
        result = await self._aretrying(lambda: self._infer(inputs, outputs))
        return [
            protocol.parse_classification(row)
            for row in protocol.batch_rows(self.info, result.as_numpy(self.info.output_name))
        ]

    async def _probabilities_chunk(self, images: list[bytes]) -> np.ndarray:
        tensor = self.info.encode(images)
        if self.shm == "none":
            inputs, outputs = protocol.build_request(self.protocol, self.info, tensor, class_count=0)
            result = await self._aretrying(lambda: self._infer(inputs, outputs))
            return protocol.batch_rows(self.info, result.as_numpy(self.info.output_name))
        regions = self._free_regions.pop() if self._free_regions else self._new_regions()
        try:
            # No registration is forgotten on a retry: a failed call says nothing of what
            # the server knows, and other requests' regions are registered and in use.
            # A restarted server says so itself (_shared_memory_attempt).
            probabilities = await self._aretrying(lambda: self._shared_memory_attempt(tensor, regions))
        except BaseException:
            self._reclaim_later(regions)
            raise
        self._free_regions.append(regions)
        return probabilities

    def _reclaim_later(self, regions: RequestRegions) -> None:
        """After a failed or cancelled request, which the server may still be running:
        the regions go back to the pool only once the server let go of them (it refuses
        to unregister a region in use); if it never does, close releases them."""
        task = asyncio.get_running_loop().create_task(self._reclaim(regions))
        self._reclaiming.add(task)
        task.add_done_callback(self._reclaiming.discard)

    async def _reclaim(self, regions: RequestRegions) -> None:
        try:
            for region in regions:
                if region.allocated:
                    await self._unregister(region)
        except Exception:
            return  # still held, or no server to ask: left out of the pool
        self._free_regions.append(regions)

    async def _shared_memory_attempt(self, tensor: np.ndarray, regions: RequestRegions) -> np.ndarray:
        try:
            return await self._infer_in_shared_memory(tensor, regions)
        except InferenceServerException as error:
            if not is_lost_region(error):
                raise
        # A restarted server: register this request's regions once more. Other
        # requests find out about theirs the same way.
        regions.forget_registration()
        return await self._infer_in_shared_memory(tensor, regions)

    def _new_regions(self) -> RequestRegions:
        regions = RequestRegions()
        self._all_regions.append(regions)
        return regions

    async def _infer(self, inputs, outputs):
        return await self._client.infer(
            self.model, inputs, outputs=outputs, headers=self._headers(), **self._infer_options
        )

    async def _infer_in_shared_memory(self, tensor: np.ndarray, regions: RequestRegions) -> np.ndarray:
        await self._fit(regions.input, tensor.nbytes)
        await self._fit(regions.output, protocol.output_nbytes(self.info, tensor))
        regions.input.write(tensor)
        await self._infer(*protocol.build_request(self.protocol, self.info, tensor, 0, regions))
        shape = self.info.output_batch_shape(tensor.shape[0])
        return protocol.batch_rows(self.info, regions.output.read(self.info.output_datatype, shape))

    async def _fit(self, region: SharedMemoryRegion, byte_size: int) -> None:
        """See ClassifierClient._fit."""
        unregister, allocate, register = protocol.region_steps(region, byte_size)
        if unregister:
            await self._unregister(region)
        if allocate:
            region.allocate(byte_size)
        if register:
            await self._client.register_system_shared_memory(
                region.name, region.key, region.byte_size, headers=self._headers()
            )
            region.registered = True

    async def _unregister(self, region: SharedMemoryRegion, retry_if=is_region_in_use) -> None:
        """See ClassifierClient._unregister."""
        await RELEASE_RETRY.acall(
            lambda: self._client.unregister_system_shared_memory(region.name, headers=self._headers()),
            retry_if=retry_if,
        )
        region.registered = False

    async def _release(self, region: SharedMemoryRegion) -> Exception | None:
        """See ClassifierClient._release."""
        try:
            await self._unregister(region, retry_if=is_worth_releasing_again)
        except Exception as error:
            return error
        return None

    async def _release_all(self) -> dict[str, Exception]:
        """Every allocated region unregistered; the failures by name."""
        # Also when `registered` is False: a registration cut short (a timeout, a
        # cancelled task) may have reached the server.
        regions = [region for pair in self._all_regions for region in pair if region.allocated]
        # All at once: a server that holds them or cannot answer is waited for once.
        errors = await asyncio.gather(*(self._release(region) for region in regions))
        return {region.name: error for region, error in zip(regions, errors) if error is not None}

    async def _status_or_error(self):
        """See ClassifierClient._status_or_error."""
        try:
            return await self._client.get_system_shared_memory_status(**self._metadata_options())
        except Exception as error:
            return error

    async def close(self) -> None:
        """Unregister and destroy every shared-memory region (always), then disconnect.
        RegionsLeftRegistered when the server keeps one it would not unregister."""
        for task in list(self._reclaiming):  # close releases every region itself
            task.cancel()
        await asyncio.gather(*self._reclaiming, return_exceptions=True)
        try:
            failures = await self._release_all()
            if failures:
                check_released(failures, await self._status_or_error())
        finally:
            for regions in self._all_regions:
                regions.destroy()
            self._all_regions.clear()
            self._free_regions.clear()
            if self._client is not None:
                await self._client.close()

    async def __aenter__(self) -> "AsyncClassifierClient":
        return await self.connect()

    async def __aexit__(self, *exc_info) -> None:
        await self.close()
