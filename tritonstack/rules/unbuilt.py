"""A repository the build has not written yet: one line saying so, for the
launcher, `tritonstack check`, the benchmark and the soak alike."""

from __future__ import annotations

import re
from pathlib import Path

from tritonstack.repository_files import CONFIG_FILENAME, MODEL_FILES, version_dirs
from tritonstack.rules.common import invalid_filename

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


# --- names that reach a shell ---------------------------------------------------------------


# Triton 2.51's Python backend starts each stub with `bash -c "exec <stub> <model path> ..."`,
# the model path being <repository>/<model folder>/<version>/<default_model_filename>:
# a quote there stalls the load for good, and `$(...)` runs as a command (seen here).
# Every model of ours is a Python-backend stub, so such names are refused before the
# server starts, with the C++ dali backend's rule for file names.
def shell_unsafe_reason(repository: Path) -> str | None:
    """One line naming the first model folder or default_model_filename of a local
    repository that would reach the stub launcher's shell, else None."""
    for model_dir in sorted(Path(repository).iterdir()):
        if not model_dir.is_dir():
            continue
        names = [("folder name", model_dir.name)]
        config_path = model_dir / CONFIG_FILENAME
        if config_path.is_file():
            found = re.search(
                _TOP_LEVEL_FIELD.format("default_model_filename"), config_path.read_text(errors="replace"), re.MULTILINE
            )
            names += [("default_model_filename", found.group(1))] if found else []
        for what, name in names:
            problem = invalid_filename(name)
            if problem:
                return (
                    f"{repository}: model {model_dir.name!r}: its {what} {name!r} is refused: "
                    f"{problem.splitlines()[0]} (allowed: a-z A-Z 0-9 _ . -); Triton's Python backend "
                    "passes model paths through a shell when it starts a stub, so the server was not started"
                )
    return None
