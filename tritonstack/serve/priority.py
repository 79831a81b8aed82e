"""On a CPU, the steps nearer the answer run first, so that an overload queues at the front.

An ensemble's first step (decode and resize) is about a quarter of an image's CPU
time on this project's CPU stack, the classifier the rest. Left to the kernel's fair
share, the first step keeps up with any offered load and hands its work to the
classifier's queue, which grows without bound: every answer comes late, and the
first step spends CPU on images nobody will wait for. With the first steps' stubs
at a lower CPU priority (a higher nice value), they run when the classifier leaves a
core free: the backlog then waits before the first step, where its queue bound
(`tritonstack build --max-queue-size`) refuses the surplus at once, before any work.
Below capacity the cores are rarely both busy, and nothing changes.

The pacing (tritonstack.pacing, on by default) keeps the backlog at the front by
Triton's rate limiter instead, so `--front-nice` is 0 by default: it is for a server
run with `--no-pacing`.

The first steps are asked of the running server (each ensemble's config); a stub is
lowered thread by thread (a nice value belongs to a thread on Linux; threads the
stub starts later inherit it).
"""

from __future__ import annotations

import logging
import os

LOGGER = logging.getLogger("tritonstack.serve")


def front_steps(configs: list[dict]) -> set[str]:
    """The models that are the first step of a loaded ensemble: their inputs are all
    the ensemble's own inputs."""
    return set().union(*map(_first_steps, configs))


def _first_steps(config: dict) -> set[str]:
    if config.get("platform") != "ensemble":
        return set()
    inputs = {tensor["name"] for tensor in config.get("input", [])}
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    return {step["model_name"] for step in steps if set(step.get("input_map", {}).values()) <= inputs}


def lower_priority(pid: int, nice: int) -> bool:
    """Every thread of process `pid` at `nice`; False when the process is gone."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    for thread in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, int(thread), nice)
        except ProcessLookupError:
            continue  # a thread that just ended
        except PermissionError as error:
            LOGGER.warning("cannot lower the CPU priority of process %d: %s", pid, error)
            return False
    return True
