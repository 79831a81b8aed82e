"""Whether /dev/shm holds what the repository's stubs will ask for, said before start.

Each instance of a Python-based backend (our `dali` and `onnxruntime`, Triton's
`python`) runs a stub that asks Triton for a shared-memory region of its own
(STUB_REGION_BYTES, tritonstack.backends.settings). Docker gives a container 64 MB of
/dev/shm by default: run there, every stub of the repository failed to load ("Unable
to initialize shared memory key ... use --shm-size") and nothing said why up front.
The launcher counts the stubs of the models it will load (their instance groups, or
the layout's where that is larger) plus the largest model's again (a replacement
starts the new stubs before the old ones stop) and refuses in one line when /dev/shm
has less free.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tritonstack.backends.settings import SHM_DIR, STUB_REGION_BYTES
from tritonstack.repository_files import CONFIG_FILENAME, DALI_FOLDER_SUFFIX, ConfigError, read_config

STUB_BACKENDS = ("dali", "onnxruntime", "python")


def stubs_by_model(repository: Path, models: tuple[str, ...] = (), instances_at_least: dict[str, int] | None = None):
    """Model -> the stubs it runs, for `models` (and the steps of those that are
    ensembles; () : every model folder). `instances_at_least`: per backend, the count a
    layout raises a step to."""
    configs = {}
    for folder in sorted(path for path in repository.iterdir() if path.is_dir()):
        try:
            configs[folder.name] = read_config(folder) if (folder / CONFIG_FILENAME).is_file() else None
        except ConfigError:
            configs[folder.name] = None  # Triton says what is wrong with it
    wanted = set(models) or set(configs)
    for name in list(wanted):
        config = configs.get(name)
        if config is not None and config.platform == "ensemble":
            wanted |= {step.model_name for step in config.ensemble_scheduling.step}
    stubs = {}
    for name in sorted(wanted & set(configs)):
        config = configs[name]
        if config is None:  # auto-completed: one instance
            stubs[name] = 1 if name.endswith(DALI_FOLDER_SUFFIX) else 0
        elif config.backend in STUB_BACKENDS:
            count = sum(group.count or 1 for group in config.instance_group) or 1
            stubs[name] = max(count, (instances_at_least or {}).get(config.backend, 0))
    return {name: count for name, count in stubs.items() if count}


def shm_shortfall(stubs: dict[str, int], shm_dir: Path = SHM_DIR) -> str | None:
    """One line saying what to set when `shm_dir` has too little free; None when it fits."""
    if not stubs:
        return None
    needed = (sum(stubs.values()) + max(stubs.values())) * STUB_REGION_BYTES
    try:
        free = shutil.disk_usage(shm_dir).free
    except OSError:
        return None  # no /dev/shm to measure: Triton says what it finds
    if free >= needed:
        return None
    mib = needed >> 20
    return (
        f"{shm_dir} has {free >> 20} MiB free, and the {sum(stubs.values())} backend stubs of the models to load "
        f"need {mib} MiB ({STUB_REGION_BYTES >> 20} MiB each, and room to replace one model): run the container "
        f"with --shm-size={_round_up_mib(mib)}m (Kubernetes: a memory-backed emptyDir at /dev/shm, as the chart "
        "mounts), or load fewer models (--models NAME...)"
    )


def _round_up_mib(mib: int, step: int = 256) -> int:
    return -(-mib // step) * step
