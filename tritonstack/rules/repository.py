"""A repository the build has not written yet: one line saying so, for the
launcher, `tritonstack check`, the benchmark and the soak alike."""

from __future__ import annotations

import re
from pathlib import Path

from tritonstack.contract import CONFIG_FILENAME, MODEL_FILES, version_dirs

# --- a repository the build has not written yet ------------------------------------------

# A fresh clone cannot be served: model.onnx files are build outputs, and git keeps
# no empty version folder (an ensemble's `1/`). The launcher and `check` both say so
# in one line, instead of a server log full of load errors.
BUILD_FIX = "run `make build` (or build_pipelines.py build): model files are build outputs"
_TOP_LEVEL_FIELD = r'^\s*{}\s*:\s*"([^"]*)"'


def unbuilt_models(repository: Path) -> list[str]:
    """The models of `repository` that cannot load for want of files: a config but
    no numeric version folder, or version folders without any file the model's
    backend reads (model.onnx, model.dali or dali.py, model.py). A model naming its
    own `default_model_filename` is left to the backend."""
    unbuilt = []
    for model_dir in sorted(Path(repository).iterdir()):
        config_path = model_dir / CONFIG_FILENAME
        if not config_path.is_file():
            continue  # not a model, or a `<name>.dali` folder: judged at load
        text = config_path.read_text(errors="replace")
        if re.search(_TOP_LEVEL_FIELD.format("default_model_filename"), text, re.MULTILINE):
            continue
        backend = re.search(_TOP_LEVEL_FIELD.format("backend"), text, re.MULTILINE)
        expected = MODEL_FILES.get(backend.group(1) if backend else "", ())
        versions = version_dirs(model_dir)
        if not versions or (expected and not any((v / f).exists() for v in versions for f in expected)):
            unbuilt.append(model_dir.name)
    return unbuilt


def unbuilt_message(repository: Path, models: list[str]) -> str:
    """One line for an unbuilt repository."""
    shown = ", ".join(models[:3]) + (f" and {len(models) - 3} more" if len(models) > 3 else "")
    return f"{repository}: not built, {shown} without model files: {BUILD_FIX}"


def unservable_reason(repository: Path) -> str | None:
    """One line saying why a local repository cannot be served yet (no such folder,
    or not built), else None: the launcher, check, the benchmark and the soak say it
    alike."""
    if not Path(repository).is_dir():
        return f"{repository}: no such folder ({BUILD_FIX})"
    unbuilt = unbuilt_models(repository)
    return unbuilt_message(repository, unbuilt) if unbuilt else None
