"""What every load-time rule shares: a Problem (where, what, what to do), the
error that refuses a model with its problems, and the reading of a config's
batching, the file names a config may give.

The rules themselves, one module per backend: `rules.dali` (config vs DALI
pipeline, auto-complete), `rules.onnxruntime` (config vs ONNX graph, parameters,
auto-complete), `rules.repository` (a repository not built yet). The backends apply
them when Triton loads a model; `tritonstack check` applies the same functions
offline. Change a rule there and both change.

Configs are Triton's JSON form of config.pbtxt, as a backend receives it
(`data_type: "TYPE_FP32"`, `dims: [3, 224, 224]`); the checker converts its parsed
protobuf to that form (`repository_files.config_dict`). Each rule returns Problems; none raises.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a model: where, what, and what to do."""

    model: str
    field: str  # the config field, e.g. "input", "output.data_type", "instance_group"
    tensor: str
    message: str
    fix: str
    # The C++ backend's own words for it, which clients written for that backend
    # compare (dali_backend qa/L0_config_validation): the server's error carries them.
    cpp_text: str = ""

    def __str__(self) -> str:
        where = f"{self.field} {self.tensor!r}" if self.tensor else self.field
        return f"{self.model}: {where}: {self.message}; {self.fix}"


class LoadError(ValueError):
    """A model the backend refuses to load: every problem, one per line."""

    def __init__(self, problems: list[Problem]):
        super().__init__(
            "\n".join(str(problem) + (f"\n{problem.cpp_text}" if problem.cpp_text else "") for problem in problems)
        )
        self.problems = problems


def raise_problems(problems: list[Problem]) -> None:
    if problems:
        raise LoadError(problems)


def dims_of(tensor: dict) -> list[int]:
    # Triton's JSON gives ints; protobuf's JSON gives int64 as strings.
    return [int(d) for d in tensor.get("dims", [])]


def is_batched(config: dict) -> bool:
    return int(config.get("max_batch_size", 0)) > 0


# A tensor whose type the config leaves out: Triton's JSON says "" or TYPE_INVALID.
MISSING_TYPES = ("", "TYPE_INVALID")
_STATED_MAX_BATCH_SIZE = re.compile(r"^\s*max_batch_size\s*:\s*(-?\d+)", re.MULTILINE)


def stated_max_batch_size(config_text: str | None) -> int | None:
    """max_batch_size as config.pbtxt states it; None when it does not (or there is
    no config.pbtxt): Triton's JSON says 0 either way (dali_model.h ReadMBSFromPBtxt)."""
    found = _STATED_MAX_BATCH_SIZE.search(config_text or "")
    return int(found.group(1)) if found else None


# --- file names a config may give ------------------------------------------------------------
#
# The C++ dali backend refuses a default_model_filename (and a model path) with any other
# character before it touches a file (src/utils/utils.h: ValidateFilename,
# ValidateAbsPath): it builds a command line from them. Triton 2.51's Python backend
# builds one too, for the stub of every Python-based model: with a quote or a space
# in the name the stub never starts and the load hangs. Refused alike everywhere.
_FILENAME_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")


def invalid_filename(name: str) -> str | None:
    """The C++ backend's refusal of a model file name, or None when it is allowed."""
    bad = next((char for char in name if char not in _FILENAME_CHARS), None)
    if bad is None:
        return None
    return (
        f"Model file name '{name}' contains an invalid character: '{bad}'\n"
        "Allowed characters are: a-z, A-Z, 0-9, _, ., -"
    )


def invalid_path(path: str) -> str | None:
    """The C++ backend's refusal of a model file's absolute path, or None."""
    bad = next((char for char in path if char not in _FILENAME_CHARS | {"/"}), None)
    if bad is not None:
        return (
            f"File path '{path}' contains an invalid character: '{bad}'\n"
            "Allowed characters are: a-z, A-Z, 0-9, _, ., -, /"
        )
    if ".." in path:
        return f"Invalid '..' sequence found in model path: '{path}'"
    return None
