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
# tritonserver reserved 8.6 GiB of address space (110 MB resident) with every preset of
# the default repository loaded: under the earlier 8 GiB floor it died of SIGSEGV at
# start-up in a container whose memory limit made half of it less.
SERVER_FLOOR = 16 * GiB


# Where a container's own cgroup is mounted (in its cgroup namespace).
CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as a page-rounded 2**63 - 1.
NO_LIMIT_ABOVE = 1 << 60


def physical_memory_bytes(cgroup_root: Path = CGROUP_ROOT) -> int:
    """The machine's memory, or the container's memory limit where that is lower (a
    Docker --memory, a Kubernetes pod's limit: /proc/meminfo shows the host's)."""
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = cgroup_memory_limit(cgroup_root)
    return min(machine, limit) if limit else machine


def cgroup_memory_limit(root: Path = CGROUP_ROOT) -> int | None:
    """v2's memory.max, else v1's memory.limit_in_bytes; None: no limit, or none readable."""
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max" or not text.isdigit() or int(text) >= NO_LIMIT_ABOVE:
            return None
        return int(text)
    return None


def memory_share_bytes(limits: "MemoryLimits") -> int:
    """What one stub may count on using, for the backends' decode budgets: a quarter of
    the memory (the container's where it has a limit), never above its ceiling. The
    ceiling itself keeps its floor (address space counts reservations); the share does
    not, so a 2 GiB container decodes at most what 512 MiB holds at a time."""
    return min(limits.stub_bytes, physical_memory_bytes() // 4)


@dataclass(frozen=True)
class MemoryLimits:
    """Address-space ceilings; the command line's defaults are default()'s."""

    server_bytes: int = cli.option(
        cli.REQUIRED,
        "--server-memory-bytes",
        type=int,
        help="tritonserver's address-space ceiling (default: half the machine's memory, >= 16 GiB)",
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
        return cls(server_bytes=max(SERVER_FLOOR, memory // 2), stub_bytes=max(4 * GiB, memory // 4))


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
