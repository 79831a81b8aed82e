"""What both sides of Triton agree on, in one place.

The build writes model repositories, the launcher starts tritonserver, our
Python-based backends serve the models, and clients call them: each side imports
the names, file names, headers and type maps below instead of spelling them
again. Imports only the standard library and NumPy: the backends load it in every
stub process and the client installs without the server stack.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

# --- the model repository's files ---------------------------------------------------

CONFIG_FILENAME = "config.pbtxt"
LABELS_FILENAME = "labels.txt"
DALI_MODEL_FILENAME = "model.dali"  # a serialized DALI pipeline
DALI_SCRIPT_FILENAME = "dali.py"  # a pipeline's source, serialized by the backend at load
# Written next to model.dali by the build: the DALI version that serialized it.
DALI_VERSION_FILENAME = "model.dali.version"
ONNX_MODEL_FILENAME = "model.onnx"
PYTHON_MODEL_FILENAME = "model.py"
WARMUP_DIR = "warmup"
# The model files each backend looks for in a version folder, in order.
MODEL_FILES = {
    "dali": (DALI_MODEL_FILENAME, DALI_SCRIPT_FILENAME),
    "onnxruntime": (ONNX_MODEL_FILENAME,),
    "python": (PYTHON_MODEL_FILENAME,),
}
# A folder named `<name>.dali` with no config.pbtxt is a DALI model (the C++
# backend's convention).
DALI_FOLDER_SUFFIX = ".dali"


def version_dirs(model_dir: Path) -> list[Path]:
    """The numeric version folders, lowest first."""
    return sorted((p for p in Path(model_dir).iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def latest_version_dir(model_dir: Path) -> Path:
    """The highest numeric version folder: what auto-complete inspects."""
    versions = version_dirs(model_dir)
    if not versions:
        raise FileNotFoundError(f"{model_dir} has no numeric version folder")
    return versions[-1]


# --- what the launcher tells the backends ---------------------------------------------

# Triton does not give a Python backend's auto-complete the model's location, and
# Triton 2.51 has no request-size flag: the launcher exports both.
REPOSITORY_ENV = "TRITONSTACK_MODEL_REPOSITORY"
# Largest input tensor a backend accepts, in bytes; the default is Triton's own
# --http-max-input-size default in the releases that have that flag.
MAX_INPUT_BYTES_ENV = "TRITONSTACK_MAX_INPUT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 64 * 1024 * 1024
# Diagnostics for tritonstack/diagnostics/memory_probe.py: a file path; the dali backend then
# traces Python allocations and writes its memory figures there after every batch.
MEMORY_TRACE_ENV = "TRITONSTACK_MEMORY_TRACE"
# DALI's threshold between malloc and its own host memory pool (docs/memory.md): the
# dali backend's default, which the stub's environment may override.
DALI_HOST_POOL_ENV = "DALI_MALLOC_POOL_THRESHOLD"
DALI_HOST_POOL_THRESHOLD = "128k"
# The dali backend calls glibc's malloc_trim(0) after every N batches, N from here
# (default 0: never; --compact-memory: 1): it hands the heap's free pages back (docs/memory.md).
MALLOC_TRIM_ENV = "TRITONSTACK_MALLOC_TRIM_EVERY"
DEFAULT_MALLOC_TRIM_EVERY = 0  # off unless the launcher is asked for compact memory
# "0" turns off the dali backend's pool residency (tritonstack/backends/residency.py):
# DALI's pool pages are then counted when a batch first writes them, not when reserved.
POOL_RESIDENCY_ENV = "TRITONSTACK_POOL_RESIDENCY"
# Each stub's shared region with tritonserver (the Python backend's
# shm-default-byte-size; its own default is 1 MiB, grown 1 MiB at a time, each growth a
# new mapping of the whole file): sized for a full batch of 32 from the start (outputs
# of 3x224x224 float32, 0.57 MiB each, and the encoded photos in), so that ordinary
# traffic does not grow it. A file in /dev/shm: untouched pages cost nothing.
STUB_REGION_SETTING = "shm-default-byte-size"
# Where shm_open puts the stubs' regions (the launcher cleans up after dead stubs there;
# the dali backend finds its own there).
SHM_DIR = Path("/dev/shm")
STUB_REGION_BYTES = 32 << 20
# `tritonserver --backend-config=dali,plugin_libs=a.so:b.so` reaches NVIDIA's C++ dali
# backend (src/parameters.h: plugin_libs, release_after_unload); Triton hands a
# Python-based backend only the python backend's settings, so the launcher passes
# the dali entries of its tritonserver flags to the stubs here, as JSON.
DALI_BACKEND_CONFIG_ENV = "TRITONSTACK_DALI_BACKEND_CONFIG"


def backend_config(args: list[str] | tuple[str, ...], backend: str) -> dict[str, str]:
    """`backend`'s settings among tritonserver flags: --backend-config=<backend>,<key>=<value>
    (or the value as the next argument), the last of a key winning, as in tritonserver."""
    values = [arg.split("=", 1)[1] for arg in args if arg.startswith("--backend-config=")]
    values += [value for flag, value in zip(args, args[1:]) if flag == "--backend-config"]
    settings = {}
    for value in values:
        name, _, setting = value.partition(",")
        key, equals, setting_value = setting.partition("=")
        if name == backend and equals:
            settings[key] = setting_value
    return settings

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
    "TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
}
# DALI's DALIDataType values (nvidia.dali.types) -> Triton data type.
DALI_TO_TRITON = {
    0: "TYPE_UINT8", 1: "TYPE_UINT16", 2: "TYPE_UINT32", 3: "TYPE_UINT64", 4: "TYPE_INT8",
    5: "TYPE_INT16", 6: "TYPE_INT32", 7: "TYPE_INT64", 8: "TYPE_FP16", 9: "TYPE_FP32",
    10: "TYPE_FP64", 11: "TYPE_BOOL", 12: "TYPE_STRING",
}
# ONNX element types: (ONNX Runtime's spelling, onnx.TensorProto number) -> Triton data type.
ONNX_TO_TRITON = {
    ("tensor(float)", 1): "TYPE_FP32", ("tensor(uint8)", 2): "TYPE_UINT8", ("tensor(int8)", 3): "TYPE_INT8",
    ("tensor(uint16)", 4): "TYPE_UINT16", ("tensor(int16)", 5): "TYPE_INT16", ("tensor(int32)", 6): "TYPE_INT32",
    ("tensor(int64)", 7): "TYPE_INT64", ("tensor(string)", 8): "TYPE_STRING", ("tensor(bool)", 9): "TYPE_BOOL",
    ("tensor(float16)", 10): "TYPE_FP16", ("tensor(double)", 11): "TYPE_FP64", ("tensor(uint32)", 12): "TYPE_UINT32",
    ("tensor(uint64)", 13): "TYPE_UINT64", ("tensor(bfloat16)", 16): "TYPE_BF16",
}


def onnx_type(element: str | int) -> str:
    """Triton's data type for an ONNX element type, given as ONNX Runtime spells it
    ("tensor(float)") or as onnx's TensorProto number (1); unknown ones unchanged."""
    for spellings, triton in ONNX_TO_TRITON.items():
        if element in spellings:
            return triton
    return str(element)
