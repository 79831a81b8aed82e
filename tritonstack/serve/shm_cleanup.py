"""Remove the shared-memory regions that killed Python backend stubs leave behind."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from tritonstack.contract import SHM_DIR

LOGGER = logging.getLogger("tritonstack.serve")


REGION_GLOB = "triton_*_backend_shm_region_*"


def mapped_regions(pids) -> set[str]:
    """The paths under /dev/shm that the processes `pids` map (those still alive)."""
    mapped = set()
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
        mapped.update(line.split()[-1] for line in lines if str(SHM_DIR) in line)
    return mapped


def remove_orphaned_stub_regions(min_age_s: float = 10.0, owned: frozenset[str] = frozenset()) -> list[Path]:
    """Delete the Python backend's shared-memory regions that no process maps.

    Each stub's region (`/dev/shm/triton_<backend>_backend_shm_region_<uuid>`) is
    unlinked by a clean shutdown, but a stub or server that was killed leaves it
    behind, and /dev/shm is memory. A region still mapped by any live process
    (another server on this machine) is kept, and so is a very young one (a server
    starting right now may not have mapped it yet) unless it is in `owned`: the
    regions our own server's processes mapped, whatever their age."""
    regions = list(SHM_DIR.glob(REGION_GLOB))
    if not regions:
        return []
    mapped = mapped_regions(int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    removed = []
    for region in regions:
        try:
            if str(region) in mapped:
                continue
            if str(region) in owned or time.time() - region.stat().st_mtime > min_age_s:
                region.unlink()
                removed.append(region)
        except FileNotFoundError:
            continue
    if removed:
        LOGGER.info("removed %d orphaned backend shared-memory region(s)", len(removed))
    return removed
