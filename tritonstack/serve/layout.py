"""A layout that follows the cores it gets (`tritonstack serve --layout cores`, the
command's default): the CPUs this process may use are read (its affinity and the
cgroup's CPU quota, as in a Kubernetes pod with a CPU limit), and each ensemble step
of our backends gets its instances and threads from them (`step_layouts`, the rule).
Like the latency objective (tritonstack.serve.queue_ceilings), the layout is applied
right after the server is ready, without writing the repository: each step whose
instance count or thread parameter differs is loaded again through Triton's
model-control API with its own config and the change (the launcher loads this and the
objective's overrides in one pass: a step both change is loaded once); the files stay
as they are.

On 1 and 2 cores the rule gives the committed repository's layout, so nothing is
reloaded there. The rule for more cores is reasoned, not measured:
docs/performance.md#thread-layout says why.

Left alone: models that are no ensemble's step, models of other backends, and a step
whose instances are not one group of KIND_CPU (a GPU's instances are the build's).
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

from tritonstack.objective import MIN_QUEUED_STEP_INSTANCES
from tritonstack.pacing import with_threads
from tritonstack.serve.loaded import differs, ensemble_steps

CORES_LAYOUT, REPOSITORY_LAYOUT = "cores", "repository"
LAYOUTS = (CORES_LAYOUT, REPOSITORY_LAYOUT)
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Our backends (tritonstack/backends, and Triton's Python backend running our Pillow
# step); the parameter each sizes its threads per instance with (python has none).
OUR_BACKENDS = ("dali", "onnxruntime", "python")
THREAD_PARAMETERS = {"dali": "num_threads", "onnxruntime": "intra_op_thread_count"}
# The backend of the later steps, whose instances hold a core a thread (tritonstack.pacing).
CLASSIFIER_BACKEND = "onnxruntime"
# More classifier stubs than batches in flight only hold memory (a model and an arena
# each): past this, further cores become ONNX Runtime threads within an instance.
MAX_CLASSIFIER_INSTANCES = 8
# DALI's CPU threads work on a batch's samples side by side, and the batches the
# dynamic batcher forms hold about the requests in flight: more threads would idle.
MAX_DALI_THREADS = 16
# Two classifier instances and two DALI threads at least, whatever the cores (step_layouts says why).
MIN_WORKERS = 2
# A Python step computes in one thread (the GIL): an instance is at most a core.
MAX_PYTHON_INSTANCES = 8


@dataclasses.dataclass(frozen=True)
class StepLayout:
    instances: int
    threads: int | None  # per instance; None: the backend has no thread parameter

    def describe(self) -> str:
        threads = "" if self.threads is None else f" x {self.threads} thread{'s' if self.threads > 1 else ''}"
        return f"{self.instances} instance{'s' if self.instances > 1 else ''}{threads}"


def step_layouts(cores: int) -> dict[str, StepLayout]:
    """The rule: each of our backends' ensemble steps on `cores` cores, by backend.
    The steps of an ensemble take turns on an image, so each is sized to use every
    core by itself: the classifier as one single-threaded instance a core (one thread
    spends less CPU per image than two), DALI as instances of a thread a core (a
    pipeline's threads work on one batch's samples side by side), the Pillow step,
    whose instances hold the GIL, on half the cores. Never fewer than two instances of
    a step (objective.MIN_QUEUED_STEP_INSTANCES: with one, Triton's batcher serves a
    backlog one batch per 500 ms tick when no request arrives; two of one thread each
    were slower per batch under overload than two of two on 2 cores: refusals' p99
    642 against 491 ms), nor fewer than two classifier instances: on one core, one of
    each served 0.98x [0.89, 1.01] the images/s of two, at 1.19x the p99 (a stub
    waiting on the server's copies leaves the core idle; docs/performance.md#thread-layout)."""
    if cores < 1:
        raise ValueError(f"a layout needs at least 1 core, not {cores}")
    workers = max(cores, MIN_WORKERS)
    classifiers = min(workers, MAX_CLASSIFIER_INSTANCES)
    return {
        "dali": StepLayout(MIN_QUEUED_STEP_INSTANCES, min(workers, MAX_DALI_THREADS)),
        "onnxruntime": StepLayout(classifiers, max(cores // classifiers, 1)),
        "python": StepLayout(min(max(cores // 2, MIN_QUEUED_STEP_INSTANCES), MAX_PYTHON_INSTANCES), None),
    }


def describe_layouts(layouts: dict[str, StepLayout]) -> str:
    return ", ".join(f"{backend} {layout.describe()}" for backend, layout in layouts.items())


# --- the cores this process may use ---


@dataclasses.dataclass(frozen=True)
class Cores:
    affinity: int  # the CPUs the scheduler may run this process on
    quota: float | None  # the cgroup's CPU quota in cores; None: no limit

    @property
    def usable(self) -> int:
        """A quota of 1.5 cores keeps 2 cores busy part of the time: rounded up."""
        return self.affinity if self.quota is None else max(1, min(self.affinity, math.ceil(self.quota)))

    def describe(self) -> str:
        quota = "no cgroup CPU quota" if self.quota is None else f"cgroup CPU quota {self.quota:g}"
        return f"{self.usable} cores (affinity {self.affinity}, {quota})"


def read_cores(cgroup_root: Path = CGROUP_ROOT) -> Cores:
    return Cores(len(os.sched_getaffinity(0)), cgroup_cpu_quota(cgroup_root))


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota in cores of the cgroup mounted at `root` (a container's own, in
    its cgroup namespace): v2's cpu.max ("max 100000" or "150000 100000"), else v1's
    cpu.cfs_quota_us over cpu.cfs_period_us (-1: none). None: no quota, or none readable."""
    try:
        if (root / "cpu.max").is_file():
            quota, period = (root / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        for folder in (root / "cpu", root / "cpu,cpuacct"):
            if (folder / "cpu.cfs_quota_us").is_file():
                quota_us = int((folder / "cpu.cfs_quota_us").read_text())
                return None if quota_us < 0 else quota_us / int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None  # an unreadable quota limits nothing we can know of
    return None


# --- applied to a running server ---


def sizable(config: dict) -> bool:
    """A step of our backends whose instances are one group on the CPU."""
    groups = config.get("instance_group", [])
    backend = config.get("backend")
    return backend in OUR_BACKENDS and len(groups) == 1 and groups[0].get("kind") == "KIND_CPU"


def with_layout(config: dict, layout: StepLayout) -> dict:
    """`config` with `layout`'s instance count and, where its backend has one, thread
    parameter; a classifier's instances then hold the slots of their threads (tritonstack.pacing)."""
    group = config["instance_group"][0] | {"count": layout.instances}
    changed = config | {"instance_group": [group]}
    parameter = THREAD_PARAMETERS.get(config["backend"])
    if parameter is not None and layout.threads is not None:
        parameters = dict(config.get("parameters", {}))
        parameters[parameter] = {"string_value": str(layout.threads)}
        changed["parameters"] = parameters
        if config["backend"] == CLASSIFIER_BACKEND:
            changed["instance_group"] = [with_threads(group, layout.threads)]
    return changed


def overridden(configs: list[dict], layouts: dict[str, StepLayout]) -> list[dict]:
    """The ensemble steps whose config changes under `layouts`, with the change."""
    steps = ensemble_steps(configs)
    sized = [config for config in configs if config["name"] in steps and sizable(config)]
    changed = [with_layout(config, layouts[config["backend"]]) for config in sized]
    return [new for new, old in zip(changed, sized) if differs(new, old)]
