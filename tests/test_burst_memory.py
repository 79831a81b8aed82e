"""After a burst of huge images the server gives its memory back.

DALI 2.4 keeps its host pool's largest run for good, so eight concurrent
10000x10000 PNGs used to leave the DALI stub gigabytes larger. Now one decoder run
holds at most two such images (decode_budget.MAX_RUN_PIXELS), and the launcher's
supervisor reloads a model whose stub idles far above its settled size
(tritonstack.serve.supervision.RecyclePolicy): a new stub replaces it while the old
one serves. Ordinary requests sent all along must all succeed."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import psutil
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import TEST_STOP_GRACE_S, served_instances
from tritonstack.client.classifier import ClassifierClient
from tritonstack.client.retry import NO_RETRY
from tritonstack.samples.photos import photo_bytes
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.process_tree import processes_by_role, tree_rss_mib
from tritonstack.serve.server_config import ServerConfig
from tritonstack.serve.supervision import RecyclePolicy, StubMemory

ENSEMBLE = "ensemble_dali_efficientnet_lite0"
PREPROCESS = "preprocess_dali_efficientnet_lite0"
HUGE_SIDE = 10_000  # 100 MP: the largest image the default budget accepts


@pytest.fixture(scope="module")
def huge_png() -> bytes:
    """10000x10000 pixels from a random 100x100 image: ~0.4 MB encoded, 300 MB decoded."""
    small = np.random.default_rng(0).integers(0, 255, (100, 100, 3), dtype=np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(small).resize((HUGE_SIDE, HUGE_SIDE), Image.NEAREST).save(encoded, format="PNG")
    return encoded.getvalue()


@pytest.fixture(scope="module")
def server(lite0_repository):
    with TritonServer(ServerConfig(lite0_repository, stop_grace_s=TEST_STOP_GRACE_S)) as running:
        yield running


def decoded_mib() -> float:
    return HUGE_SIDE * HUGE_SIDE * 3 / 2**20


class OrdinaryTraffic(threading.Thread):
    """One small request after another until stopped; counts what failed."""

    def __init__(self, server: TritonServer):
        super().__init__(daemon=True)
        self.server, self.stopping, self.answers, self.failures = server, threading.Event(), 0, []

    def run(self) -> None:
        # Batch priority like the burst's: behind a huge image's decode an interactive request
        # waits past the latency objective and is refused (tests/test_overload.py covers that).
        with ClassifierClient(
            self.server.grpc_url, protocol="grpc", model=ENSEMBLE, retry=NO_RETRY, batch=True
        ) as client:
            while not self.stopping.is_set():
                try:
                    assert client.classify([photo_bytes("coffee.png")], top_k=1)[0][0].label == "espresso"
                    self.answers += 1
                except Exception as error:  # asserted empty below
                    self.failures.append(repr(error)[:300])
                time.sleep(0.05)


def classify_huge(server: TritonServer, image: bytes, answers: list) -> None:
    # Batch priority: huge images wait rather than being refused at the latency objective.
    try:
        with ClassifierClient(server.grpc_url, protocol="grpc", model=ENSEMBLE, retry=NO_RETRY, batch=True) as client:
            answers.append(client.classify([image], top_k=1)[0][0].label)
    except Exception as error:  # asserted below
        answers.append(error)


def test_burst_of_huge_images_is_answered_and_its_memory_given_back(server, huge_png):
    with ClassifierClient(server.grpc_url, protocol="grpc", model=ENSEMBLE) as client:
        for _ in range(10):
            client.classify([photo_bytes("chelsea.png"), photo_bytes("coffee.png")])
    time.sleep(3)  # the stubs settle (the supervisor learns their idle size)
    warm = tree_rss_mib(server.process.pid)
    traffic = OrdinaryTraffic(server)
    traffic.start()
    answers: list = []
    burst = [threading.Thread(target=classify_huge, args=(server, huge_png, answers)) for _ in range(8)]
    peak = warm
    for thread in burst:
        thread.start()
    while any(thread.is_alive() for thread in burst):
        peak = max(peak, tree_rss_mib(server.process.pid) or 0)
        time.sleep(0.1)
    burst_over = time.monotonic()
    assert len(answers) == 8 and all(isinstance(answer, str) for answer in answers), answers
    after = None
    while time.monotonic() - burst_over < 30:
        after = tree_rss_mib(server.process.pid)
        if after - warm < 300:
            break
        time.sleep(0.5)
    traffic.stopping.set()
    traffic.join(timeout=30)
    print(
        f"tree RSS: warm {warm:.0f} MiB, peak +{peak - warm:.0f} MiB, "
        f"+{after - warm:.0f} MiB {time.monotonic() - burst_over:.1f} s after; {traffic.answers} small answers"
    )
    # The burst's images decoded at once, and a quarter more, in each of the step's stubs
    # (each decodes its own runs and keeps its own pool): a stub recycled meanwhile
    # overlaps its successor for a moment, and a slow machine decodes more at a time.
    assert peak - warm < 1.25 * len(burst) * decoded_mib() * served_instances(server, PREPROCESS), (warm, peak)
    assert after - warm < 300, (warm, after, server.supervisor.recycles)
    assert [model for _, model, _ in server.supervisor.recycles] == [PREPROCESS]
    assert traffic.failures == [] and traffic.answers > 0


def test_huge_images_merged_in_one_request_are_refused_naming_the_budget(server, huge_png):
    with ClassifierClient(server.grpc_url, protocol="grpc", model=ENSEMBLE, retry=NO_RETRY) as client:
        with pytest.raises(Exception, match=r"above this model's max_request_pixels 200000000"):
            client.classify([huge_png] * 8)
        assert client.classify([photo_bytes("coffee.png")], top_k=1)[0][0].label == "espresso"


def test_each_stubs_memory_is_a_metric_next_to_tritons(server):
    with ClassifierClient(server.grpc_url, protocol="grpc", model=ENSEMBLE) as client:
        client.classify([photo_bytes("coffee.png")])
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        families = {family.name: family for family in text_string_to_metric_families(response.read().decode())}
    samples = {sample.labels["model"]: sample.value for sample in families["tritonstack_stub_rss_bytes"].samples}
    assert {PREPROCESS, "efficientnet_lite0"} <= samples.keys()
    stub = processes_by_role(server.process.pid)[f"stub:{PREPROCESS}"]
    assert abs(samples[PREPROCESS] - stub.memory_info().rss) < 0.2 * stub.memory_info().rss
    assert "nv_cpu_memory_used_bytes" in families


def test_the_supervisor_tells_a_stub_working_flat_out_from_one_serving_a_trickle():
    """Recycling waits while a stub decodes a burst (RecyclePolicy.busy_cores): the
    reading is the CPU a process used between two readings, in cores."""
    policy = RecyclePolicy()
    spinning = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    sleeping = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        readings = {process.pid: StubMemory() for process in (spinning, sleeping)}
        for _ in range(2):
            now = time.monotonic()
            for pid, memory in readings.items():
                memory.observe(psutil.Process(pid), now, policy.above_mib)
            time.sleep(1.0)
        assert readings[spinning.pid].cpu_cores >= policy.busy_cores > readings[sleeping.pid].cpu_cores
    finally:
        for process in (spinning, sleeping):
            process.kill()
            process.wait()
