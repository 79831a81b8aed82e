"""Run one tritonserver process, and nothing else: spawn it in a process group of
its own, wait for it to be ready, stop it, kill what is left of its group.

The group holds tritonserver and the Python backend stubs it spawns, so a stop
leaves no orphan; a watcher kills the group once the server is gone, however it
went. A launcher that is itself killed (SIGKILL, the OOM killer, a CI timeout)
cannot stop anything: the kernel does it instead, since tritonserver starts with
PR_SET_PDEATHSIG=SIGKILL (`setpriv --pdeathsig`, else `die_with_launcher`), and the
watcher then kills the stubs (tests/test_launcher_cli.py shows both). The signal
follows the *thread* that started the server: start it from a thread that outlives it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from tritonstack.serve.process_tree import group_processes

# How long a kill waits for the group's stubs to be gone: a killed stub maps its
# shared region until it is.
STUBS_EXIT_TIMEOUT_S = 10.0
READY_POLL_S = 0.2

# prctl(2) option numbers from <linux/prctl.h>; libc is loaded here, before any
# fork, so that the child only calls into it.
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class NotReady(RuntimeError):
    """The process exited, was stopped, or stayed unready past its time."""


def die_with_launcher(launcher_pid: int):
    """A preexec_fn: the child gets SIGKILL when the launcher (the thread that
    forked it) dies. If the launcher died already, between fork and prctl, the
    child exits at once instead of serving unowned."""

    def set_parent_death_signal() -> None:
        if _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != launcher_pid:
            os._exit(70)

    return set_parent_death_signal


def spawn(command: list[str], environment: dict[str, str], log_path: Path) -> subprocess.Popen:
    """Start `command` in a session of its own, its output appended to `log_path`.

    The parent-death signal is set by util-linux's `setpriv --pdeathsig` where it
    exists (it survives the exec of tritonserver): a Python preexec_fn forces a real
    fork(), whose atfork handlers can deadlock in a process that used gRPC (seen: the
    launcher hung in grpc's handler inside fork()); without one, Python spawns with
    vfork. `die_with_launcher` remains the fallback."""
    setpriv = shutil.which("setpriv")
    wrapped = [setpriv, "--pdeathsig", "KILL", "--", *command] if setpriv else command
    with open(log_path, "ab") as log:
        started = subprocess.Popen(
            wrapped,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,  # its own process group, stubs included
            preexec_fn=None if setpriv else die_with_launcher(os.getpid()),
        )
    watch_group(started)
    return started


def watch_group(process: subprocess.Popen) -> None:
    """A watcher in a session of its own, which outlives the launcher: once the
    server's process is gone (stopped, crashed, or killed by its parent-death signal
    when the launcher was SIGKILLed), it kills what is left of the server's group. A
    stub notices its server's death between requests only: one in the middle of a
    request waited for its dead server for minutes (seen after a SIGKILLed launcher
    while the warmup's requests ran). `tail --pid` waits without a process a poll."""
    # `&&`: a tail without --pid (not GNU coreutils) fails at once and kills nothing.
    script = f"tail --pid={process.pid} -f /dev/null && kill -KILL -{process.pid}"
    # Started in the background by a shell that exits at once: the watcher is no child
    # of the launcher (whose children are its server), and nobody needs to reap it.
    subprocess.run(
        ["sh", "-c", f"({script}) </dev/null >/dev/null 2>&1 &"],
        start_new_session=True,
        check=True,
    )


def wait_ready(
    process: subprocess.Popen, is_ready: Callable[[], bool], timeout_s: float, stopping: Callable[[], bool]
) -> None:
    """Return once `is_ready()`; NotReady when the process exits, `stopping()` turns
    true or `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stopping():
            raise NotReady("stopped while starting")
        if process.poll() is not None:
            raise NotReady(f"tritonserver exited with code {process.returncode} during start-up")
        if is_ready():
            return
        time.sleep(READY_POLL_S)
    raise NotReady(f"tritonserver not ready after {timeout_s:.0f} s")


def interrupt(process: subprocess.Popen, grace_s: float) -> bool:
    """SIGINT, then wait up to `grace_s` for it to exit; False if it did not."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            return False
    return True


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL a server's process group; return once the server is reaped and its
    stubs are gone (bounded)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()  # before the group's wait, which would reap it and lose its exit code
    psutil.wait_procs(group_processes(process.pid), timeout=STUBS_EXIT_TIMEOUT_S)
