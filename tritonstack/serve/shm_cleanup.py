"""Remove the shared-memory regions that killed Python backend stubs leave behind."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from tritonstack.backends.settings import SHM_DIR

LOGGER = logging.getLogger("tritonstack.serve")


REGION_GLOB = "triton_*_backend_shm_region_*"


def stub_regions() -> set[Path]:
    """The Python backend stubs' regions in /dev/shm now, whoever made them."""
    return set(SHM_DIR.glob(REGION_GLOB))


def held_regions(pids) -> set[Path]:
    """The paths under /dev/shm that the processes `pids` (those still alive) map
    or hold open (a region's creator holds it open before it maps it)."""
    held = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
            opened = _open_paths(pid)
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
        held.update(Path(line.split()[-1]) for line in maps if str(SHM_DIR) in line)
        held.update(Path(path) for path in opened if path.startswith(f"{SHM_DIR}/"))
    return held


def _open_paths(pid: int) -> set[str]:
    paths = set()
    for descriptor in Path(f"/proc/{pid}/fd").iterdir():
        try:
            paths.add(str(descriptor.readlink()))
        except OSError:  # closed meanwhile
            continue
    return paths


def remove_orphaned_stub_regions(min_age_s: float = 10.0, existing_before: set[Path] | None = None) -> list[Path]:
    """Delete the Python backend's shared-memory regions that no process holds.

    Each stub's region (`/dev/shm/triton_<backend>_backend_shm_region_<uuid>`) is
    unlinked by a clean shutdown, but a stub or server that was killed leaves it
    behind, and /dev/shm is memory. A region still held by any live process
    (another server on this machine) is kept, and so is a very young one (a server
    starting right now may be creating it, or a process we may not read holds it)
    unless it was not among `existing_before`, the regions there when our own
    server started: one that appeared since and that nobody holds is an orphan of
    ours (or of a server that crashed meanwhile), however young; a server killed
    while it loads models leaves regions it created a moment before."""
    regions = stub_regions()
    if not regions:
        return []
    held = held_regions(int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    removed = []
    for region in regions:
        try:
            if region in held:
                continue
            new_since_start = existing_before is not None and region not in existing_before
            if new_since_start or time.time() - region.stat().st_mtime > min_age_s:
                region.unlink()
                removed.append(region)
        except (FileNotFoundError, PermissionError):  # gone meanwhile, or another user's
            continue
    if removed:
        LOGGER.info("removed %d orphaned backend shared-memory region(s)", len(removed))
    return removed
