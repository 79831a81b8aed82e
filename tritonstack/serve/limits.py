"""Memory ceilings for tritonserver and each backend stub, so that one model's
runaway is that model's failure, never the machine's.

The ceiling is RLIMIT_AS (address space), set with prlimit on the running process:
it needs no privilege to lower, works in any container, and is per process, so
every stub has its own. cgroup v2 would bound resident memory instead, but needs a
delegated hierarchy with the memory controller: on this project's machines the
unified (v2) hierarchy has no controllers (memory is on cgroup v1, a hybrid layout),
so it is not used. What happens at the ceiling: an allocation fails. In the DALI
stub, DALI raises std::bad_alloc and that request gets an error (tested); a stub
that dies of it instead is reloaded by the stub supervisor; a tritonserver that
aborts on it (not tried) is started again by the restarter.

The server's ceiling is set right after it is spawned (before it starts any stub:
stubs inherit it); each stub's, lower, is set by the stub supervisor when it first
sees the stub, and is exported to the backends ($TRITONSTACK_STUB_MEMORY_BYTES) as
the memory share their decode budgets derive from. Address space counts reserved,
not only used, memory (tritonserver and a DALI stub reserve gigabytes idle: thread
stacks, pools), hence the floors below.

A process that opens a GPU is given no ceiling: CUDA reserves address space for the
card's memory and its own mappings, so on an H100 a KIND_GPU DALI stub under the
default quarter of the machine (32 GiB) failed its first 588 KiB allocation. On a
machine with NVIDIA devices, tritonserver (which opens them) and the stubs of KIND_GPU
instances run without one; the stubs of KIND_CPU instances keep theirs.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from tritonstack import cli

LOGGER = logging.getLogger("tritonstack.serve")
GiB = 1 << 30


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class MemoryLimits:
    """Address-space ceilings; the command line's defaults are default()'s."""

    server_bytes: int = cli.option(
        cli.REQUIRED,
        "--server-memory-bytes",
        type=int,
        help="tritonserver's address-space ceiling (default: half the machine's memory, >= 8 GiB)",
    )
    stub_bytes: int = cli.option(
        cli.REQUIRED,
        "--stub-memory-bytes",
        type=int,
        help="each backend stub's ceiling, and its decode budgets' share "
        "(default: a quarter of the machine's memory, >= 4 GiB)",
    )

    @classmethod
    def default(cls) -> "MemoryLimits":
        """Half the machine's memory for the server, a quarter for each stub, with
        floors above what they reserve when idle."""
        memory = physical_memory_bytes()
        return cls(server_bytes=max(8 * GiB, memory // 2), stub_bytes=max(4 * GiB, memory // 4))


def has_nvidia_devices(dev: Path = Path("/dev")) -> bool:
    """Whether this machine shows NVIDIA GPUs (/dev/nvidia0, /dev/nvidia1, ...), which
    tritonserver opens at start."""
    return any(path.name.removeprefix("nvidia").isdigit() for path in dev.glob("nvidia[0-9]*"))


def gpu_models(configs: list[dict]) -> set[str]:
    """The loaded models with KIND_GPU instances: their stubs open the card."""
    return {
        config["name"]
        for config in configs
        if any(group.get("kind") == "KIND_GPU" for group in config.get("instance_group", []))
    }


def limit_address_space(pid: int, limit_bytes: int) -> bool:
    """Lower a process's RLIMIT_AS (soft and hard) to limit_bytes; False when the
    process is gone."""
    try:
        process = psutil.Process(pid)
        _, hard = process.rlimit(psutil.RLIMIT_AS)
        limit = limit_bytes if hard == psutil.RLIM_INFINITY else min(limit_bytes, hard)
        process.rlimit(psutil.RLIMIT_AS, (limit, limit))
        return True
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except (psutil.AccessDenied, OSError) as error:
        LOGGER.warning("cannot limit the memory of process %d: %s", pid, error)
        return False
