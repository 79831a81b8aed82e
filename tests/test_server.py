"""The launcher: loopback by default, clear start-up failures, no orphans. Every
server a test starts here is stopped in a `finally`, whatever fails first."""

import ipaddress
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.processes import assert_nothing_left, wait_for
from tritonstack import pacing
from tritonstack.serve.launcher import ServerStartError, TritonServer
from tritonstack.serve.layout import read_cores
from tritonstack.serve.process_tree import group_processes, processes_by_role
from tritonstack.serve.server_config import ServerConfig
from tritonstack.serve.shm_cleanup import REGION_GLOB, held_regions
from tritonstack.serve.supervision import Supervision

STUB = "triton_python_backend_stub"


def ports_of(server):
    return (server.config.http_port, server.config.grpc_port, server.config.metrics_port)


def test_stop_leaves_no_process_stub_or_port_behind(lite0_repository):
    server = TritonServer(lite0_repository).start()
    try:
        pgid = server.process.pid
        names = [process.name() for process in group_processes(pgid)]
        # tritonserver plus one Python backend stub per model instance (dali, onnxruntime)
        assert names.count("tritonserver") == 1 and names.count(STUB) >= 2, names
        exit_code = server.stop()
    finally:
        server.stop()
    assert exit_code == 0, f"SIGINT should end tritonserver cleanly, got {exit_code}"
    assert_nothing_left(pgid, ports_of(server))


def test_stop_kills_a_server_that_ignores_sigint(lite0_repository):
    """A frozen server (SIGSTOP: SIGINT stays pending) is killed, group and all,
    after the grace period."""
    server = TritonServer(ServerConfig(lite0_repository, stop_grace_s=1)).start()
    try:
        pgid = server.process.pid
        assert any(process.name() == STUB for process in group_processes(pgid))
        os.kill(server.process.pid, signal.SIGSTOP)
        started = time.monotonic()
        exit_code = server.stop()
        waited = time.monotonic() - started
    finally:
        server.stop()
    assert exit_code == -signal.SIGKILL, exit_code
    assert waited >= 1, "stop() must give SIGINT its grace period before SIGKILL"
    assert_nothing_left(pgid, ports_of(server))


def test_binds_loopback_by_default(server):
    listening = {
        conn.laddr.port: conn.laddr.ip
        for conn in psutil.Process(server.process.pid).net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN
    }
    for port in (server.config.http_port, server.config.grpc_port, server.config.metrics_port):
        address = ipaddress.ip_address(listening[port])
        # gRPC listens on the IPv4-mapped IPv6 form of 127.0.0.1: still loopback only.
        assert (getattr(address, "ipv4_mapped", None) or address) == ipaddress.ip_address("127.0.0.1")


def test_failed_start_shows_the_server_log(tmp_path):
    broken = tmp_path / "repository"
    (broken / "empty_model").mkdir(parents=True)  # a model folder without a config
    with pytest.raises(ServerStartError) as failure:
        TritonServer(ServerConfig(broken), startup_timeout_s=60).start()
    assert "tritonserver exited" in str(failure.value)
    assert "empty_model" in str(failure.value)


def held_stub_regions(pgid) -> set[Path]:
    return {
        region for region in held_regions(process.pid for process in group_processes(pgid)) if region.match(REGION_GLOB)
    }


class RegionsHeld:
    """Every stub region the server's process group holds, polled from a thread every
    20 ms while it runs, across relaunches (`server.process` changes): the regions the
    launcher must remove at stop. A region a stub maps for its life, from before the
    stub starts, is seen many times over. Regions new in /dev/shm are not judged
    wholesale: another test worker's server may have just been killed, its regions not
    yet removed by its own launcher."""

    def __init__(self, server: TritonServer):
        self.server = server
        self.regions: set[Path] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._done.wait(0.02):
            if self.server.process is not None:
                self.regions |= held_stub_regions(self.server.process.pid)

    def __enter__(self) -> "RegionsHeld":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._done.set()
        self._thread.join()

    def left(self) -> list[Path]:
        return sorted(region for region in self.regions if region.exists())


def test_stop_after_a_crash_removes_the_stubs_shared_memory(lite0_repository):
    server = TritonServer(lite0_repository).start()
    with RegionsHeld(server) as held:
        try:
            regions = held_stub_regions(server.process.pid)
            assert regions, "the Python backend maps one /dev/shm region per stub"
            crashed = group_processes(server.process.pid)
            os.killpg(server.process.pid, signal.SIGKILL)  # a crash: nobody unlinks them
            server.process.wait()
            # Until the last stub is gone it maps its region, and a mapped region is kept.
            _, alive = psutil.wait_procs(crashed, timeout=30)
            assert alive == [], alive
        finally:
            server.stop()
    # Young as they are (a region of another server's may be young too), the
    # launcher saw its own server hold these: they are removed.
    assert [region for region in regions if os.path.exists(region)] == []
    # Nor those of the server the launcher started again after the crash.
    assert held.left() == []
    assert_nothing_left(server.process.pid, ports_of(server))


def test_stop_while_a_restart_loads_leaves_no_shared_memory(lite0_repository):
    """Stopped while the server started again after a crash is still starting its
    stubs: the regions it had just created are removed too."""
    server = TritonServer(lite0_repository).start()
    with RegionsHeld(server) as held:
        try:
            crashed = server.process
            os.killpg(crashed.pid, signal.SIGKILL)
            crashed.wait()
            wait_for(
                lambda: server.process is not crashed and STUB in names_in_group(server.process.pid),
                timeout_s=60,
                interval_s=0.02,
                what="the restarted server's first stub",
            )
            # The restarted server's first stub holds its region.
            wait_for(lambda: held_stub_regions(server.process.pid), timeout_s=30, interval_s=0.02, what="its region")
        finally:
            server.stop()
    assert held.left() == []
    assert_nothing_left(server.process.pid, ports_of(server))


def test_a_server_killed_while_it_starts_is_started_again(lite0_repository):
    """A tritonserver killed by a signal before it is ready (as a native crash while
    its stubs start would) is launched once more, and the start succeeds."""
    server = TritonServer(lite0_repository)
    killed = []

    def kill_the_first_once_spawned() -> None:
        wait_for(lambda: server.process is not None, timeout_s=60, interval_s=0.01, what="tritonserver spawned")
        killed.append(server.process)
        os.killpg(server.process.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_first_once_spawned)
    killer.start()
    try:
        server.start()
        killer.join()
        assert killed and server.process is not killed[0] and killed[0].returncode == -signal.SIGKILL
        assert server.is_ready()
    finally:
        killer.join()
        server.stop()
    assert_nothing_left(server.process.pid, ports_of(server))


def names_in_group(pgid: int) -> list[str]:
    names = []
    for process in group_processes(pgid):
        try:
            names.append(process.name())
        except psutil.NoSuchProcess:
            continue
    return names


def test_the_first_steps_wait_for_the_classifiers_cores(lite0_repository):
    """Under overload the backlog waits before the ensemble's first step, where it is
    refused (docs/reliability.md#overload): tritonserver runs Triton's rate limiter with
    the slots of the cores (tritonstack.pacing), and `--front-nice` runs the first step's
    stubs at a lower CPU priority."""
    with TritonServer(lite0_repository, Supervision(front_nice=19)) as server:
        command_line = psutil.Process(server.process.pid).cmdline()
        nice = {name: process.nice() for name, process in processes_by_role(server.process.pid).items()}
        front = server.supervision.front_nice
    pool = pacing.pool_slots(read_cores().usable, largest_claim=2)  # the classifier's instances hold 2 each
    assert "--rate-limit=execution_count" in command_line, command_line
    assert f"--rate-limit-resource=cpu_slots:{pool}" in command_line, command_line
    first = {role: value for role, value in nice.items() if role.startswith("stub:preprocess_dali_efficientnet_lite0")}
    others = {role: value for role, value in nice.items() if role not in first}
    assert front == 19 and len(first) == 2 and set(first.values()) == {front}, nice  # each of its instances
    assert set(others.values()) == {psutil.Process().nice()}, (
        nice
    )  # tritonserver and the classifier's stubs: as started
