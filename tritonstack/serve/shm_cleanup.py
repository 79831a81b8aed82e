"""Remove the shared-memory regions that killed Python backend stubs leave behind."""

from __future__ import annotations

import logging
import time
from pathlib import Path

LOGGER = logging.getLogger("tritonstack.serve")
SHM_DIR = Path("/dev/shm")


def remove_orphaned_stub_regions(min_age_s: float = 10.0) -> list[Path]:
    """Delete the Python backend's shared-memory regions that no process maps.

    Each stub's region (`/dev/shm/triton_<backend>_backend_shm_region_<uuid>`) is
    unlinked by a clean shutdown, but a stub or server that was killed leaves it
    behind, and /dev/shm is memory. A region still mapped by any live process
    (another server on this machine) is kept, and so is a very young one (a server
    starting right now may not have mapped it yet)."""
    regions = list(SHM_DIR.glob("triton_*_backend_shm_region_*"))
    if not regions:
        return []
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped.update(line.split()[-1] for line in maps.read_text().splitlines() if str(SHM_DIR) in line)
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    removed = []
    for region in regions:
        try:
            if str(region) not in mapped and time.time() - region.stat().st_mtime > min_age_s:
                region.unlink()
                removed.append(region)
        except FileNotFoundError:
            continue
    if removed:
        LOGGER.info("removed %d orphaned backend shared-memory region(s)", len(removed))
    return removed
