"""The launcher: loopback by default, clear start-up failures, no orphans."""

import ipaddress
import os
import signal
import time

import psutil
import pytest

from tritonstack.serve.launcher import ServerStartError, TritonServer


def group_processes(pgid):
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if process.status() != psutil.STATUS_ZOMBIE and os.getpgid(process.pid) == pgid:
                found.append(process)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return found


def test_stop_leaves_no_process_behind(model_repository):
    server = TritonServer(model_repository).start()
    pgid = server.process.pid
    running = group_processes(pgid)
    # tritonserver plus one Python backend stub per model instance (dali, onnxruntime)
    assert len(running) >= 3, [p.name() for p in running]
    assert server.stop() is not None
    deadline = time.monotonic() + 10
    while group_processes(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_processes(pgid) == []


def test_binds_loopback_by_default(server):
    listening = {
        conn.laddr.port: conn.laddr.ip
        for conn in psutil.Process(server.process.pid).net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN
    }
    for port in (server.http_port, server.grpc_port, server.metrics_port):
        address = ipaddress.ip_address(listening[port])
        # gRPC listens on the IPv4-mapped IPv6 form of 127.0.0.1: still loopback only.
        assert (getattr(address, "ipv4_mapped", None) or address) == ipaddress.ip_address("127.0.0.1")


def test_failed_start_shows_the_server_log(tmp_path):
    broken = tmp_path / "repository"
    (broken / "empty_model").mkdir(parents=True)  # a model folder without a config
    with pytest.raises(ServerStartError) as failure:
        TritonServer(broken, startup_timeout_s=60).start()
    assert "tritonserver exited" in str(failure.value)
    assert "empty_model" in str(failure.value)


def mapped_stub_regions(pgid):
    regions = set()
    for process in group_processes(pgid):
        with open(f"/proc/{process.pid}/maps") as maps:
            regions.update(line.split()[-1] for line in maps if "_backend_shm_region_" in line)
    return regions


def test_stop_after_a_crash_removes_the_stubs_shared_memory(model_repository):
    server = TritonServer(model_repository).start()
    regions = mapped_stub_regions(server.process.pid)
    assert regions, "the Python backend maps one /dev/shm region per stub"
    os.killpg(server.process.pid, signal.SIGKILL)  # a crash: nobody unlinks them
    server.process.wait()
    for region in regions:  # the launcher leaves young regions alone; age these
        os.utime(region, (time.time() - 60, time.time() - 60))
    server.stop()
    assert [region for region in regions if os.path.exists(region)] == []
