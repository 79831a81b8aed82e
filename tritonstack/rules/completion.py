"""Whether a backend's auto-complete would change a model's config: the launcher turns
Triton's auto-complete off when it would change none (`--disable-auto-complete-config`).

Triton's Python backend completes a config by starting a stub of its own for the model
before the model's instances, then sleeps one second before it stops that stub
(python_backend src/stub_launcher.cc, UpdateHealth): about 1.7 s per model load on a
2-core machine, whether the config needed anything or not. A config that already
states what the backend would fill gains nothing from it.

A model counts as complete only where the answer is known here: a DALI model whose
serialized pipeline and config agree (`rules.dali.dali_autocomplete` leaves it as it
is), an ONNX model the same way against its graph, a Python model whose model.py
defines no `auto_complete_config`, an ensemble. Anything else (a `<name>.dali`
folder, a `dali.py` to be serialized at load, a backend this project does not know,
a config that does not parse) keeps auto-complete on.
"""

from __future__ import annotations

import ast
from pathlib import Path

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import model_config_pb2 as pb

from tritonstack.repository_files import (
    CONFIG_FILENAME,
    DALI_MODEL_FILENAME,
    ONNX_MODEL_FILENAME,
    PYTHON_MODEL_FILENAME,
    ConfigError,
    config_dict,
    latest_version_dir,
    read_config,
)
from tritonstack.rules import dali as dali_rules
from tritonstack.rules import dali_proto
from tritonstack.rules import onnxruntime as onnx_rules
from tritonstack.rules.common import stated_max_batch_size

ONNX_PLATFORM = "onnxruntime_onnx"
AUTO_COMPLETE_HOOK = "auto_complete_config"  # the Python backend's static method


def models_to_complete(repository: Path) -> dict[str, str]:
    """The models of `repository` whose backend would complete their config, each
    with why; {} when auto-complete would change no config."""
    if not Path(repository).is_dir():  # tritonserver says what is wrong with it
        return {str(repository): "not a folder"}
    found = {}
    for model_dir in sorted(p for p in Path(repository).iterdir() if p.is_dir() and not p.name.startswith(".")):
        reason = completion_reason(model_dir)
        if reason:
            found[model_dir.name] = reason
    return found


def completion_reason(model_dir: Path) -> str | None:
    """Why the model's backend would complete its config; None when it would not."""
    if not (model_dir / CONFIG_FILENAME).is_file():
        return "no config.pbtxt"
    try:
        config = read_config(model_dir)
        version_dir = latest_version_dir(model_dir)
    except (ConfigError, OSError, UnicodeDecodeError) as error:  # Triton says what is wrong at load
        return str(error).splitlines()[0]
    config.name = model_dir.name  # Triton names a model after its folder
    if config.platform == "ensemble":
        return None
    reasons = {"dali": _dali_reason, "onnxruntime": _onnx_reason, "python": _python_reason}
    backend = "onnxruntime" if config.platform == ONNX_PLATFORM else config.backend
    if backend not in reasons:
        return f"backend {config.backend or config.platform!r}: its auto-complete is not known here"
    try:
        return reasons[backend](model_dir, version_dir, config)
    except (OSError, ValueError, SyntaxError, DecodeError) as error:  # Triton refuses the model, saying why
        return f"its files cannot be read here ({type(error).__name__}: {error})"


def _dali_reason(model_dir: Path, version_dir: Path, config: pb.ModelConfig) -> str | None:
    serialized = version_dir / (config.default_model_filename or DALI_MODEL_FILENAME)
    if not serialized.is_file():
        return f"no {serialized.name}: the pipeline is known only once the backend serializes it"
    spec = dali_proto.parse_pipeline(serialized.read_bytes())
    stated = stated_max_batch_size((model_dir / CONFIG_FILENAME).read_text())
    merged, problems = dali_rules.dali_autocomplete(config_dict(config), spec, spec.max_batch_size or 1, stated)
    return _changed(config, merged, problems)


def _onnx_reason(model_dir: Path, version_dir: Path, config: pb.ModelConfig) -> str | None:
    graph = version_dir / (config.default_model_filename or ONNX_MODEL_FILENAME)
    if not graph.is_file():
        return f"no {graph.name}"
    inputs, outputs = onnx_rules.graph_io(graph)
    merged, problems = onnx_rules.onnx_autocomplete(config_dict(config), inputs, outputs)
    return _changed(config, merged, problems)


def _python_reason(model_dir: Path, version_dir: Path, config: pb.ModelConfig) -> str | None:
    script = version_dir / (config.default_model_filename or PYTHON_MODEL_FILENAME)
    tree = ast.parse(script.read_text())
    functions = (node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
    if any(function.name == AUTO_COMPLETE_HOOK for function in functions):
        return f"{script.name} defines {AUTO_COMPLETE_HOOK}"
    return None


def _changed(config: pb.ModelConfig, merged: dict, problems: list) -> str | None:
    if problems:
        return f"auto-complete reports: {problems[0].message}"
    if json_format.ParseDict(merged, pb.ModelConfig()) != config:
        return "its backend would fill fields the config leaves out"
    return None
