"""What clients and servers agree on over the wire, in one place.

Tensor and model names, the wire format of a batch of images, the admin header and
the type maps: the build writes them into model repositories, our backends serve
them and clients send them. Imports only the standard library and NumPy: a client
installs without the server stack. What the launcher tells the backends lives in
tritonstack.backends.settings; the repository's file names in
tritonstack.repository_files.
"""

from __future__ import annotations

import os

import numpy as np

# --- the restricted (admin) APIs --------------------------------------------------------

ADMIN_KEY_ENV = "TRITONSTACK_ADMIN_KEY"
ADMIN_HEADER = "tritonstack-admin-key"
# Triton's gRPC frontend expects restricted-protocol metadata under this prefix.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


def admin_headers(protocol: str, key: str | None = None) -> dict[str, str]:
    """The header that opens the restricted APIs, with the key given or
    $TRITONSTACK_ADMIN_KEY; no header without a key. gRPC carries it as metadata
    under Triton's restricted-protocol prefix."""
    key = key or os.environ.get(ADMIN_KEY_ENV)
    if not key:
        return {}
    return {(ADMIN_HEADER if protocol == "http" else GRPC_HEADER_PREFIX + ADMIN_HEADER): key}


# --- model names --------------------------------------------------------------------------

ENSEMBLE_INPUT = "INPUT"  # encoded image bytes, one zero-padded row per image
ENSEMBLE_OUTPUT = "OUTPUT"  # probabilities, with labels for the classification extension
# The preprocessing models' tensors (the C++ DALI backend's customary names).
PREPROCESS_INPUT = "DALI_INPUT_0"
PREPROCESS_OUTPUT = "DALI_OUTPUT_0"


# The queues a request waits in on its way through one of our ensembles (preprocessing,
# classifier). Triton (2.51) applies a request's `timeout` at each step's queue afresh:
# a client shares its deadline between them (tritonstack.client.protocol).
QUEUES_PER_REQUEST = 2
# Two classes of request at every step (Triton's priority levels). A request that names
# no priority is interactive: it is served first, and refused once it waited past the
# server's latency objective (tritonstack.objective). A client that would rather wait
# than be refused (a folder run, a closed-loop benchmark) sends BATCH_PRIORITY: served
# after the interactive ones, with a long ceiling.
INTERACTIVE_PRIORITY = 1
BATCH_PRIORITY = 2


def ensemble_name(preset: str) -> str:
    return f"ensemble_{preset}"


def preprocessing_name(preset: str) -> str:
    return f"preprocess_{preset}"


DEFAULT_PRESET = "dali_efficientnet_lite0"
DEFAULT_MODEL = ensemble_name(DEFAULT_PRESET)

# Video presets' preprocessing is "video": their ensembles take encoded clips (a zero-padded
# row each, as images) and answer with `frames` rows of probabilities per clip, in order.
VIDEO_PREPROCESSOR = "video"
VIDEO_ENSEMBLE_PREFIX = ensemble_name(f"{VIDEO_PREPROCESSOR}_")
DEFAULT_VIDEO_MODEL = ensemble_name(f"{VIDEO_PREPROCESSOR}_efficientnet_lite0")


def is_video_model(name: str) -> bool:
    return name.startswith(VIDEO_ENSEMBLE_PREFIX)


# Regions presets' preprocessing is "regions": their ensembles take one encoded image per
# sample (a zero-padded row, as above) and its boxes, FP32 [N, 4] of x0, y0, x1, y1 in the
# image's pixels after EXIF orientation, and answer one row of probabilities per box, in order.
REGIONS_PREPROCESSOR = "regions"
REGIONS_ENSEMBLE_PREFIX = ensemble_name(f"{REGIONS_PREPROCESSOR}_")
DEFAULT_REGIONS_MODEL = ensemble_name(f"{REGIONS_PREPROCESSOR}_efficientnet_lite0")
ENSEMBLE_BOXES = "BOXES"
PREPROCESS_BOXES = "DALI_INPUT_1"
BOX_WIDTH = 4  # x0, y0, x1, y1
# Our dali backend's model config parameters for a regions model: the input that carries
# the boxes and the most boxes per image (the pipeline's slots). NVIDIA's C++ backend
# ignores parameters it does not know (docs/backends.md, Regions).
BOXES_INPUT_PARAMETER = "boxes_input"
MAX_BOXES_PARAMETER = "max_boxes"


def is_regions_model(name: str) -> bool:
    return name.startswith(REGIONS_ENSEMBLE_PREFIX)


# Audio presets' preprocessing is "audio": their ensembles take one encoded clip per request
# ([1, bytes]: clips differ in length) and answer its speech segments, [1, k, 3] of start and
# end in seconds and mean speech probability, and, when asked, a probability per 32 ms frame.
AUDIO_PREPROCESSOR = "audio"
AUDIO_ENSEMBLE_PREFIX = ensemble_name(f"{AUDIO_PREPROCESSOR}_")
DEFAULT_AUDIO_MODEL = ensemble_name(f"{AUDIO_PREPROCESSOR}_silero_vad")
ENSEMBLE_SEGMENTS = "SEGMENTS"
ENSEMBLE_FRAME_PROBABILITIES = "FRAME_PROBABILITIES"
# An audio classifier's ensemble (bring your own) answers OUTPUT, the clip's probabilities
# with its labels, as an image classifier does, and each patch's when asked.
ENSEMBLE_PATCH_PROBABILITIES = "PATCH_PROBABILITIES"
SEGMENT_WIDTH = 3  # start_s, end_s, probability
# Our dali backend's model config parameter: the longest clip, read from its header
# (tritonstack.media.audio_header). NVIDIA's C++ backend ignores it.
MAX_AUDIO_SECONDS_PARAMETER = "max_audio_seconds"


def is_audio_model(name: str) -> bool:
    return name.startswith(AUDIO_ENSEMBLE_PREFIX)


def boxes_array(boxes) -> np.ndarray:
    """A request's boxes as the regions models take them: FP32 [N, 4] (x0, y0, x1, y1),
    [0, 4] for none."""
    array = np.asarray(boxes, dtype=np.float32)
    if array.size == 0:
        return np.zeros((0, BOX_WIDTH), np.float32)
    return array


# --- the wire format of a batch of images ------------------------------------------------


def pad_batch(images: list[bytes]) -> np.ndarray:
    """[len(images), longest] uint8, each row an encoded image, zero-padded.
    Decoders stop at the image's end marker, so the padding is never read."""
    longest = max(len(image) for image in images)
    batch = np.zeros((len(images), longest), dtype=np.uint8)
    for row, image in zip(batch, images):
        row[: len(image)] = np.frombuffer(image, dtype=np.uint8)
    return batch


# --- type maps ---------------------------------------------------------------------------

# Triton data type (config spelling) -> NumPy dtype.
TRITON_TO_NUMPY = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
}
# DALI's DALIDataType values (nvidia.dali.types) -> Triton data type.
DALI_TO_TRITON = {
    0: "TYPE_UINT8",
    1: "TYPE_UINT16",
    2: "TYPE_UINT32",
    3: "TYPE_UINT64",
    4: "TYPE_INT8",
    5: "TYPE_INT16",
    6: "TYPE_INT32",
    7: "TYPE_INT64",
    8: "TYPE_FP16",
    9: "TYPE_FP32",
    10: "TYPE_FP64",
    11: "TYPE_BOOL",
    12: "TYPE_STRING",
}
# ONNX element types: (ONNX Runtime's spelling, onnx.TensorProto number) -> Triton data type.
ONNX_TO_TRITON = {
    ("tensor(float)", 1): "TYPE_FP32",
    ("tensor(uint8)", 2): "TYPE_UINT8",
    ("tensor(int8)", 3): "TYPE_INT8",
    ("tensor(uint16)", 4): "TYPE_UINT16",
    ("tensor(int16)", 5): "TYPE_INT16",
    ("tensor(int32)", 6): "TYPE_INT32",
    ("tensor(int64)", 7): "TYPE_INT64",
    ("tensor(string)", 8): "TYPE_STRING",
    ("tensor(bool)", 9): "TYPE_BOOL",
    ("tensor(float16)", 10): "TYPE_FP16",
    ("tensor(double)", 11): "TYPE_FP64",
    ("tensor(uint32)", 12): "TYPE_UINT32",
    ("tensor(uint64)", 13): "TYPE_UINT64",
    ("tensor(bfloat16)", 16): "TYPE_BF16",
}


def onnx_type(element: str | int) -> str:
    """Triton's data type for an ONNX element type, given as ONNX Runtime spells it
    ("tensor(float)") or as onnx's TensorProto number (1); unknown ones unchanged."""
    for spellings, triton in ONNX_TO_TRITON.items():
        if element in spellings:
            return triton
    return str(element)
