"""The CPU serving image run for real (`make image-test`, after `make image`): in a
Docker container under `--cpus 1 --memory 2g`, reached from this machine over
published loopback ports. Not part of `make test` (it needs an engine and the image);
.ci/run calls it after the suite.

Each container is removed at the end, and also if this process is killed: a watcher
in a session of its own removes it once this process is gone."""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest
import tritonclient.http as httpclient
from PIL import Image

from tests.chart import http_status
from tests.conftest import PROJECT_ROOT
from tests.processes import wait_for
from tritonstack.client.classifier import ClassifierClient
from tritonstack.client.retry import NO_RETRY
from tritonstack.contract import ADMIN_HEADER, ADMIN_KEY_ENV, DEFAULT_MODEL
from tritonstack.samples.photos import PHOTOS, photo_bytes
from tritonstack.serve.network import LOOPBACK, free_port

IMAGE = os.environ.get("TRITONSTACK_IMAGE", "tritonstack-cpu:latest")
LOCUST_IMAGE = os.environ.get("TRITONSTACK_LOCUST_IMAGE", "tritonstack-locust:latest")
LABEL = "tritonstack-image-test"
MEMORY = "2g"
MEMORY_BYTES = 2 << 30
SHM = "256m"  # docs/operations.md#in-a-container: the Lite0 preset's stubs need 192 MiB
READY_WITHIN_S = 240
PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002, "health": 8003}


def docker(*args: str, check: bool = True, timeout: float = 120) -> str:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


@dataclass
class Container:
    name: str
    ports: dict[str, int]

    @property
    def http_url(self) -> str:
        return f"{LOOPBACK}:{self.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"{LOOPBACK}:{self.ports['grpc']}"

    def ready_status(self) -> int:
        return http_status(f"http://{LOOPBACK}:{self.ports['health']}/ready")

    def state(self) -> dict:
        return json.loads(docker("inspect", "--format", "{{json .State}}", self.name))

    def restarts(self) -> int:
        return int(docker("inspect", "--format", "{{.RestartCount}}", self.name))

    def logs(self) -> str:
        """Its output and its log lines (the launcher logs to stderr)."""
        logs = subprocess.run(["docker", "logs", self.name], capture_output=True, text=True)
        return logs.stdout + logs.stderr

    def memory_bytes(self) -> int:
        """The container's memory use as its cgroup counts it (what the limit applies to)."""
        stats = docker("stats", "--no-stream", "--format", "{{json .}}", self.name)
        used = json.loads(stats)["MemUsage"].split("/")[0].strip()
        units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
        for unit in sorted(units, key=len, reverse=True):
            if used.endswith(unit):
                return int(float(used[: -len(unit)]) * units[unit])
        raise AssertionError(f"unreadable memory use {used!r}")


ADMIN_KEY = secrets.token_hex(16)


def start_container(*run_args: str, cpus: str = "1") -> Container:
    name = f"{LABEL}-{secrets.token_hex(4)}"
    ports = {role: free_port() for role in PORTS}
    published = [arg for role, port in ports.items() for arg in ("-p", f"{LOOPBACK}:{port}:{PORTS[role]}")]
    docker(
        "run", "--detach", "--name", name, "--label", LABEL, "--cpus", cpus, "--memory", MEMORY,
        "--memory-swap", MEMORY, "--shm-size", SHM, "--env", f"{ADMIN_KEY_ENV}={ADMIN_KEY}",
        *published, *run_args, IMAGE,
    )  # fmt: skip
    # Removed once this process is gone, even killed: a watcher in its own session.
    subprocess.Popen(
        ["sh", "-c", f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 2; done; docker rm -f {name}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    container = Container(name, ports)
    deadline = time.monotonic() + READY_WITHIN_S
    while container.ready_status() != 200:
        assert time.monotonic() < deadline and container.state()["Running"], container.logs()[-4000:]
        time.sleep(1)
    return container


@pytest.fixture(scope="module")
def container():
    for leftover in docker("ps", "--all", "--quiet", "--filter", f"label={LABEL}").split():
        docker("rm", "--force", leftover, check=False)
    started = start_container("--restart", "on-failure:3")
    yield started
    docker("rm", "--force", started.name, check=False)


def classify(url: str, protocol: str, image: bytes, **options) -> str:
    with ClassifierClient(url, protocol=protocol, retry=NO_RETRY, **options) as client:
        return client.classify([image], top_k=1)[0][0].label


def test_photos_are_classified_over_http_and_grpc_from_the_host(container):
    for photo in ("coffee.png", "chelsea.png"):
        for protocol, url in (("http", container.http_url), ("grpc", container.grpc_url)):
            assert classify(url, protocol, photo_bytes(photo)) in PHOTOS[photo], (photo, protocol)


def test_the_layout_reads_one_core_from_the_cgroup_quota(container):
    assert "1 cores (affinity" in container.logs() and "cgroup CPU quota 1)" in container.logs()


def test_the_image_serves_only_the_default_ensemble_and_its_steps(container):
    with httpclient.InferenceServerClient(container.http_url) as client:
        index = client.get_model_repository_index(headers={ADMIN_HEADER: ADMIN_KEY})
    ready = {entry["name"] for entry in index if entry.get("state") == "READY"}
    assert ready == {DEFAULT_MODEL, "preprocess_dali_efficientnet_lite0", "efficientnet_lite0"}, ready
    print(f"idle, the default ensemble loaded: {container.memory_bytes() >> 20} MiB")


def test_two_cores_give_the_layout_two_cores():
    second = start_container(cpus="2")
    try:
        assert "2 cores (affinity" in second.logs() and "cgroup CPU quota 2)" in second.logs()
        assert classify(second.http_url, "http", photo_bytes("coffee.png")) in PHOTOS["coffee.png"]
    finally:
        docker("rm", "--force", second.name, check=False)


def test_dockers_default_shm_is_refused_in_one_line_saying_what_to_set():
    """Docker's 64 MB /dev/shm holds two stubs' regions: the launcher says so and exits 2
    before tritonserver starts, instead of every model failing to load."""
    run = subprocess.run(
        ["docker", "run", "--rm", "--label", LABEL, "--cpus", "1", "--memory", MEMORY, IMAGE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run
    assert "/dev/shm has" in run.stderr and "--shm-size=" in run.stderr, run.stderr


def test_dockers_healthcheck_reads_the_launchers_readiness(container):
    wait_for(lambda: container.state()["Health"]["Status"] == "healthy", timeout_s=90, what="healthy")


def huge_png(side: int = 10_000) -> bytes:
    """A 100 MP PNG of ~0.4 MB (300 MB decoded), as tests/test_burst_memory.py sends."""
    small = np.random.default_rng(0).integers(0, 255, (100, 100, 3), dtype=np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(small).resize((side, side), Image.NEAREST).save(encoded, format="PNG")
    return encoded.getvalue()


def test_a_burst_of_huge_images_leaves_the_container_alive_and_within_its_limit(container):
    """Eight 100 MP images at once: each refused by the decode budget (sized from the
    container's 2 GiB, not the host's memory) or served; never an OOM kill."""
    image, answers, peak = huge_png(), [], [0]

    def send() -> None:
        try:
            answers.append(classify(container.grpc_url, "grpc", image, batch=True))
        except Exception as error:  # refused: said below
            answers.append(error)

    burst = [threading.Thread(target=send) for _ in range(8)]
    for thread in burst:
        thread.start()
    while any(thread.is_alive() for thread in burst):
        peak[0] = max(peak[0], container.memory_bytes())
        time.sleep(0.5)
    state = container.state()
    assert state["Running"] and not state["OOMKilled"] and container.restarts() == 0, state
    assert len(answers) == 8 and peak[0] < MEMORY_BYTES, (answers, peak)
    refused = [answer for answer in answers if not isinstance(answer, str)]
    assert all("pixels" in str(error) for error in refused), refused
    assert classify(container.http_url, "http", photo_bytes("coffee.png")) in PHOTOS["coffee.png"]
    print(f"huge burst: {len(refused)} of 8 refused, peak {peak[0] >> 20} MiB of {MEMORY}")


def test_a_killed_server_is_brought_back_by_the_restart_policy(container):
    pid = container.state()["Pid"]
    os.kill(pid, 9)  # the container's main process, from the host: exit 137
    wait_for(lambda: container.restarts() >= 1, timeout_s=60, what="restarted")
    wait_for(lambda: container.ready_status() == 200, timeout_s=READY_WITHIN_S, what="ready again")
    assert classify(container.grpc_url, "grpc", photo_bytes("coffee.png")) in PHOTOS["coffee.png"]


def test_the_locust_image_drives_the_server_headless_for_a_bounded_run(container):
    """The chart's Locust image, the users mounted as the chart's ConfigMap mounts them,
    in the server container's network (as a pod beside the Service): it ends on its own
    and no request failed (Locust exits 1 on any failure)."""
    run = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--label",
            LABEL,
            "--network",
            f"container:{container.name}",
            "--volume",
            f"{PROJECT_ROOT / 'tritonstack' / 'loadtests'}:/locust/loadtests:ro",
            "--env",
            "PYTHONPATH=/locust",
            LOCUST_IMAGE,
            "locust",
            "-f",
            "/locust/loadtests/locustfile.py",
            "--headless",
            f"--host=http://{LOOPBACK}:{PORTS['http']}",
            f"--grpc-url={LOOPBACK}:{PORTS['grpc']}",
            f"--model={DEFAULT_MODEL}",
            "--users=2",
            "--spawn-rate=2",
            "--run-time=10s",
            "--stop-timeout=10",
            "--only-summary",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # The stats table's total (the percentile table after it has an Aggregated row too).
    totals = re.findall(r"Aggregated\s+(\d+)\s+(\d+)\(", run.stderr)
    assert totals, run.stderr[-3000:]
    requests, failures = (int(field) for field in totals[0])
    assert requests > 0 and failures == 0, totals
    print(f"locust image, 10 s at 2 users: {requests} requests, none failed")


def test_docker_stop_under_load_loses_no_accepted_request(container):
    """Requests every 50 ms over HTTP while `docker stop` (SIGTERM, then SIGKILL after
    10 s): each got its answer, or a refusal it can retry elsewhere (the server
    stopping, a closed or refused connection); none an error mid-way, none lost."""
    outcomes, stopping = [], threading.Event()
    image = np.frombuffer(photo_bytes("coffee.png"), np.uint8)[None]

    def one() -> str | Exception:
        """Triton's stock HTTP client, a connection a request (none held idle)."""
        request = httpclient.InferInput("INPUT", list(image.shape), "UINT8")
        request.set_data_from_numpy(image)
        output = httpclient.InferRequestedOutput("OUTPUT", class_count=1)
        try:
            with httpclient.InferenceServerClient(container.http_url, network_timeout=30) as client:
                top = client.infer(DEFAULT_MODEL, [request], outputs=[output]).as_numpy("OUTPUT")[0][0]
            return top.decode().split(":", 2)[2]
        except Exception as error:  # said below
            return error

    def load() -> None:
        while not stopping.is_set():
            outcomes.append(one())
            time.sleep(0.05)

    sender = threading.Thread(target=load)
    sender.start()
    wait_for(lambda: len(outcomes) >= 10, timeout_s=30, what="answers before the stop")
    started = time.monotonic()
    docker("stop", container.name, timeout=60)
    took = time.monotonic() - started
    stopping.set()
    sender.join(timeout=60)
    state = container.state()
    answered = [outcome for outcome in outcomes if isinstance(outcome, str)]
    failed = [str(outcome) for outcome in outcomes if not isinstance(outcome, str)]
    assert answered and all(label in PHOTOS["coffee.png"] for label in answered)
    # After the stop, docker's port proxy still accepts and closes at once: a refusal too.
    retryable = ("Server is stopping", "onnect", "closed", "refused", "reset", "[503]")
    assert all(any(word in failure for word in retryable) for failure in failed), failed
    assert state["ExitCode"] == 0 and took < 10, (state, took)  # drained within the grace, not killed
    print(f"docker stop under load: {len(answered)} answered, {len(failed)} refused, stopped in {took:.1f} s")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
