"""What the launcher tells our backends, as one object: `BackendSettings`, written into
tritonserver's environment (which the stubs it spawns inherit) and read back by each
backend at load.

Triton gives a Python-based backend neither its model's location at auto-complete
nor the C++ dali backend's --backend-config, and Triton 2.51 has no request-size
flag: the environment is the one channel left. Clients never import this module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

# Named beside the decode budget: its copy beside the Pillow model reads it without this package.
from tritonstack.media.decode_budget import STUB_MEMORY_ENV

# The variables, one per field of BackendSettings; their names and values are what
# a tritonserver started without the launcher (the Helm chart's) may set by hand.
REPOSITORY_ENV = "TRITONSTACK_MODEL_REPOSITORY"
MAX_INPUT_BYTES_ENV = "TRITONSTACK_MAX_INPUT_BYTES"
# Triton's own --http-max-input-size default in the releases that have that flag.
DEFAULT_MAX_INPUT_BYTES = 64 * 1024 * 1024
MEMORY_TRACE_ENV = "TRITONSTACK_MEMORY_TRACE"
# DALI reads this one itself: the threshold between malloc and its host pool (docs/memory.md).
DALI_HOST_POOL_ENV = "DALI_MALLOC_POOL_THRESHOLD"
DALI_HOST_POOL_THRESHOLD = "128k"  # the launcher's, unless its environment sets one (stub_defaults)
MALLOC_TRIM_ENV = "TRITONSTACK_MALLOC_TRIM_EVERY"
DEFAULT_MALLOC_TRIM_EVERY = 0  # off unless the launcher is asked for compact memory
POOL_RESIDENCY_ENV = "TRITONSTACK_POOL_RESIDENCY"
DALI_BACKEND_CONFIG_ENV = "TRITONSTACK_DALI_BACKEND_CONFIG"
# Each stub's shared region with tritonserver (the Python backend's
# shm-default-byte-size), sized for a full batch of 32 from the start: the backend's own
# default grows it a MiB at a time, each growth a new mapping of the whole file
# (docs/memory.md). A file in /dev/shm: untouched pages cost nothing.
STUB_REGION_SETTING = "shm-default-byte-size"
# Where shm_open puts the stubs' regions (the launcher cleans up after dead stubs there;
# the dali backend finds its own there).
SHM_DIR = Path("/dev/shm")
STUB_REGION_BYTES = 32 << 20


@dataclass(frozen=True)
class BackendSettings:
    """Everything the launcher tells the backends. A field at its default is not
    written: an absent variable means the default, so a tritonserver started by hand
    runs the same backends."""

    # Where auto-complete reads model files (Triton does not tell a Python backend).
    repository: Path | None = None
    # The largest input tensor a backend accepts, in bytes.
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES
    # Each stub's memory ceiling, which the decode budgets derive from; None: a quarter
    # of the machine's memory (tritonstack/media/decode_budget.py).
    stub_memory_bytes: int | None = None
    # The dali entries of tritonserver's --backend-config flags (plugin_libs,
    # release_after_unload): Triton hands a Python-based backend only the python ones.
    dali_backend_config: Mapping[str, str] = field(default_factory=dict, hash=False)
    # DALI's malloc/pool threshold; None: DALI's own default, a pool.
    dali_host_pool_threshold: str | None = None
    # glibc's malloc_trim(0) after every N batches, handing the heap's free pages back;
    # 0: never (docs/memory.md).
    malloc_trim_every: int = DEFAULT_MALLOC_TRIM_EVERY
    # DALI's pool pages counted when reserved (tritonstack/backends/residency.py);
    # False: when a batch first writes them.
    pool_residency: bool = True
    # A file the dali backend writes its memory figures to after every batch
    # (tritonstack/diagnostics/memory_probe.py); tracing slows every allocation.
    memory_trace: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> BackendSettings:
        stub_memory = environ.get(STUB_MEMORY_ENV)
        return cls(
            repository=Path(environ[REPOSITORY_ENV]) if environ.get(REPOSITORY_ENV) else None,
            max_input_bytes=int(environ.get(MAX_INPUT_BYTES_ENV) or DEFAULT_MAX_INPUT_BYTES),
            stub_memory_bytes=int(stub_memory) if stub_memory else None,
            dali_backend_config=json.loads(environ.get(DALI_BACKEND_CONFIG_ENV) or "{}"),
            dali_host_pool_threshold=environ.get(DALI_HOST_POOL_ENV),
            malloc_trim_every=int(environ.get(MALLOC_TRIM_ENV) or DEFAULT_MALLOC_TRIM_EVERY),
            pool_residency=environ.get(POOL_RESIDENCY_ENV) != "0",
            memory_trace=environ.get(MEMORY_TRACE_ENV) or None,
        )

    @classmethod
    def of_this_process(cls) -> BackendSettings:
        """What the launcher told this stub: the one place the backends read it."""
        return cls.from_environ(os.environ)

    def to_environ(self) -> dict[str, str]:
        """The variables of the fields not at their default."""
        defaults = BackendSettings()._variables()
        return {name: value for name, value in self._variables().items() if value not in (None, defaults[name])}

    def _variables(self) -> dict[str, str | None]:
        return {
            REPOSITORY_ENV: str(self.repository) if self.repository else None,
            MAX_INPUT_BYTES_ENV: str(self.max_input_bytes),
            STUB_MEMORY_ENV: str(self.stub_memory_bytes) if self.stub_memory_bytes is not None else None,
            DALI_BACKEND_CONFIG_ENV: json.dumps(dict(self.dali_backend_config)) if self.dali_backend_config else None,
            DALI_HOST_POOL_ENV: self.dali_host_pool_threshold,
            MALLOC_TRIM_ENV: str(self.malloc_trim_every),
            POOL_RESIDENCY_ENV: "1" if self.pool_residency else "0",
            MEMORY_TRACE_ENV: self.memory_trace,
        }


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


# Every variable BackendSettings reads: the launcher writes these from the object only.
VARIABLES = tuple(BackendSettings()._variables())


def stub_defaults() -> dict[str, str]:
    """Settings the launcher gives the stubs unless its environment sets them."""
    return BackendSettings(dali_host_pool_threshold=DALI_HOST_POOL_THRESHOLD).to_environ()
