"""Hangs, not deaths, against a real tritonserver with one request every 0.5 s
throughout (docs/reliability.md#hangs): a step's stubs stopped (the DALI step's, the
classifier's), a stub deadlocked (a Python model that never returns: alive and
healthy to Triton, using no CPU), a model that keeps hanging (left unloaded), and
tritonserver itself stopped. Each asserts the time until it serves again, that every
request got an answer (a result or an error the client can retry), and what the
launcher's readiness said meanwhile. One server for the module, in file order: the
server's own hang comes last."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.chart import http_status
from tests.conftest import TEST_STOP_GRACE_S
from tests.processes import wait_for
from tritonstack.samples.photos import photo_bytes
from tritonstack.serve.hangs import Hang, HangDetector, HangPolicy, RestartIntensity
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.process_tree import server_stubs
from tritonstack.serve.server_config import ServerConfig
from tritonstack.serve.supervision import Supervision

ENSEMBLE = "ensemble_dali_efficientnet_lite0"
PREPROCESS = "preprocess_dali_efficientnet_lite0"
CLASSIFIER = "efficientnet_lite0"
STALLING = "stalling_step"
# A request whose input is negative never returns: the stub's main thread waits for
# good, its health thread (C++) still reports it healthy to Triton. Its load takes a
# second, as a real model's does: a bare Python model reloads in a few tenths of a
# second (the launcher skips auto-complete), less than the readiness polls below can
# be sure to see.
STALLING_MODEL = """
import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(1.0)

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(request, "IN").as_numpy() for request in requests]
        if any((array < 0).any() for array in arrays):
            threading.Event().wait()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", array)]) for array in arrays]
"""
STALLING_CONFIG = """backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching { }
"""
# Short, so the module runs in seconds; one replacement a model, so a second hang of
# the stalling step is given up on.
POLICY = HangPolicy(stall_s=2.0, replacements=1)
READY_WITHIN_S, SERVING_WITHIN_S = 10, 20  # after a stub's hang: readiness false, answers again
SERVER_BACK_WITHIN_S = 60  # after tritonserver's hang


@pytest.fixture(scope="module")
def hang_repository(lite0_repository, tmp_path_factory):
    root = tmp_path_factory.mktemp("hangs")
    for name in (ENSEMBLE, PREPROCESS, CLASSIFIER):
        shutil.copytree(lite0_repository / name, root / name)
    (root / STALLING / "1").mkdir(parents=True)
    (root / STALLING / "config.pbtxt").write_text(STALLING_CONFIG)
    (root / STALLING / "1" / "model.py").write_text(STALLING_MODEL)
    return root


@pytest.fixture(scope="module")
def triton(hang_repository):
    config = ServerConfig(hang_repository, stop_grace_s=TEST_STOP_GRACE_S)
    with TritonServer(config, Supervision(hangs=POLICY, health_port=0, server_hang_s=10.0)) as running:
        yield running


@dataclass
class Answers:
    """(sent, done, outcome) of each request: "ok", an HTTP status, "connection: ..."
    (the server closed or refused it: retryable), or "no answer: ..." (a timeout)."""

    rows: list[tuple[float, float, str]] = field(default_factory=list)

    def after(self, t: float) -> list[str]:
        return [outcome for sent, _, outcome in self.rows if sent >= t]

    def first_ok_after(self, t: float) -> float | None:
        return next((done for sent, done, outcome in self.rows if sent >= t and outcome == "ok"), None)


class Watch:
    """One request every 0.5 s to `send`, and the launcher's readiness every 0.25 s,
    from threads, until stopped."""

    def __init__(self, server: TritonServer, send):
        self.server, self.send = server, send
        self.answers = Answers()
        self.readiness: list[tuple[float, int]] = []
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._request), threading.Thread(target=self._ready)]

    def __enter__(self) -> Watch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _request(self) -> None:
        while not self._stopping.is_set():
            sent = time.monotonic()
            threading.Thread(target=self._one, args=(sent,), daemon=True).start()
            self._stopping.wait(0.5)

    def _one(self, sent: float) -> None:
        outcome = self.send(self.server.http_url)
        self.answers.rows.append((sent, time.monotonic(), outcome))

    def _ready(self) -> None:
        while not self._stopping.is_set():
            self.readiness.append((time.monotonic(), ready_status(self.server)))
            self._stopping.wait(0.25)

    def not_ready_at(self, after: float) -> float | None:
        return next((t for t, status in self.readiness if t >= after and status != 200), None)

    def ready_again_at(self, after: float) -> float | None:
        first_down = self.not_ready_at(after)
        return next((t for t, status in self.readiness if first_down and t > first_down and status == 200), None)

    def wait_ready_again(self, after: float) -> None:
        """Until readiness went down after `after` and came back; a failure shows what it said."""
        try:
            wait_for(lambda: self.ready_again_at(after), timeout_s=SERVING_WITHIN_S, what="ready again")
        except AssertionError as error:
            said = [(round(t - after, 2), status) for t, status in self.readiness if t >= after]
            raise AssertionError(f"{error}; readiness (s after the fault, status): {said}") from None


def ready_status(server: TritonServer) -> int:
    return http_status(f"{server.health.url}/ready")


def classify_photo(url: str) -> str:
    image = np.frombuffer(photo_bytes("coffee.png"), np.uint8)[None]
    request = httpclient.InferInput("INPUT", list(image.shape), "UINT8")
    request.set_data_from_numpy(image)
    return outcome_of(url, ENSEMBLE, [request])


def stalling_request(value: float):
    def send(url: str) -> str:
        request = httpclient.InferInput("IN", [1, 1], "FP32")
        request.set_data_from_numpy(np.array([[value]], np.float32))
        return outcome_of(url, STALLING, [request])

    return send


def outcome_of(url: str, model: str, inputs) -> str:
    try:
        with httpclient.InferenceServerClient(url, network_timeout=45, connection_timeout=45) as client:
            client.infer(model, inputs)
        return "ok"
    except InferenceServerException as error:
        status = error.status()
        if status is None:  # tritonclient's own: the connection, not an HTTP answer
            return f"{'no answer' if 'timed out' in str(error) else 'connection'}: {error}"
        return str(status)
    except Exception as error:  # the connection closed or refused (geventhttpclient's own types)
        return f"connection: {type(error).__name__}: {error}"


def stub_pids(server: TritonServer, model: str) -> list[int]:
    return [pid for pid, name in server_stubs(server.process.pid)[0].items() if name == model]


def replaced(server: TritonServer, model: str) -> bool:
    return any(name == model for _, name, _ in server.supervisor.replaced_hangs)


@pytest.mark.parametrize("model", [PREPROCESS, CLASSIFIER])
def test_a_step_whose_stubs_are_stopped_is_replaced_without_a_500(triton, model):
    """Both stubs of the step SIGSTOPped (how a native deadlock looks from outside):
    continued at once, so the requests they hold are answered, and replaced."""
    wait_for(lambda: ready_status(triton) == 200, timeout_s=30, what="ready")
    with Watch(triton, classify_photo) as watch:
        wait_for(lambda: watch.answers.first_ok_after(0) is not None, timeout_s=30, what="an answer")
        victims = stub_pids(triton, model)
        faulted = time.monotonic()
        for pid in victims:
            os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: replaced(triton, model), timeout_s=SERVING_WITHIN_S, what=f"{model} replaced")
        watch.wait_ready_again(faulted)
        back = time.monotonic()
        wait_for(lambda: watch.answers.first_ok_after(back) is not None, timeout_s=SERVING_WITHIN_S, what="answers")
    outcomes = watch.answers.after(faulted)
    assert outcomes and "500" not in outcomes, outcomes
    assert all(outcome == "ok" or outcome in ("503", "404") for outcome in outcomes), outcomes
    assert watch.not_ready_at(faulted) - faulted < READY_WITHIN_S
    assert watch.answers.first_ok_after(back) - faulted < SERVING_WITHIN_S
    # Triton stops the old instances once the new ones serve.
    wait_for(lambda: not set(victims) & set(stub_pids(triton, model)), timeout_s=30, what="the old stubs gone")


def test_a_deadlocked_stub_is_killed_and_replaced_and_its_request_answered(triton):
    """A request that never returns holds the step's one stub; the requests behind it
    wait while the stub uses no CPU: after stall_s the stub is killed and the model
    replaced; the held request gets an error, the ones behind it answers."""
    wait_for(lambda: ready_status(triton) == 200, timeout_s=30, what="ready")
    before = stub_pids(triton, STALLING)
    held: list[str] = []
    holder = threading.Thread(target=lambda: held.append(stalling_request(-1.0)(triton.http_url)))
    faulted = time.monotonic()
    holder.start()
    with Watch(triton, stalling_request(1.0)) as watch:
        wait_for(lambda: replaced(triton, STALLING), timeout_s=SERVING_WITHIN_S, what="the stalled model replaced")
        watch.wait_ready_again(faulted)
        back = time.monotonic()
        wait_for(lambda: watch.answers.first_ok_after(back) is not None, timeout_s=SERVING_WITHIN_S, what="answers")
    holder.join(timeout=60)
    ((_, _, reason),) = [hang for hang in triton.supervisor.replaced_hangs if hang[1] == STALLING]
    assert "used no CPU" in reason
    assert held and held[0] != "ok" and not held[0].startswith("no answer"), held
    assert all(not outcome.startswith("no answer") for outcome in watch.answers.after(faulted)), watch.answers.rows
    assert watch.not_ready_at(faulted) - faulted < READY_WITHIN_S
    assert not set(before) & set(stub_pids(triton, STALLING))


def test_a_model_that_keeps_hanging_is_left_unloaded_and_readiness_says_so(triton):
    """The same model hangs again past its restart intensity (one replacement here):
    unloaded for good, reported by the readiness, the other models still served."""
    holder = threading.Thread(target=stalling_request(-1.0), args=(triton.http_url,))
    holder.start()
    with Watch(triton, stalling_request(1.0)):  # requests waiting behind it: a stall
        wait_for(lambda: STALLING in triton.supervisor.given_up, timeout_s=SERVING_WITHIN_S, what="given up")
    holder.join(timeout=60)
    with urllib.request.urlopen(f"{triton.health.url}/live", timeout=3) as live:
        assert live.status == 200
    assert ready_status(triton) == 503
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(f"{triton.health.url}/ready", timeout=3)
    assert f"model {STALLING} was unloaded for good" in answer.value.read().decode()
    assert not stub_pids(triton, STALLING)
    assert classify_photo(triton.http_url) == "ok"


def test_a_stopped_tritonserver_is_restarted_on_the_same_ports(triton):
    """SIGSTOP on tritonserver: readiness false at once, killed once its liveness has
    not answered for server_hang_s, started again on the same ports (the restart loads
    every model, the one given up on included)."""
    ports = (triton.config.http_port, triton.config.grpc_port)
    with Watch(triton, classify_photo) as watch:
        wait_for(lambda: watch.answers.first_ok_after(0) is not None, timeout_s=30, what="an answer")
        stopped_pid = triton.process.pid
        faulted = time.monotonic()
        os.kill(stopped_pid, signal.SIGSTOP)
        wait_for(lambda: triton.restarter.restarts, timeout_s=SERVER_BACK_WITHIN_S, what="restarted")
        wait_for(lambda: watch.ready_again_at(faulted), timeout_s=SERVER_BACK_WITHIN_S, what="ready again")
        back = time.monotonic()
        wait_for(lambda: watch.answers.first_ok_after(back) is not None, timeout_s=30, what="answers")
    assert triton.process.pid != stopped_pid and not psutil.pid_exists(stopped_pid)
    assert (triton.config.http_port, triton.config.grpc_port) == ports
    assert "unanswered" in triton.restarter.deaths[-1][1]
    assert watch.not_ready_at(faulted) - faulted < READY_WITHIN_S
    assert watch.answers.first_ok_after(back) - faulted < SERVER_BACK_WITHIN_S
    # Requests sent meanwhile: answered, closed or refused by the restart; none left hanging.
    outcomes = watch.answers.after(faulted)
    assert all(outcome == "ok" or outcome.startswith("connection") for outcome in outcomes), outcomes
    assert STALLING not in triton.supervisor.given_up and stub_pids(triton, STALLING)


# --- the detector and the restart intensity, on real processes and made-up times ---


@pytest.fixture
def idle_process():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    time.sleep(1.0)  # past the interpreter's start-up, which uses CPU
    yield process
    process.kill()
    process.wait()


def test_the_detector_finds_a_stopped_stub_at_once_and_a_stall_only_with_requests_waiting(idle_process):
    waiting = {"m": 0.0}
    detector = HangDetector(HangPolicy(stall_s=2.0), pending=lambda: waiting)
    live = {idle_process.pid: "m"}
    assert detector.hung(live, 100.0) == {}
    assert detector.hung(live, 130.0) == {}  # idle, nothing waiting: a stub waiting for work
    waiting["m"] = 2
    # Idle for 30 s, but the requests were first seen waiting now: no stall yet.
    assert detector.hung(live, 130.5) == {}
    assert detector.hung(live, 132.0) == {}
    (hang,) = detector.hung(live, 132.5).values()
    assert not hang.stopped and "2 request(s) waited 2 s" in hang.reason
    os.kill(idle_process.pid, signal.SIGSTOP)
    wait_for(lambda: psutil.Process(idle_process.pid).status() == psutil.STATUS_STOPPED, timeout_s=5, what="stop")
    assert detector.hung(live, 133.0) == {"m": Hang(f"its stub (pid {idle_process.pid}) is stopped", stopped=True)}


def test_requests_must_wait_at_every_read_to_be_a_stall(idle_process):
    """Seen in the suite: a request reached a step idle for 27 s and waited one poll for
    a core; the old rule timed the stall from the stubs' last work and replaced the model."""
    waiting = {"m": 1.0}
    detector = HangDetector(HangPolicy(stall_s=2.0), pending=lambda: waiting)
    live = {idle_process.pid: "m"}
    detector.hung(live, 100.0)
    assert detector.hung(live, 101.0) == {}  # seen waiting from here
    waiting["m"] = 0.0
    assert detector.hung(live, 102.0) == {}  # answered or refused: the wait starts over
    waiting["m"] = 1.0
    assert detector.hung(live, 103.5) == {} and detector.hung(live, 105.0) == {}
    assert detector.hung(live, 105.5) != {}


# A stub that computes now and then, about a sixth of a core, at the lowest priority:
# enough to be progress, not enough to slow the tests beside it.
SOMETIMES_BUSY = (
    "import time\nwhile True:\n    t = time.time()\n    while time.time() - t < 0.01: pass\n    time.sleep(0.05)"
)


def test_a_stub_that_computes_is_no_stall():
    busy = subprocess.Popen([sys.executable, "-c", SOMETIMES_BUSY], preexec_fn=lambda: os.nice(19))
    try:
        detector = HangDetector(HangPolicy(stall_s=0.5), pending=lambda: {"m": 5})
        started = time.monotonic()
        while time.monotonic() - started < 2.0:
            assert detector.hung({busy.pid: "m"}, time.monotonic()) == {}
            time.sleep(0.2)
    finally:
        busy.kill()
        busy.wait()


def test_restart_intensity_allows_so_many_within_the_window():
    intensity = RestartIntensity(HangPolicy(replacements=3, window_s=300.0))
    assert [intensity.allow("m", t) for t in (0.0, 10.0, 20.0, 30.0)] == [True, True, True, False]
    assert intensity.allow("other", 30.0)
    assert intensity.allow("m", 301.0)  # the first has left the window
