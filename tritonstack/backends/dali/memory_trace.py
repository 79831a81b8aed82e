"""Memory diagnostics for the memory probe (tritonstack.diagnostics.memory_probe):
imported by the backend only when $TRITONSTACK_MEMORY_TRACE names a file."""

from __future__ import annotations

import ctypes
import json
import os
import tracemalloc
from pathlib import Path

_LIBC = ctypes.CDLL(None)  # the C library this process runs on (mallinfo2)


class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (glibc >= 2.33): totals over all arenas.
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


class MemoryTrace:
    """With $TRITONSTACK_MEMORY_TRACE naming a file: Python's traced allocations
    (tracemalloc) and glibc's heap (mallinfo2) written there after every batch, so
    that a probe outside the stub can tell live objects from allocator slack. Off by
    default: tracing slows every allocation."""

    TOP_EVERY = 200  # batches between tracemalloc snapshots (they are slow)

    def __init__(self, path: str):
        self.path = Path(path)
        self.batches = 0
        self._first_snapshot = None
        self._top: list[str] = []
        self._mallinfo2 = getattr(_LIBC, "mallinfo2", None)
        if self._mallinfo2 is not None:
            self._mallinfo2.restype = _MallInfo2
        tracemalloc.start()

    def after_batch(self) -> None:
        self.batches += 1
        current, peak = tracemalloc.get_traced_memory()
        figures = {"batches": self.batches, "traced_bytes": current, "traced_peak_bytes": peak}
        if self._mallinfo2 is not None:
            info = self._mallinfo2()
            figures["mallinfo2"] = {name: getattr(info, name) for name, _ in info._fields_}
        if self.batches % self.TOP_EVERY == 0:
            snapshot = tracemalloc.take_snapshot()
            if self._first_snapshot is None:
                self._first_snapshot = snapshot
            self._top = [str(stat) for stat in snapshot.compare_to(self._first_snapshot, "lineno")[:8]]
        figures["top_growth_since_first_snapshot"] = self._top
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(figures))
        os.replace(partial, self.path)  # the probe never reads half a file
