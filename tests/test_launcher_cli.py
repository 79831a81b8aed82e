"""`make serve`'s command line: starts on the ports it is given, locks the admin
APIs with the key from the environment, stops cleanly on SIGTERM, and leaves
nothing behind when it is SIGKILLed."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
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

from tests import repo_factory as rf
from tests.processes import assert_nothing_left
from tritonstack.build.presets import preset_named
from tritonstack.build.repository import write_repository
from tritonstack.client.classifier import ClassifierClient
from tritonstack.contract import ADMIN_HEADER, ADMIN_KEY_ENV
from tritonstack.samples.photos import photo_bytes
from tritonstack.serve.network import free_port, port_in_use


def wait_ready(
    cli: subprocess.Popen,
    client: httpclient.InferenceServerClient,
    timeout_s: float = 180,
    log_path: Path | None = None,
) -> None:
    """Triton answers ready; with `log_path`, the CLI has said so too (after what it does
    once the models are loaded: the layout, the objective, the warmup)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and cli.poll() is None:
        try:
            if client.is_server_ready() and (log_path is None or "ready: HTTP" in log_path.read_text()):
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


def start_cli(
    model_repository: Path, ports: list[int], log_path: Path, env: dict | None = None, options: tuple[str, ...] = ()
) -> subprocess.Popen:
    """`tritonstack serve` on (HTTP, gRPC, metrics) ports, its output appended to log_path."""
    command = [
        sys.executable,
        "-m",
        "tritonstack",
        "serve",
        "--model-repository",
        str(model_repository),
        "--http-port",
        str(ports[0]),
        "--grpc-port",
        str(ports[1]),
        "--metrics-port",
        str(ports[2]),
        *options,
    ]
    with open(log_path, "a") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def test_cli_serves_locked_down_and_stops_on_sigterm(lite0_repository, tmp_path):
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    env = dict(os.environ, **{ADMIN_KEY_ENV: "cli-test-key"})
    cli = start_cli(lite0_repository, [http_port, grpc_port, metrics_port], tmp_path / "cli.log", env)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    groups: set[int] = set()
    try:
        wait_ready(cli, client, log_path=tmp_path / "cli.log")
        groups = server_groups(cli)
        assert len(groups) == 1, groups  # tritonserver's own group, stubs inside
        with pytest.raises(InferenceServerException):
            client.get_model_repository_index()
        assert client.get_model_repository_index(headers={ADMIN_HEADER: "cli-test-key"})
        client.close()
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=60) == 0
        said = (tmp_path / "cli.log").read_text()
        assert "stopping" in said
        assert re.search(r"^\d+ cores \(affinity \d+, .*\); layout: dali ", said, re.MULTILINE), said[-2000:]
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


def _describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid} {process.status()} parent {process.ppid()}: {' '.join(process.cmdline())[:200]}"
    except psutil.NoSuchProcess:
        return f"{process.pid} gone"


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def three_backends_repository(tmp_path_factory) -> Path:
    """Lite0 behind DALI and behind Pillow: a stub of each backend (dali, onnxruntime,
    python) in five models, which start faster than the whole repository's."""
    out = tmp_path_factory.mktemp("three-backends")
    rf.seed_lite0_export(out)
    presets = tuple(preset_named(name) for name in ("dali_efficientnet_lite0", "python_efficientnet_lite0"))
    write_repository(out, presets=presets)
    return out


def test_sigkilled_cli_leaves_no_server_stub_or_port(three_backends_repository, tmp_path):
    """SIGKILL (the OOM killer, a CI timeout) gives the launcher no chance to stop
    anything: the server dies by PR_SET_PDEATHSIG, and its stubs with it."""
    ports = [free_port(), free_port(), free_port()]
    cli = start_cli(three_backends_repository, ports, tmp_path / "cli.log")
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
        # Each stub leaves once it sees its server gone, between requests; none waits on
        # the dead server (tritonstack.backends.server_watch).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (all(map(_gone, recorded)) and all(map(_port_free, ports))):
            time.sleep(0.1)
        assert [_describe(p) for p in recorded if not _gone(p)] == []
        assert [port for port in ports if not _port_free(port)] == []
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        for process in recorded:  # psutil checks the start time: never a reused pid
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def time_wait_ports(ports: list[int]) -> set[int]:
    """Which of `ports` hold a TIME_WAIT socket on their own (server) side."""
    return {
        conn.laddr.port
        for conn in psutil.net_connections(kind="tcp")
        if conn.status == psutil.CONN_TIME_WAIT and conn.laddr and conn.laddr.port in ports
    }


def test_port_probe_counts_a_listener_not_time_wait():
    """A stopped server's TIME_WAIT connections (about a minute) do not make its port
    "in use": tritonserver binds with SO_REUSEADDR and would get it. A listener does."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the server's side closes first: its port enters TIME_WAIT
            client.recv(1)
    assert port in time_wait_ports([port])
    assert not port_in_use("127.0.0.1", port)


def test_a_stopped_server_starts_again_at_once_on_its_ports(lite0_repository, tmp_path):
    """Stop `tritonstack serve` right after it answered clients over HTTP and gRPC,
    then start it again on the same ports: it serves, with no wait for TIME_WAIT."""
    ports = [free_port(), free_port(), free_port()]
    log_path = tmp_path / "cli.log"
    groups: set[int] = set()
    clis = []
    try:
        for run in (1, 2):
            # Triton waits for the clients' open HTTP connections until its exit timeout:
            # the shortest it takes, as nothing is in flight when it stops.
            clis.append(cli := start_cli(lite0_repository, ports, log_path, options=("--stop-grace-s", "1")))
            http = httpclient.InferenceServerClient(f"127.0.0.1:{ports[0]}")
            wait_ready(cli, http, timeout_s=180)
            groups |= server_groups(cli)
            (server,) = psutil.Process(cli.pid).children()
            assert "--exit-timeout-secs=1" in server.cmdline()
            with (
                ClassifierClient(f"127.0.0.1:{ports[0]}", "http") as over_http,
                ClassifierClient(f"127.0.0.1:{ports[1]}", "grpc") as over_grpc,
            ):
                for client in (over_http, over_grpc):
                    for _ in range(3):
                        assert client.classify([photo_bytes("coffee.png")], top_k=1)[0][0].label == "espresso"
                cli.send_signal(signal.SIGTERM)  # while the clients' connections are open
                assert cli.wait(timeout=60) == 0, f"run {run}: " + log_path.read_text()[-2000:]
            http.close()
            if run == 1:  # the case the probe must not mistake for a listener
                assert time_wait_ports(ports), "stopping left no TIME_WAIT: the test shows nothing"
    finally:
        for cli in clis:
            if cli.poll() is None:
                cli.kill()
            cli.wait()
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


def fresh_clone_repository(model_repository: Path, destination: Path) -> Path:
    """The repository as git checks it out: no build outputs, no empty folders."""
    shutil.copytree(model_repository, destination, ignore=shutil.ignore_patterns("model.onnx", ".*.fingerprint"))
    for version in destination.glob("*/[0-9]*"):
        if not any(version.iterdir()):
            version.rmdir()
    return destination


def test_cli_refuses_an_unbuilt_repository_in_one_line(model_repository, tmp_path):
    unbuilt = fresh_clone_repository(model_repository, tmp_path / "clone")
    command = [
        sys.executable,
        "-m",
        "tritonstack",
        "serve",
        "--model-repository",
        str(unbuilt),
        "--http-port",
        str(free_port()),
        "--grpc-port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "run `make build`" in lines[0] and "efficientnet_lite0" in lines[0], lines


def test_a_measured_server_is_started_as_the_serve_command_starts_it():
    """The benchmark, overload, loadtest and soak start their own server with
    server_config.as_served: every setting what `tritonstack serve` uses by default
    but the ports and the admin key (free and random there)."""
    from tritonstack.commands import serve
    from tritonstack.serve.server_config import as_served

    served = serve.serve_options(serve.parser().parse_args([])).config
    measured = as_served(served.model_repository)
    own = {"http_port", "grpc_port", "metrics_port", "admin_key"}
    differing = {
        field.name
        for field in dataclasses.fields(served)
        if getattr(served, field.name) != getattr(measured, field.name)
    }
    assert differing <= own
