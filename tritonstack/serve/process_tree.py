"""A running tritonserver's processes, the one place that knows them: the server,
its Python backend stubs (one per model instance), and what they cost (RSS, its
parts, CPU time, and a sampler of them over time). The launcher, its supervisor, the load test, the benchmark, the
soak and the memory probe all ask here."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil

STUB_NAME = "triton_python_backend_stub"


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants (tritonserver and its backend stubs)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def group_processes(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of a process group: a server started in a
    session of its own and every stub it forked, even one whose parent has died."""
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return found


def server_stubs(server_pid: int) -> tuple[dict[int, str], set[int]]:
    """The Python backend stubs of a server: live ones (pid -> model name) and dead
    ones. The backend reaps a stub it stops; one that died on its own stays a zombie."""
    live, dead = {}, set()
    for child in psutil.Process(server_pid).children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                dead.add(child.pid)
            elif child.name().startswith(STUB_NAME[:15]):  # Linux may truncate names
                # argv[1] is the model file: <repository>/<model>/<version>/<file>
                live[child.pid] = Path(child.cmdline()[1]).parent.parent.name
        except (psutil.NoSuchProcess, psutil.ZombieProcess, IndexError):
            continue
    return live, dead


def processes_by_role(server_pid: int) -> dict[str, psutil.Process]:
    """tritonserver and its live backend stubs, named by role ("tritonserver",
    "stub:<model>", "stub:<model>:<pid>" for a model's further instances)."""
    processes = {"tritonserver": psutil.Process(server_pid)}
    live, _ = server_stubs(server_pid)
    for pid, model in sorted(live.items()):
        processes[f"stub:{model}" if f"stub:{model}" not in processes else f"stub:{model}:{pid}"] = psutil.Process(pid)
    return processes


def cpu_seconds_by_model(server_pid: int | None) -> dict[str, float]:
    """CPU time (user + system) so far of tritonserver ("tritonserver") and of each
    model's live stubs, its instances added up (the model's name)."""
    if server_pid is None:
        return {}
    totals: dict[str, float] = {}
    try:
        live, _ = server_stubs(server_pid)
        processes = [
            ("tritonserver", psutil.Process(server_pid)),
            *((model, psutil.Process(pid)) for pid, model in live.items()),
        ]
    except psutil.NoSuchProcess:
        return {}
    for name, process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        totals[name] = totals.get(name, 0.0) + times.user + times.system
    return totals


def rss_mib(process: psutil.Process) -> float | None:
    """Resident memory in MiB; None once the process is gone."""
    try:
        return process.memory_info().rss / 2**20
    except psutil.NoSuchProcess:
        return None


def rss_parts_mib(pid: int) -> dict[str, float]:
    """RSS split by kind (Linux): anonymous (the heap), file-backed (libraries),
    shared memory (the Python backend's /dev/shm region, mapped by the server and
    by each stub: its pages touched count in both)."""
    parts = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile", "RssShmem"):
            parts[key] = round(int(value.split()[0]) / 1024, 2)
    return parts


def tree_rss_mib(pid: int | None) -> float | None:
    """Resident memory of a server and all its descendants, in MiB."""
    sizes = [size for size in map(rss_mib, process_tree(pid)) if size is not None] if pid else []
    return sum(sizes) if sizes else None


def tree_cpu_seconds(pid: int | None) -> float:
    """CPU time (user + system) of a server and its descendants so far, the exited ones
    included: a zombie's own times, and a reaped one's in its parent's record of its
    waited-for children. A stub that exits mid-measure keeps its CPU seconds in the sum."""
    total = 0.0
    for process in process_tree(pid) if pid else []:
        try:
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
        except psutil.NoSuchProcess:
            pass
    return total


# The role of the CPU that cpu_seconds_by_model's roles do not hold over a span: processes
# that exited within it (their last seconds are known only to the tree's sum) and any
# descendant that is no stub.
REST = "rest"


def cpu_by_role_between(before: dict[str, float], after: dict[str, float], tree_s: float) -> dict[str, float]:
    """Each role's CPU seconds between two readings of cpu_seconds_by_model (a role
    that appeared in between: all of its own), and REST: the tree's CPU over the same
    span (`tree_s`, from tree_cpu_seconds) less theirs, when above a tick's rounding."""
    spans = {name: after[name] - before.get(name, 0.0) for name in after}
    rest = tree_s - sum(spans.values())
    return spans | ({REST: rest} if rest > CPU_TICK_S else {})


# /proc's CPU times are in clock ticks; readings of several processes taken one after
# the other differ by a few.
CPU_TICK_S = 0.05


def thread_cpu_seconds() -> dict[int, float]:
    """CPU time (user + system) so far of each live thread of this process, by native id."""
    return {thread.id: thread.user_time + thread.system_time for thread in psutil.Process().threads()}


def own_cpu_seconds() -> float:
    """CPU time (user + system) of this process so far, its exited threads included."""
    times = psutil.Process().cpu_times()
    return times.user + times.system


def cpu_seconds_without(
    process_s: float, threads_before: dict[int, float], threads_after: dict[int, float], excluded: set[int]
) -> float:
    """This process's CPU over a span (`process_s`) less what the `excluded` threads
    spent in it (threads_* from thread_cpu_seconds): what the other threads did. An
    excluded thread gone by the end keeps its last reading; one gone before the span
    spent nothing in it."""
    spent = sum(
        threads_after.get(tid, threads_before[tid]) - threads_before[tid] for tid in excluded & threads_before.keys()
    )
    return process_s - spent


# The memory criterion of both soaks (tritonstack soak, tritonstack overload --soak): a
# server process's RSS may grow by less than this over the judged part of a run.
MAX_GROWTH_PCT = 2.0


class ResourceSampler(threading.Thread):
    """RSS (MiB) and open file descriptors of the server's processes, every period."""

    def __init__(self, server_pid: int, period_s: float = 1.0):
        super().__init__(name="resource-sampler", daemon=True)
        self.server_pid = server_pid
        self.period_s = period_s
        self.samples: list[dict] = []
        self._stopping = threading.Event()
        self._t0 = time.monotonic()

    def sample(self) -> None:
        row = {"t_s": round(time.monotonic() - self._t0, 2), "rss_mib": {}, "fds": {}, "anon_mib": {}, "shmem_mib": {}}
        for name, process in processes_by_role(self.server_pid).items():
            try:
                row["rss_mib"][name] = round(process.memory_info().rss / 2**20, 2)
                row["fds"][name] = process.num_fds()
                parts = rss_parts_mib(process.pid)
                row["anon_mib"][name], row["shmem_mib"][name] = parts["RssAnon"], parts["RssShmem"]
            except (psutil.NoSuchProcess, FileNotFoundError, KeyError):
                continue
        self.samples.append(row)

    def run(self) -> None:
        while not self._stopping.is_set():
            self.sample()
            self._stopping.wait(self.period_s)

    def stop(self) -> list[dict]:
        self._stopping.set()
        self.join(timeout=10)
        self.sample()
        return self.samples
