"""What the launcher tells our backends, through the environment of tritonserver
and the stubs it spawns: where the repository is, input-size and memory settings.

Triton gives a Python-based backend neither its model's location at auto-complete
nor the C++ dali backend's --backend-config, and Triton 2.51 has no request-size
flag: the launcher exports them here. Clients never import this module.
"""

from __future__ import annotations

from pathlib import Path

# Triton does not give a Python backend's auto-complete the model's location, and
# Triton 2.51 has no request-size flag: the launcher exports both.
REPOSITORY_ENV = "TRITONSTACK_MODEL_REPOSITORY"
# Largest input tensor a backend accepts, in bytes; the default is Triton's own
# --http-max-input-size default in the releases that have that flag.
MAX_INPUT_BYTES_ENV = "TRITONSTACK_MAX_INPUT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 64 * 1024 * 1024
# Diagnostics for tritonstack/diagnostics/memory_probe.py: a file path; the dali backend then
# traces Python allocations and writes its memory figures there after every batch.
MEMORY_TRACE_ENV = "TRITONSTACK_MEMORY_TRACE"
# DALI's threshold between malloc and its own host memory pool (docs/memory.md): the
# dali backend's default, which the stub's environment may override.
DALI_HOST_POOL_ENV = "DALI_MALLOC_POOL_THRESHOLD"
DALI_HOST_POOL_THRESHOLD = "128k"
# The dali backend calls glibc's malloc_trim(0) after every N batches, N from here
# (default 0: never; --compact-memory: 1): it hands the heap's free pages back (docs/memory.md).
MALLOC_TRIM_ENV = "TRITONSTACK_MALLOC_TRIM_EVERY"
DEFAULT_MALLOC_TRIM_EVERY = 0  # off unless the launcher is asked for compact memory
# "0" turns off the dali backend's pool residency (tritonstack/backends/residency.py):
# DALI's pool pages are then counted when a batch first writes them, not when reserved.
POOL_RESIDENCY_ENV = "TRITONSTACK_POOL_RESIDENCY"
# Each stub's shared region with tritonserver (the Python backend's
# shm-default-byte-size; its own default is 1 MiB, grown 1 MiB at a time, each growth a
# new mapping of the whole file): sized for a full batch of 32 from the start (outputs
# of 3x224x224 float32, 0.57 MiB each, and the encoded photos in), so that ordinary
# traffic does not grow it. A file in /dev/shm: untouched pages cost nothing.
STUB_REGION_SETTING = "shm-default-byte-size"
# Where shm_open puts the stubs' regions (the launcher cleans up after dead stubs there;
# the dali backend finds its own there).
SHM_DIR = Path("/dev/shm")
STUB_REGION_BYTES = 32 << 20
# `tritonserver --backend-config=dali,plugin_libs=a.so:b.so` reaches NVIDIA's C++ dali
# backend (src/parameters.h: plugin_libs, release_after_unload); Triton hands a
# Python-based backend only the python backend's settings, so the launcher passes
# the dali entries of its tritonserver flags to the stubs here, as JSON.
DALI_BACKEND_CONFIG_ENV = "TRITONSTACK_DALI_BACKEND_CONFIG"


def backend_config(args: list[str] | tuple[str, ...], backend: str) -> dict[str, str]:
    """`backend`'s settings among tritonserver flags: --backend-config=<backend>,<key>=<value>
    (or the value as the next argument), the last of a key winning, as in tritonserver."""
    values = [arg.split("=", 1)[1] for arg in args if arg.startswith("--backend-config=")]
    values += [value for flag, value in zip(args, args[1:]) if flag == "--backend-config"]
    settings = {}
    for value in values:
        name, _, setting = value.partition(",")
        key, equals, setting_value = setting.partition("=")
        if name == backend and equals:
            settings[key] = setting_value
    return settings


def stub_defaults() -> dict[str, str]:
    """Settings the launcher gives the stubs unless its environment sets them."""
    return {DALI_HOST_POOL_ENV: DALI_HOST_POOL_THRESHOLD}
