"""The Kubernetes chart as tests see it: the real helm binary (`make tools`)
renders it; a rendered tritonserver container can be run here as its pod would
run it. Shared by test_helm_chart.py and test_s3_repository.py."""

from __future__ import annotations

import base64
import functools
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import PROJECT_ROOT
from tritonstack.serve.install import TritonInstall
from tritonstack.serve.network import LOOPBACK, free_port
from tritonstack.serve.shm_cleanup import remove_orphaned_stub_regions

CHART = PROJECT_ROOT / "deploy" / "helm" / "image-classifier"
HELM = Path(sys.executable).parent / "helm"  # where `make tools` puts it
RELEASE = "clf"
_KUBELET_VARIABLE = re.compile(r"\$\((\w+)\)")


def helm(*args: str) -> subprocess.CompletedProcess:
    if not HELM.is_file():
        pytest.fail(f"{HELM} is missing: run `make tools`")
    done = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


@functools.cache  # callers only read the objects
def render(mode: str, *sets: str) -> list[dict]:
    args = ["template", RELEASE, str(CHART), "-f", str(CHART / f"values-{mode}.yaml")]
    for setting in sets:
        args += ["--set", setting]
    return [doc for doc in yaml.safe_load_all(helm(*args).stdout) if doc]


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def one_container(workload: dict) -> dict:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


def triton_container(objects: list[dict]) -> dict:
    return one_container(one(objects, "Deployment", f"{RELEASE}-image-classifier"))


def flag(args: list[str], name: str) -> str:
    values = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"--{name}=")]
    assert len(values) == 1, (name, args)
    return values[0]


def free_server_ports() -> list[str]:
    """--set values giving the rendered server free loopback ports."""
    return [f"server.ports.{kind}={free_port(LOOPBACK)}" for kind in ("http", "grpc", "metrics")]


def http_status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0


def pod_environment(container: dict, secrets: dict[tuple[str, str], str]) -> dict[str, str]:
    """The container's variables as the kubelet sets them, Secrets given as
    {(secret name, key): value}."""
    env = {}
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            ref = variable["valueFrom"]["secretKeyRef"]
            env[variable["name"]] = secrets[(ref["name"], ref["key"])]
    return env


@dataclass
class RenderedServer:
    process: subprocess.Popen
    args: list[str]  # as run: variables expanded, loopback
    http_url: str
    grpc_url: str


@contextmanager
def serve_rendered(
    container: dict,
    secrets: dict[tuple[str, str], str],
    workdir: Path,
    repository: str | None = None,
    startup_timeout_s: float = 180,
):
    """Run the rendered tritonserver container's command with this machine's
    tritonserver: the kubelet's $(VAR) expansion from the pod's variables only
    (none of this process's AWS_* or admin key), loopback for 0.0.0.0 (this
    machine's rule), our Python-based backends for the container's C++ ones,
    `repository` for the pod's own when given. Ready once the readiness probe's
    path answers 200 (the startup probe's warmup is the caller's: run_probe);
    stopped (process group, /dev/shm) on exit."""
    env = pod_environment(container, secrets)
    args = [
        _KUBELET_VARIABLE.sub(lambda m: env[m.group(1)], arg).replace("=0.0.0.0", f"={LOOPBACK}")
        for arg in container["args"]
    ]
    if repository is not None:
        args = [f"--model-repository={repository}" if a.startswith("--model-repository=") else a for a in args]
    install = TritonInstall.from_pytriton()
    backends = install.assemble_backends(workdir / "backends")
    server_env = {k: v for k, v in install.environment().items() if not k.startswith(("AWS_", "TRITONSTACK_"))}
    log_path = workdir / "tritonserver.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(install.binary), *args, f"--backend-directory={backends}"],
            env={**server_env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        http = f"{LOOPBACK}:{flag(args, 'http-port')}"
        ready = "/v2/health/ready"  # what the pod's probes wait for first
        deadline = time.monotonic() + startup_timeout_s
        while http_status(f"http://{http}{ready}") != 200:
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        yield RenderedServer(process, args, http, f"{LOOPBACK}:{flag(args, 'grpc-port')}")
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=int(flag(args, "exit-timeout-secs")) + 5)
            except subprocess.TimeoutExpired:
                pass
        try:  # tritonserver if still there, and the stubs of its process group
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        remove_orphaned_stub_regions()  # what a killed stub leaves in /dev/shm


def run_probe(probe: dict, objects: list[dict], workdir: Path) -> subprocess.CompletedProcess:
    """An exec probe's command run here as the kubelet would run it in the pod: the
    ConfigMaps the pod mounts written to folders of `workdir` in place of their mount
    paths, this Python for the image's python3."""
    pod = one(objects, "Deployment", f"{RELEASE}-image-classifier")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = list(probe["exec"]["command"])
    for mount in container["volumeMounts"]:
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        if "configMap" not in volume:
            continue
        folder = workdir / mount["name"]
        folder.mkdir(parents=True, exist_ok=True)
        config_map = one(objects, "ConfigMap", volume["configMap"]["name"])
        for name, text in config_map.get("data", {}).items():
            (folder / name).write_text(text)
        for name, encoded in config_map.get("binaryData", {}).items():
            (folder / name).write_bytes(base64.b64decode(encoded))
        command = [arg.replace(mount["mountPath"] + "/", f"{folder}/") for arg in command]
    if command[0] == "python3":
        command[0] = sys.executable
    return subprocess.run(command, capture_output=True, text=True, timeout=probe["timeoutSeconds"])
