"""The package as a user installs it: not editable, from the wheels `make install`
saved (no network), into a fresh venv. Its `tritonstack` command checks and serves a
model repository from a folder that is not the checkout, with the backends found
inside the installed package, and classifies a photo through it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from tests.conftest import PROJECT_ROOT
from tests.test_launcher_cli import server_groups, wait_ready
from tests.test_layout import wheelhouse
from tritonstack.samples.photos import photo_path
from tritonstack.serve.network import free_port
from tritonstack.serve.process import die_with_launcher


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with `<checkout>[serve,client]` installed as a wheel; its bin/."""
    if not any(wheelhouse().glob("nvidia_dali*.whl")):
        pytest.fail(f"no serve wheels in {wheelhouse()}: run `make install`")
    env_dir = tmp_path_factory.mktemp("installed") / "venv"
    # No pip of its own (ensurepip would add seconds to every run): this venv's pip
    # installs into it, as `pip --python` does for a user. --no-compile: no bytecode for
    # the ~1.4 GB of packages up front (a third of the install's time); Python compiles
    # what the commands import when they import it, as it would have.
    venv.create(env_dir, with_pip=False)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(env_dir / "bin" / "python"),
            "install",
            "--quiet",
            "--no-compile",
            "--no-index",
            "--find-links",
            str(wheelhouse()),
            "-c",
            str(PROJECT_ROOT / "constraints.txt"),
            f"{PROJECT_ROOT}[serve,client]",
        ],
        check=True,
        env=user_environment(),
        cwd=env_dir.parent,
        timeout=600,
    )
    return env_dir / "bin"


def user_environment() -> dict[str, str]:
    """This process's environment less what would let the checkout leak in."""
    return {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PIP_CONSTRAINT", "VIRTUAL_ENV", "TRITONSTACK_MODEL_REPOSITORY")
    }


def test_the_install_is_a_copy_not_the_checkout(installed, tmp_path):
    where = subprocess.run(
        [str(installed / "python"), "-c", "import tritonstack; print(tritonstack.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=user_environment(),
    )
    assert Path(where.stdout.strip()).is_relative_to(installed.parent), where.stdout
    assert not Path(where.stdout.strip()).is_relative_to(PROJECT_ROOT), where.stdout


def run_installed(installed: Path, *args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """The installed `tritonstack` command, run as a user runs it from `cwd`."""
    return subprocess.run(
        [str(installed / "tritonstack"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=user_environment(),
        timeout=timeout,
    )


def start_installed_serve(installed: Path, repository: Path, http_port: int, cwd: Path, log_path: Path):
    """`tritonstack serve` from the install, on free ports; returns (process, grpc port)."""
    grpc_port, metrics_port = free_port(), free_port()
    command = [
        str(installed / "tritonstack"),
        "serve",
        "--model-repository",
        str(repository),
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(metrics_port),
    ]
    with open(log_path, "w") as log:
        # Dies with this test process, and its server with it (the launcher's rule).
        cli = subprocess.Popen(
            command,
            cwd=cwd,
            env=user_environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_launcher(os.getpid()),
        )
    return cli, grpc_port


def stop_installed_serve(cli: subprocess.Popen, groups: set[int]) -> None:
    """Stop the command, then kill its server's process groups: whatever failed, the
    server does not outlive the test."""
    groups |= server_groups(cli)
    if cli.poll() is None:
        cli.terminate()
        try:
            cli.wait(timeout=60)
        except subprocess.TimeoutExpired:
            cli.kill()
    for pgid in groups:
        try:
            os.killpg(pgid, 9)
        except ProcessLookupError:
            pass


@pytest.mark.timeout(600)
def test_installed_command_checks_serves_and_classifies(installed, lite0_repository, tmp_path):
    repository = shutil.copytree(lite0_repository, tmp_path / "models")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    check = run_installed(installed, "check", str(repository), cwd=elsewhere, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr

    http_port = free_port()
    cli, grpc_port = start_installed_serve(installed, repository, http_port, elsewhere, tmp_path / "serve.log")
    groups: set[int] = set()
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        wait_ready(cli, client)
        groups = server_groups(cli)
        classified = run_installed(
            installed,
            "classify",
            "--url",
            f"grpc://127.0.0.1:{grpc_port}",
            "--format",
            "jsonl",
            str(photo_path("coffee.png")),
            cwd=elsewhere,
            timeout=120,
        )
        assert classified.returncode == 0, classified.stderr
        (line,) = classified.stdout.splitlines()
        assert json.loads(line)["top"][0]["label"] == "espresso", line
        client.close()
    finally:
        stop_installed_serve(cli, groups)
    assert not list(elsewhere.iterdir()), "serving wrote into the folder it ran in"
    assert sys.prefix != str(installed.parent)
