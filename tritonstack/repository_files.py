"""The files of a model repository, as the build writes them and the backends and
`tritonstack check` look for them (the C++ backends' conventions)."""

from __future__ import annotations

from pathlib import Path

CONFIG_FILENAME = "config.pbtxt"
VERSION = "1"  # the one version folder each model has
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


class ConfigError(ValueError):
    """A config.pbtxt that is not valid protobuf text of Triton's ModelConfig."""


def parse_config(text: str):
    """Triton's ModelConfig message from protobuf text (tritonclient's, imported here:
    the backends read this module in stubs that have no protobuf)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as error:
        raise ConfigError(str(error)) from error


def read_config(model_dir: Path):
    """Parse a model folder's config.pbtxt into Triton's ModelConfig message."""
    return parse_config((Path(model_dir) / CONFIG_FILENAME).read_text())


def config_dict(config) -> dict:
    """Triton's JSON form of a ModelConfig message, as a backend receives it (fields
    left at their default are absent, as when a config.pbtxt does not state them)."""
    from google.protobuf import json_format

    return json_format.MessageToDict(config, preserving_proto_field_name=True)


def version_dirs(model_dir: Path) -> list[Path]:
    """The numeric version folders, lowest first."""
    return sorted((p for p in Path(model_dir).iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def latest_version_dir(model_dir: Path) -> Path:
    """The highest numeric version folder: what auto-complete inspects."""
    versions = version_dirs(model_dir)
    if not versions:
        raise FileNotFoundError(f"{model_dir} has no numeric version folder")
    return versions[-1]
