"""Where the pipeline comes from: `<version>/model.dali` (or the config's
`default_model_filename`), else `<version>/dali.py`, whose single @autoserialize
pipeline is serialized when the model loads."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nvidia.dali
import triton_python_backend_utils as pb_utils

from tritonstack.contract import DALI_MODEL_FILENAME, DALI_SCRIPT_FILENAME, DALI_VERSION_FILENAME


def load_serialized(version_dir: Path, config: dict, cpu_only: bool = True) -> bytes:
    """model.dali (or default_model_filename), else dali.py's @autoserialize
    pipeline, serialized now by the serving DALI (with device_id=None when it will
    run on CPU instances only)."""
    filename = config.get("default_model_filename") or DALI_MODEL_FILENAME
    serialized_path = version_dir / filename
    script_path = version_dir / DALI_SCRIPT_FILENAME
    if serialized_path.is_file():
        return serialized_path.read_bytes()
    if script_path.is_file():
        return _autoserialize(script_path, cpu_only)
    raise FileNotFoundError(
        f"no DALI pipeline for model '{config.get('name')}': looked for "
        f"{serialized_path} (default_model_filename) and {script_path} (@autoserialize)"
    )


def _autoserialize(script_path: Path, cpu_only: bool) -> bytes:
    """As nvidia.dali._utils.autoserialize.invoke_autoserialize (what the C++
    backend runs), but on CPU instances the pipeline is built with device_id=None:
    DALI refuses any device id where there is no CUDA, even for CPU operators. GPU
    operators still serialize, and are refused by the load rules."""
    from nvidia.dali._utils.autoserialize import _discover_autoserialize

    # As the C++ backend's script (src/utils/utils.h): the file loaded by path under
    # the module name autoserialize_mod, the import path left as it is.
    spec = importlib.util.spec_from_file_location("autoserialize_mod", script_path)
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
