"""Read tritonserver's log: its end, and the lines that say why it failed."""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path

_ERROR_LINE = re.compile(r"E\d{4} |error: ")
# Logged on every machine without a GPU; not the reason for a failure.
_HARMLESS = ("CudaDriverHelper has not been initialized",)


def tail(log_path: Path | None, lines: int = 40) -> str:
    if log_path is None or not log_path.exists():
        return "(no log)"
    with open(log_path, errors="replace") as log:
        return "".join(deque(log, maxlen=lines))


def errors(log_path: Path | None) -> str:
    """The log's error lines (model load failures among them) and its end."""
    if log_path is None or not log_path.exists():
        return "(no log)"
    found = [
        line
        for line in log_path.read_text(errors="replace").splitlines(keepends=True)
        if (_ERROR_LINE.match(line) or "UNAVAILABLE" in line) and not any(h in line for h in _HARMLESS)
    ]
    return "".join(found) + "...\n" + tail(log_path, lines=5)
