"""`make serve`'s command line: starts on the ports it is given, locks the admin
APIs with the key from the environment, stops cleanly on SIGTERM, and leaves
nothing behind when it is SIGKILLed."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.processes import assert_nothing_left
from tritonstack.contract import ADMIN_HEADER, ADMIN_KEY_ENV
from tritonstack.serve.network import free_port


def wait_ready(cli: subprocess.Popen, client: httpclient.InferenceServerClient, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and cli.poll() is None:
        try:
            if client.is_server_ready():
                return
        except (InferenceServerException, OSError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"the CLI's server is not ready (exit code {cli.poll()})")


def server_groups(cli: subprocess.Popen) -> set[int]:
    """Process groups of the CLI's children: tritonserver runs in its own session."""
    try:
        return {os.getpgid(child.pid) for child in psutil.Process(cli.pid).children()}
    except (psutil.NoSuchProcess, ProcessLookupError):
        return set()


def test_cli_serves_locked_down_and_stops_on_sigterm(model_repository, tmp_path):
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    command = [sys.executable, "-m", "tritonstack.serve", "--model-repository", str(model_repository),
               "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)]
    env = dict(os.environ, **{ADMIN_KEY_ENV: "cli-test-key"})
    with open(tmp_path / "cli.log", "w") as log:
        cli = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    groups: set[int] = set()
    try:
        wait_ready(cli, client)
        groups = server_groups(cli)
        assert len(groups) == 1, groups  # tritonserver's own group, stubs inside
        with pytest.raises(InferenceServerException):
            client.get_model_repository_index()
        assert client.get_model_repository_index(headers={ADMIN_HEADER: "cli-test-key"})
        client.close()
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=60) == 0
        assert "stopping" in (tmp_path / "cli.log").read_text()
        for pgid in groups:
            assert_nothing_left(pgid, (http_port, grpc_port, metrics_port))
    finally:
        groups |= server_groups(cli)
        if cli.poll() is None:
            cli.kill()
        cli.wait()
        for pgid in groups:  # whatever failed above, the server does not outlive the test
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass




def _gone(process: psutil.Process) -> bool:
    """Exited: no such process, or a zombie waiting for a reaper (it holds no
    port and no memory)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_sigkilled_cli_leaves_no_server_stub_or_port(model_repository, tmp_path):
    """SIGKILL (the OOM killer, a CI timeout) gives the launcher no chance to stop
    anything: the server dies by PR_SET_PDEATHSIG, and its stubs with it."""
    ports = [free_port(), free_port(), free_port()]
    command = [sys.executable, "-m", "tritonstack.serve", "--model-repository", str(model_repository),
               "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
    with open(tmp_path / "cli.log", "w") as log:
        cli = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{ports[0]}")
    recorded: list[psutil.Process] = []
    try:
        wait_ready(cli, client)
        client.close()
        (server,) = psutil.Process(cli.pid).children()
        recorded = [server, *server.children()]
        # tritonserver plus a stub per model instance (dali, onnxruntime, python backends)
        assert len(recorded) >= 4, [p.name() for p in recorded]
        cli.kill()
        cli.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (all(map(_gone, recorded)) and all(map(_port_free, ports))):
            time.sleep(0.1)
        assert [p.pid for p in recorded if not _gone(p)] == []
        assert [port for port in ports if not _port_free(port)] == []
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        for process in recorded:  # psutil checks the start time: never a reused pid
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def fresh_clone_repository(model_repository: Path, destination: Path) -> Path:
    """The repository as git checks it out: no build outputs, no empty folders."""
    shutil.copytree(model_repository, destination, ignore=shutil.ignore_patterns("model.onnx", ".*.fingerprint"))
    for version in destination.glob("*/[0-9]*"):
        if not any(version.iterdir()):
            version.rmdir()
    return destination


def test_cli_refuses_an_unbuilt_repository_in_one_line(model_repository, tmp_path):
    unbuilt = fresh_clone_repository(model_repository, tmp_path / "clone")
    command = [sys.executable, "-m", "tritonstack.serve", "--model-repository", str(unbuilt),
               "--http-port", str(free_port()), "--grpc-port", str(free_port()), "--metrics-port", str(free_port())]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "run `make build`" in lines[0] and "efficientnet_lite0" in lines[0], lines
