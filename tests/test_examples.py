"""The example clients users copy, each run as a script against the real server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CLIENTS = Path(__file__).resolve().parent.parent / "clients"


def run_example(name: str, *args: str, env: dict | None = None) -> str:
    done = subprocess.run(
        [sys.executable, str(CLIENTS / name), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_sync_http(server):
    out = run_example("example_http.py", "--url", server.http_url)
    assert "coffee.png             espresso (0.954)" in out
    assert len(out.splitlines()) == 5


def test_asyncio_grpc_many_in_flight(server):
    out = run_example("example_grpc_asyncio.py", "--url", server.grpc_url, "--requests", "30", "--in-flight", "10")
    assert out.startswith("30 requests, 10 in flight:")
    assert "6 x espresso" in out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_system_shared_memory(server, protocol):
    url = server.http_url if protocol == "http" else server.grpc_url
    out = run_example(
        "example_shared_memory.py",
        "--url",
        url,
        "--protocol",
        protocol,
        env={"TRITONSTACK_ADMIN_KEY": server.admin_key},
    )
    assert "probabilities (5, 1000) read from shared memory" in out
    assert "espresso (0.954)" in out
    assert "regions registered while in use: 2" in out
    assert out.rstrip().endswith("regions registered after close: 0")
