"""glibc's heap, as the backend asks it to give memory back."""

from __future__ import annotations

import ctypes

_LIBC = ctypes.CDLL(None)  # the C library this process runs on
# glibc only (None elsewhere: nothing to trim).
_MALLOC_TRIM = getattr(_LIBC, "malloc_trim", None)


def malloc_trim() -> None:
    """Pages freed inside glibc's heaps go back to the system now."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def pool_threshold_bytes(value: str) -> int:
    """DALI_MALLOC_POOL_THRESHOLD's value ("128k", "1M", "0") in bytes."""
    units = {"k": 1 << 10, "M": 1 << 20}
    return int(value[:-1]) * units[value[-1]] if value[-1:] in units else int(value or 0)
