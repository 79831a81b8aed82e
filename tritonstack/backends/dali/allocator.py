"""The stub's host memory: glibc's heap, as the backend asks it to give memory back,
and DALI's host pool, reserved ahead when the model asks."""

from __future__ import annotations

import ctypes

import numpy as np
import nvidia.dali.tensors as dali_tensors

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


def reserve_host_pool(n_bytes: int) -> None:
    """One block of n_bytes in DALI's host pool, now. The pool reserves blocks that
    double in size as demand first rises, each the size of all before it, and keeps
    them: a batch larger than any before reserves a new block however late it comes
    (docs/memory.md). A block reserved at load serves every run that fits in it.
    A TensorList built from host arrays copies them into a buffer DALI allocates
    (from the pool, above DALI_MALLOC_POOL_THRESHOLD); freed, the block stays."""
    dali_tensors.TensorListCPU([np.zeros(n_bytes, dtype=np.uint8)])
