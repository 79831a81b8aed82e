"""Where the pipeline comes from: `<version>/model.dali` (or the config's
`default_model_filename`, serialized or a script), else `<version>/dali.py`, whose
single @autoserialize pipeline is serialized when the model loads."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nvidia.dali
import triton_python_backend_utils as pb_utils

from tritonstack.repository_files import DALI_MODEL_FILENAME, DALI_SCRIPT_FILENAME, DALI_VERSION_FILENAME
from tritonstack.rules.common import invalid_filename, invalid_path
from tritonstack.rules.dali_proto import parse_pipeline


def load_serialized(version_dir: Path, config: dict, cpu_only: bool = True) -> bytes:
    """As the C++ backend's DaliModel::LoadModel (src/dali_model.h): the file named
    by default_model_filename (model.dali) as a serialized pipeline, else the same
    file autoserialized (a .py with one @autoserialize pipeline), else dali.py
    autoserialized; serialized now by the serving DALI (with device_id=None when it
    will run on CPU instances only). The failure names both locations, in the C++
    backend's words, followed by what each attempt said."""
    filename = config.get("default_model_filename") or DALI_MODEL_FILENAME
    default_path, fallback_path = version_dir / filename, version_dir / DALI_SCRIPT_FILENAME
    refusal = invalid_filename(filename) or invalid_path(str(default_path)) or invalid_path(str(fallback_path))
    if refusal:
        raise ValueError(refusal)
    attempts = [
        (default_path, _serialized_file),
        (default_path, lambda path: _autoserialize(path, cpu_only)),
        (fallback_path, lambda path: _autoserialize(path, cpu_only)),
    ]
    causes = []
    for path, load in attempts:
        if not path.is_file():
            continue
        try:
            return load(path)
        except (OSError, ValueError, IndexError, RuntimeError) as error:
            causes.append(f"{path.name}: {error}")
    raise RuntimeError(
        "Failed to load model file. The program looked in the following locations: "
        f"{default_path}, {fallback_path}. Please make sure that the model exists in any of the locations "
        "and is properly serialized or can be properly serialized."
        + (f" ({'; '.join(dict.fromkeys(causes))})" if causes else "")
    )


def _serialized_file(path: Path) -> bytes:
    serialized = path.read_bytes()
    parse_pipeline(serialized)  # ValueError when it is not a serialized pipeline
    return serialized


def _autoserialize(script_path: Path, cpu_only: bool) -> bytes:
    """As nvidia.dali._utils.autoserialize.invoke_autoserialize (what the C++
    backend runs), but on CPU instances the pipeline is built with device_id=None:
    DALI refuses any device id where there is no CUDA, even for CPU operators. GPU
    operators still serialize, and are refused by the load rules."""
    from nvidia.dali._utils.autoserialize import _discover_autoserialize

    # As the C++ backend's script (src/utils/utils.h): the file loaded by path under
    # the module name autoserialize_mod, the import path left as it is.
    spec = importlib.util.spec_from_file_location("autoserialize_mod", script_path)
    if spec is None:
        raise RuntimeError(f"{script_path}: @autoserialize failed: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules["autoserialize_mod"] = module
    # No __pycache__ in the user's repository (the stub's interpreter is isolated:
    # it ignores PYTHONDONTWRITEBYTECODE).
    writes_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
        functions = _discover_autoserialize(module, visited=[])
        if len(functions) != 1:
            raise RuntimeError(f"precisely one @autoserialize function must exist, found {len(functions)}")
        pipeline = functions[0](device_id=None) if cpu_only else functions[0]()
        serialized = pipeline.serialize()  # in memory: the repository is never written
    except Exception as error:
        raise RuntimeError(f"{script_path}: @autoserialize failed: {error}") from error
    finally:
        sys.modules.pop("autoserialize_mod", None)
        sys.dont_write_bytecode = writes_bytecode
    return serialized


def warn_on_version_skew(version_dir: Path) -> None:
    stamp = version_dir / DALI_VERSION_FILENAME
    if stamp.is_file():
        built_with = stamp.read_text().strip()
        if built_with != nvidia.dali.__version__:
            pb_utils.Logger.log_warn(
                f"{version_dir}: pipeline serialized with DALI {built_with}, served with "
                f"DALI {nvidia.dali.__version__}; rebuild it if outputs differ"
            )
