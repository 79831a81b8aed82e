"""What a server spends: the CPU time and memory of tritonserver and its backend
stubs, whole and by process role (a load loop's CPU accounting reads them)."""

from __future__ import annotations

from tritonstack.serve import process_tree


def server_cpu_seconds(server) -> float:
    """CPU time of tritonserver and its backend stubs so far."""
    return process_tree.tree_cpu_seconds(server.pid)


def server_rss_mb_by_process(server) -> dict[str, float] | None:
    """RSS of tritonserver and of each model's stub, by role (what a model costs)."""
    if server.pid is None:
        return None
    sizes = {
        name: process_tree.rss_mib(process) for name, process in process_tree.processes_by_role(server.pid).items()
    }
    return {name: size for name, size in sizes.items() if size is not None}


def server_rss_mb(server) -> float | None:
    return process_tree.tree_rss_mib(server.pid)
