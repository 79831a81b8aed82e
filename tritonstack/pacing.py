"""Pacing: a first step's batch starts only on a core the classifiers leave free.

    step_slots(first_step=False, threads=1)   # 2: a classifier thread holds a core
    server_flags(cores=2)                     # ["--rate-limit=execution_count", "--rate-limit-resource=cpu_slots:4"]

Triton's rate limiter (`--rate-limit=execution_count`) hands an instance its next batch
only once the resources its config lists are free, and frees them when the batch ends.
Every ensemble step on the CPU that the latency objective bounds lists one global
resource, CPU_SLOTS (`tritonstack build` writes it): a later step's instance (the
classifier) holds SLOTS_PER_CORE per thread, a first step's instance FIRST_STEP_SLOTS.
`tritonstack serve` starts tritonserver with SLOTS_PER_CORE slots per core. So while the
classifiers keep every core busy no first-step batch starts, and once one classifier
instance idles two can.

Why: under overload the first step's queue is where requests are refused, and Triton
2.51 refuses an expired request only when that step's batcher forms its next batch,
once one of its instances is free (tritonstack.objective). Run beside classifiers that
held both cores, the first step's batches stalled, and with them the refusals; they
also kept the classifier's queue full, whose refusals come after the first step's work.
Paced, a first-step batch waits for a free core before it starts (at most one
classifier batch), then runs on it: refusals come sooner and no work is wasted, for a
little capacity and a longer tail at half the load (the runs:
docs/performance.md#overload-figures).

Without `--rate-limit` (plain `tritonserver`, the NGC container) Triton ignores the
slots. A GPU's instances list none: the card, not the cores, runs them.
"""

from __future__ import annotations

from pathlib import Path

from tritonstack.repository_files import CONFIG_FILENAME, ConfigError, read_config

CPU_SLOTS = "cpu_slots"
SLOTS_PER_CORE = 2
FIRST_STEP_SLOTS = 1
RATE_LIMIT_FLAG = "--rate-limit"


def step_slots(first_step: bool, threads: int = 1) -> int:
    """The slots one instance of a step holds while it runs a batch."""
    return FIRST_STEP_SLOTS if first_step else SLOTS_PER_CORE * max(threads, 1)


def pool_slots(cores: int, largest_claim: int = 0) -> int:
    """The slots tritonserver is started with: SLOTS_PER_CORE per core, and never fewer
    than one instance claims (Triton would refuse to load that model)."""
    return max(SLOTS_PER_CORE * max(cores, 1), largest_claim)


def server_flags(cores: int, largest_claim: int = 0) -> list[str]:
    return [
        f"{RATE_LIMIT_FLAG}=execution_count",
        f"--rate-limit-resource={CPU_SLOTS}:{pool_slots(cores, largest_claim)}",
    ]


def with_threads(group: dict, threads: int) -> dict:
    """A later step's instance group (Triton's JSON form) holding the slots of `threads`
    threads; a group that lists no slots stays as it is."""
    limiter = group.get("rate_limiter")
    if not limiter or not any(resource.get("name") == CPU_SLOTS for resource in limiter.get("resources", [])):
        return group
    resources = [
        resource | {"count": step_slots(False, threads)} if resource.get("name") == CPU_SLOTS else resource
        for resource in limiter["resources"]
    ]
    return group | {"rate_limiter": limiter | {"resources": resources}}


def largest_local_claim(repository: Path) -> int:
    """The most slots any instance of a local repository's models holds (a config that
    does not parse claims none here: Triton reports it when it loads the model)."""
    claims = [0]
    for path in Path(repository).glob(f"*/{CONFIG_FILENAME}"):
        try:
            config = read_config(path.parent)
        except (ConfigError, OSError, UnicodeDecodeError):
            continue
        claims += [
            resource.count
            for group in config.instance_group
            for resource in group.rate_limiter.resources
            if resource.name == CPU_SLOTS
        ]
    return max(claims)
