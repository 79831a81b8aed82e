"""A request's samples as the pipeline will take them, refused before the pipeline
runs when they are too large (max_input_bytes, the decode budget), certain not to
decode (tritonstack.media.decodable for images, tritonstack.media.video_header for clips) or, for a
regions model, when an image's boxes are not ones it can cut (tritonstack.media.regions)."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonstack.media.audio_header import AudioHeaderError, read_audio_header
from tritonstack.media.decodable import inspect_encoded
from tritonstack.media.decode_budget import BudgetError, DecodeBudget
from tritonstack.media.regions import BoxError, check_boxes, oriented_size
from tritonstack.media.video_header import CPU_CODECS, GPU_CODECS, read_header, unreadable_reason

__all__ = [
    "AudioInputs",
    "BudgetError",
    "ClipInputs",
    "InputError",
    "RegionInputs",
    "RequestLimits",
    "UndecodableError",
    "check_size",
    "samples_of",
]


class InputError(Exception):
    """A request's data was refused before it reached the pipeline."""


class UndecodableError(InputError):
    """An encoded image the decoder is certain to refuse, refused before it runs:
    its failure would cost a pipeline rebuild (tritonstack.media.decodable)."""


class ClipInputs:
    """The inputs that feed a video decoder, the codecs it reads, and the frames it
    keeps of a clip (its sequence_length; None: all the clip's frames)."""

    def __init__(self, names: list[str], on_gpu: bool, frames: int | None, streamed: bool = False):
        self.names = names
        self.codecs = GPU_CODECS if on_gpu else CPU_CODECS
        self.frames = frames
        # An input operator decodes a clip `frames` at a time, in runs: at most that many at once.
        self.streamed = streamed

    def request_pixels(self, name: str, clips, budget: DecodeBudget) -> int:
        """The pixels a request's clips decode to (frames x width x height, read from
        their headers), refused above the decode budget as images are."""
        total = 0
        for row, clip in enumerate(clips):
            data = bytes(clip.data)
            reason = unreadable_reason(data, self.codecs)
            if reason:
                raise UndecodableError(
                    f"input '{name}' sample {row} cannot be decoded: {reason}; refused "
                    "before the pipeline's video decoder (decoders.video) ran"
                )
            header = read_header(data)
            frames = self.frames or header.frames or 1
            if self.streamed and header.frames:
                frames = min(frames, header.frames)
            pixels = frames * (header.width or 0) * (header.height or 0)
            if pixels > budget.max_pixels:
                raise BudgetError(
                    f"input '{name}' sample {row}: clip decodes to {frames} frames of "
                    f"{header.width}x{header.height} = {pixels} pixels, above this model's "
                    f"max_pixels {budget.max_pixels}: send a shorter or smaller clip"
                )
            total += pixels
        if total > budget.max_request_pixels:
            raise BudgetError(
                f"input '{name}': the request's clips decode to {total} pixels, above this "
                f"model's max_request_pixels {budget.max_request_pixels}: send fewer clips per request"
            )
        return total


class AudioInputs:
    """The inputs that feed an audio decoder, and the longest clip the model takes
    (config parameter max_audio_seconds, our extension: the C++ backend ignores it)."""

    def __init__(self, names: list[str], max_seconds: int | None):
        self.names = names
        self.max_seconds = max_seconds

    def check(self, name: str, clips) -> None:
        """Each clip's header: a format the decoder reads, samples in it, not too long."""
        for row, clip in enumerate(clips):
            try:
                header = read_audio_header(clip.data)
            except AudioHeaderError as error:
                raise UndecodableError(
                    f"input '{name}' sample {row} cannot be decoded: {error}; refused "
                    "before the pipeline's audio decoder (decoders.audio) ran"
                ) from error
            if self.max_seconds and header.seconds and header.seconds > self.max_seconds:
                raise InputError(
                    f"input '{name}' sample {row}: the clip lasts {header.seconds:.1f} s, above this model's "
                    f"max_audio_seconds {self.max_seconds}: send it in parts of at most {self.max_seconds} s"
                )


class RegionInputs:
    """A regions model's boxes input (config parameter boxes_input), the image input its
    boxes are cut from, the most boxes an image may have (max_boxes) and the pixels of
    one crop: the decode budget counts each image once, plus its crops."""

    def __init__(self, boxes: str, image: str, max_boxes: int, crop_pixels: int):
        self.boxes = boxes
        self.image = image
        self.max_boxes = max_boxes
        self.crop_pixels = crop_pixels

    def request_pixels(self, feed: dict[str, np.ndarray], budget: DecodeBudget, image_pixels: int) -> int:
        """The crops' pixels; raises InputError naming the image and box refused, and
        BudgetError when the images' pixels and their crops' exceed max_request_pixels."""
        crops = 0
        for row, (image, boxes) in enumerate(zip(feed[self.image], feed[self.boxes])):
            try:
                check_boxes(np.asarray(boxes), oriented_size(image.data), self.max_boxes, row)
            except BoxError as error:
                raise InputError(f"input '{self.boxes}': {error}") from error
            crops += len(boxes)
        pixels = crops * self.crop_pixels
        if image_pixels + pixels > budget.max_request_pixels:
            raise BudgetError(
                f"input '{self.boxes}': the request's images ({image_pixels} pixels) and their {crops} crops "
                f"({pixels} pixels) exceed this model's max_request_pixels {budget.max_request_pixels}: send "
                "fewer boxes or smaller images per request"
            )
        return pixels


def samples_of(
    request,
    input_names: list[str],
    decoded_inputs: list[str],
    itemsizes: dict[str, int],
    max_input_bytes: int,
    budget: DecodeBudget,
    clips: ClipInputs | None = None,
    regions: RegionInputs | None = None,
    audio: AudioInputs | None = None,
) -> tuple[dict[str, np.ndarray], int]:
    """A request's inputs and the pixels its images and clips declare. Each row of
    an input is one sample, whether or not Triton batches the model: an unbatched
    model's dims start with the samples' axis (the C++ backend's add_batch_dim)."""
    tensors = {name: pb_utils.get_input_tensor_by_name(request, name) for name in input_names}
    for name, tensor in tensors.items():
        check_size(name, tensor.shape(), itemsizes[name], max_input_bytes)
    feed = {name: tensor.as_numpy() for name, tensor in tensors.items()}
    if any(array.ndim == 0 for array in feed.values()):
        raise InputError("a scalar input has no samples: give every input at least one dimension, its samples")
    for name, array in feed.items():
        if array.dtype == np.object_:
            decoder_input = any(group is not None and name in group.names for group in (clips, audio))
            feed[name] = raw_string_samples(name, array, refuse=name in decoded_inputs or decoder_input)
    counts = {name: len(array) for name, array in feed.items()}
    if len(set(counts.values())) > 1:
        # The C++ backend's words (src/dali_model_instance.cc GenerateInputs).
        raise InputError(f"Each input in a request must have the same batch size. (samples per input: {counts})")
    inspected = {name: [inspect_encoded(sample.data) for sample in feed[name]] for name in decoded_inputs}
    pixels = sum(budget.sizes_pixels([size for _, size in inspected[name]], name) for name in decoded_inputs)
    for name in decoded_inputs:
        _check_images(name, [reason for reason, _ in inspected[name]])
    for name in audio.names if audio is not None else ():
        audio.check(name, feed[name])
    if clips is not None:
        pixels += sum(clips.request_pixels(name, feed[name], budget) for name in clips.names)
    if regions is not None:
        pixels += regions.request_pixels(feed, budget, pixels)
    return feed, pixels


def _check_images(name: str, reasons: list[str | None]) -> None:
    """Each image's reason to be refused before decoding (tritonstack.media.decodable), in order."""
    for row, reason in enumerate(reasons):
        if reason:
            raise UndecodableError(
                f"input '{name}' sample {row} cannot be decoded: {reason}; refused "
                "before the pipeline's image decoder (decoders.image) ran"
            )


@dataclass(frozen=True)
class RequestLimits:
    """What one model instance accepts in a request, fixed at load."""

    input_names: list[str]
    decoded_inputs: list[str]  # the inputs that feed an image decoder
    itemsizes: dict[str, int]  # bytes per element of each input, for its size from its shape
    max_input_bytes: int
    budget: DecodeBudget
    batch_size: int  # the pipeline's: the most samples one request may hold
    clips: ClipInputs | None = None
    regions: RegionInputs | None = None
    audio: AudioInputs | None = None

    def samples_of(self, request) -> tuple[dict[str, np.ndarray], int]:
        """The request's samples and declared pixels, or InputError / BudgetError."""
        feed, pixels = samples_of(
            request,
            self.input_names,
            self.decoded_inputs,
            self.itemsizes,
            self.max_input_bytes,
            self.budget,
            self.clips,
            self.regions,
            self.audio,
        )
        samples = len(next(iter(feed.values())))
        if samples > self.batch_size:  # only an unbatched model's requests can be (Triton bounds the others)
            raise InputError(
                f"the request has {samples} samples, above the pipeline's batch size "
                f"{self.batch_size}: send at most {self.batch_size} per request"
            )
        return feed, pixels


def raw_string_samples(name: str, array: np.ndarray, refuse: bool) -> list[np.ndarray]:
    """A TYPE_STRING (BYTES) input as NVIDIA's dali backend takes it: Triton's raw
    buffer, each element its 4-byte little-endian length then its bytes, read as
    UINT8 (src/utils/triton.h to_dali maps BYTES to UINT8), a sample per row. No
    decoder reads an image behind a length prefix (dali_backend issue #176:
    "Encoded image has ambiguous format"), so an input that feeds one is refused,
    saying what to send instead."""
    if refuse:
        raise UndecodableError(
            f"input '{name}' is TYPE_STRING (BYTES): the dali backend takes a string "
            "input's raw buffer, a 4-byte length before each element, which no decoder "
            "reads; declare the input TYPE_UINT8 and send the encoded bytes as UINT8"
        )
    return [np.frombuffer(_serialized(row.reshape(-1)), np.uint8) for row in array]


def _serialized(elements) -> bytes:
    return b"".join(
        struct.pack("<I", len(element)) + bytes(element)
        for element in (e if isinstance(e, bytes) else str(e).encode() for e in elements)
    )


def check_size(name: str, shape, itemsize: int, max_bytes: int) -> None:
    """From the tensor's shape: nothing has read or copied its data yet."""
    size = math.prod(int(dim) for dim in shape) * itemsize  # Python ints: no overflow; cheaper than np.prod
    if size > max_bytes:
        raise InputError(
            f"input '{name}' is {size} bytes, above this model's max_input_bytes "
            f"{max_bytes}: send smaller images or fewer per request"
        )
