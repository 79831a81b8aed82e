"""`make serve`'s command line: starts on the ports it is given, locks the admin
APIs with the key from the environment, and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

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
