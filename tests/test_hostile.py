"""Hostile clients against a real tritonserver: no request may crash the
server or exhaust its memory, and a crash is survived.

One server for the module, on a copy of the Lite0 models with decode budgets small
enough for the test machine. Each case asserts the answer, how long it took, that
the server is ready and classifies a photo afterwards, and that memory stayed
within a bound. The two crash cases (SIGKILL, the JSON-nesting crash of Triton
2.51) assert that the launcher's restarter brings the service back. Bounded: the
module stays under 120 s and 2 GB.
"""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import signal
import socket
import threading
import time

import numpy as np
import psutil
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from tests import repo_factory as rf
from tests.answers import classify_coffee, wait_until_it_answers
from tests.conftest import TEST_STOP_GRACE_S
from tests.test_bad_input import decompression_bomb  # a 16x16 JPEG declaring 60000x60000
from tritonstack.contract import BATCH_PRIORITY, pad_batch
from tritonstack.repository_files import read_config
from tritonstack.samples.photos import photo_bytes
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.limits import MemoryLimits, gpu_models, has_nvidia_devices
from tritonstack.serve.process_tree import server_stubs
from tritonstack.serve.server_config import ServerConfig
from tritonstack.serve.supervision import Supervision

ENSEMBLE = "ensemble_dali_efficientnet_lite0"
PREPROCESS = "preprocess_dali_efficientnet_lite0"
CLASSIFIER = "efficientnet_lite0"
PILLOW_ENSEMBLE, PILLOW = "ensemble_python_efficientnet_lite0", "preprocess_python_efficientnet_lite0"
RECOVERY_S = 60  # a dead server must answer again within this
ANSWER_S = 20  # any single hostile request is answered (or refused) within this
MiB = 1 << 20
# Small enough for the test machine: a 4000x4000 image is 16 MP.
# A copy of the DALI model with a budget far above its memory ceiling: a runaway.
UNBUDGETED = "preprocess_unbudgeted"
LIMITS = MemoryLimits(server_bytes=8 << 30, stub_bytes=2 << 30)
BUDGET = {
    "max_pixels": 20_000_000,
    "max_request_pixels": 40_000_000,
    "max_batch_pixels": 40_000_000,
    "release_above_pixels": 10_000_000,
}


@pytest.fixture(scope="module")
def hostile_repository(model_repository, tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    for name in (ENSEMBLE, PREPROCESS, CLASSIFIER, PILLOW_ENSEMBLE, PILLOW):
        shutil.copytree(model_repository / name, root / name)
    add_parameters(root / PILLOW, BUDGET)
    shutil.copytree(model_repository / PREPROCESS, root / UNBUDGETED)
    unbudgeted = root / UNBUDGETED / "config.pbtxt"
    unbudgeted.write_text(unbudgeted.read_text().replace(f'name: "{PREPROCESS}"', f'name: "{UNBUDGETED}"'))
    add_parameters(root / PREPROCESS, BUDGET)
    add_parameters(root / UNBUDGETED, {key: "10000000000" for key in BUDGET})
    return root


def add_parameters(model_dir, parameters: dict) -> None:
    with open(model_dir / "config.pbtxt", "a") as config:
        for key, value in parameters.items():
            config.write(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n')


@pytest.fixture(scope="module")
def triton(hostile_repository):
    # No recycling: these tests watch one DALI stub's memory across bursts
    # (recycling after a burst: tests/test_burst_memory.py).
    config = ServerConfig(hostile_repository, stop_grace_s=TEST_STOP_GRACE_S)
    with TritonServer(config, Supervision(recycle=None, memory_limits=LIMITS)) as running:
        yield running


def poll(condition, timeout_s: float, every_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every_s)
    return bool(condition())


def assert_crash_survived(server: TritonServer, old_pid: int, started: float, restarts_before: int) -> None:
    recovered = wait_until_it_answers(server, started + RECOVERY_S)
    print(f"answered again {recovered - started:.1f} s after the crash")  # shown with -s
    assert server.pid != old_pid
    # Ready (answering) comes a moment before the restarter records the restart.
    assert poll(lambda: len(server.restarter.restarts) > restarts_before, 10)
    assert recovered - started < RECOVERY_S
    assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE


def test_killed_server_is_restarted_and_answers_again(triton):
    assert classify_coffee(triton) == "espresso"
    old_pid = triton.pid
    deaths, restarts = len(triton.restarter.deaths), len(triton.restarter.restarts)
    started = time.monotonic()
    os.kill(old_pid, signal.SIGKILL)  # tritonserver, not the launcher
    assert_crash_survived(triton, old_pid, started, restarts)
    assert triton.restarter.deaths[deaths][1] == "killed by SIGKILL"


def deep_json(depth: int) -> bytes:
    return b'{"inputs":[],"parameters":{"deep":' + b"[" * depth + b"]" * depth + b"}}"


def test_json_nested_150000_deep_crashes_triton_2_51_and_is_survived(triton):
    """Triton 2.51's recursive JSON parser overflows its stack (SIGSEGV) on ~300 KB
    of brackets; no flag of 2.51 limits nesting (fixed upstream in triton common
    PR 156). The service must be back within RECOVERY_S."""
    old_pid = triton.pid
    deaths, restarts = len(triton.restarter.deaths), len(triton.restarter.restarts)
    body = deep_json(150_000)
    started = time.monotonic()
    with pytest.raises(requests.ConnectionError):
        requests.post(
            f"http://{triton.http_url}/v2/models/{ENSEMBLE}/infer",
            data=body,
            timeout=ANSWER_S,
            headers={"Inference-Header-Content-Length": str(len(body))},
        )
    assert_crash_survived(triton, old_pid, started, restarts)
    assert triton.restarter.deaths[deaths][1] == "killed by SIGSEGV"
    assert len(body) < 310_000


# --- decode budget ---------------------------------------------------------------


def png(width: int, height: int) -> bytes:
    """A real image of that size (one colour: small encoded, full size decoded)."""
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (120, 30, 200)).save(buffer, "PNG")
    return buffer.getvalue()


def infer_images(server: TritonServer, images: list[bytes]) -> np.ndarray:
    """Large images are batch work: they wait rather than being refused at the
    server's latency objective (tritonstack.objective)."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=ANSWER_S)
    try:
        arrays = {"INPUT": pad_batch(images)}
        return rf.infer_http(client, ENSEMBLE, arrays, ["OUTPUT"], priority=BATCH_PRIORITY).as_numpy("OUTPUT")
    finally:
        client.close()


def dali_stub(server: TritonServer, model: str = PREPROCESS) -> psutil.Process:
    live, _ = server_stubs(server.pid)
    return psutil.Process(next(pid for pid, name in live.items() if name == model))


def test_request_above_its_pixel_budget_is_refused_before_decoding(triton):
    bomb = png(4000, 4000)  # 16 MP each, 56 KB encoded
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as refused:
        infer_images(triton, [bomb] * 3)
    assert time.monotonic() - started < ANSWER_S
    assert refused.value.status() == "400"
    assert "48000000 pixels in total" in refused.value.message()
    assert "max_request_pixels 40000000" in refused.value.message()
    assert classify_coffee(triton) == "espresso"


def test_burst_of_large_images_runs_in_parts_and_memory_plateaus(triton):
    """4 clients at once, 2 images of 16 MP each: 128 MP merged, run in parts of at
    most 40 MP. DALI's host pool keeps the buffers of the largest run for reuse
    (docs/memory.md): after the burst the stub holds at most one run's worth more
    than warm, and a second identical burst adds nothing."""
    for _ in range(3):
        classify_coffee(triton)
    stub = dali_stub(triton)
    warm = stub.memory_info().rss
    large = png(4000, 4000)
    peaks, afters = [], []
    for _ in range(2):
        peak, elapsed = burst_of_large_images(triton, stub, large)
        after = stub.memory_info().rss  # before any other request
        assert classify_coffee(triton) == "espresso"
        peaks.append(peak)
        afters.append(after)
        print(
            f"DALI stub RSS: warm {warm / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB, after {after / MiB:.0f} MiB, "
            f"{elapsed:.1f} s"
        )
    assert max(peaks) - warm < 600 * MiB  # 40 MP per run at ~5 B/pixel, not 128 MP
    assert afters[0] - warm < BUDGET["max_batch_pixels"] * 5, (warm, afters)  # one run's buffers at most
    assert afters[1] - afters[0] < 0.05 * afters[0], (warm, afters)  # a plateau, not a climb


def burst_of_large_images(triton, stub, large: bytes) -> tuple[int, float]:
    """Four threads send two large images each at once; the stub's peak RSS."""
    results: list = [None] * 4

    def send(index: int) -> None:
        try:
            results[index] = infer_images(triton, [large, large]).shape
        except Exception as error:  # recorded and asserted below
            results[index] = error

    started = time.monotonic()
    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    peak = stub.memory_info().rss
    while any(thread.is_alive() for thread in threads) and time.monotonic() - started < 60:
        peak = max(peak, stub.memory_info().rss)
        time.sleep(0.05)
    for thread in threads:
        thread.join(timeout=5)
    assert results == [(2, 1000)] * 4, results
    return peak, time.monotonic() - started


# --- memory ceilings ------------------------------------------------------------------


def test_a_machine_with_nvidia_devices_is_told_by_their_numbered_nodes(tmp_path):
    (tmp_path / "nvidiactl").touch()
    (tmp_path / "nvidia-uvm").touch()
    assert not has_nvidia_devices(tmp_path)  # the driver's control nodes alone: no card
    (tmp_path / "nvidia0").touch()
    assert has_nvidia_devices(tmp_path)


def test_only_the_stubs_of_gpu_instances_go_without_a_ceiling():
    """CUDA reserves address space for the card: a KIND_GPU stub under a quarter of an
    H100 machine's memory failed its first small allocation."""
    configs = [
        {"name": "preprocess", "instance_group": [{"kind": "KIND_GPU", "count": 1}]},
        {"name": "classifier", "instance_group": [{"kind": "KIND_CPU", "count": 2}]},
        {"name": "mixed", "instance_group": [{"kind": "KIND_CPU"}, {"kind": "KIND_GPU"}]},
        {"name": "ensemble", "platform": "ensemble"},
    ]
    assert gpu_models(configs) == {"preprocess", "mixed"}


def test_server_and_each_stub_have_their_memory_ceiling(triton, hostile_repository):
    server = psutil.Process(triton.pid)
    assert server.rlimit(psutil.RLIMIT_AS) == (LIMITS.server_bytes,) * 2
    live, _ = server_stubs(triton.pid)
    assert poll(
        lambda: all(psutil.Process(pid).rlimit(psutil.RLIMIT_AS) == (LIMITS.stub_bytes,) * 2 for pid in live), 5
    )
    # One stub a model instance: the preprocessing models, the Pillow model and the classifier's instances.
    stubs = sum(
        sum(group.count for group in read_config(folder).instance_group)
        for folder in hostile_repository.iterdir()
        if read_config(folder).backend
    )
    assert len(live) == stubs >= 5


def test_a_runaway_model_fails_alone_at_its_ceiling(triton):
    """A model whose budget is above its memory: 24 real 4000x4000 images (384 MP,
    1.1 GB decoded) in one request hit the stub's 2 GiB ceiling. That request gets
    an error saying so; the stub, the server and the other models keep serving."""
    stub = dali_stub(triton, UNBUDGETED)
    client = httpclient.InferenceServerClient(triton.http_url, network_timeout=ANSWER_S)
    batch = pad_batch([png(4000, 4000)] * 24)
    tensor = httpclient.InferInput("DALI_INPUT_0", list(batch.shape), "UINT8")
    tensor.set_data_from_numpy(batch, binary_data=True)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as failed:
        client.infer(UNBUDGETED, [tensor])
    assert time.monotonic() - started < ANSWER_S
    assert failed.value.status() == "400"
    assert "memory ceiling" in failed.value.message()
    assert stub.is_running() and stub.memory_info().rss < LIMITS.stub_bytes
    assert triton.is_ready() and classify_coffee(triton) == "espresso"
    small = pad_batch([photo_bytes("coffee.png")])
    tensor = httpclient.InferInput("DALI_INPUT_0", list(small.shape), "UINT8")
    tensor.set_data_from_numpy(small, binary_data=True)
    assert client.infer(UNBUDGETED, [tensor]).as_numpy("DALI_OUTPUT_0").shape == (1, 3, 224, 224)
    client.close()


# --- hostile requests, one table ----------------------------------------------------
# Each case returns (HTTP status, or "closed" when Triton answers nothing, and the
# answer's text). Expected: status and words of the message.


def post_infer(server: TritonServer, header: dict, binary: bytes = b"", model: str = ENSEMBLE):
    body = json.dumps(header).encode()
    response = requests.post(
        f"http://{server.http_url}/v2/models/{model}/infer",
        data=body + binary,
        headers={"Inference-Header-Content-Length": str(len(body))},
        timeout=ANSWER_S,
    )
    return response.status_code, response.text


def binary_input(shape, size: int, datatype: str = "UINT8") -> dict:
    return {
        "inputs": [{"name": "INPUT", "shape": shape, "datatype": datatype, "parameters": {"binary_data_size": size}}]
    }


def raw_http(server: TritonServer, request: bytes):
    """Send bytes as they are; (status, text) or ("closed", "") when the
    connection ends with no answer."""
    with socket.create_connection((server.config.host, server.config.http_port), timeout=ANSWER_S) as connection:
        connection.sendall(request)
        answer = b""
        try:
            while chunk := connection.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer:
                    break
        except ConnectionResetError:
            pass
    if not answer:
        return "closed", ""
    return int(answer.split()[1]), answer.decode(errors="replace")


def image_request(images: list[bytes]) -> tuple[dict, bytes]:
    batch = pad_batch(images)
    return binary_input(list(batch.shape), batch.size), batch.tobytes()


def case_shape_lie(server):  # shape says 100 bytes, 10 are sent
    return post_infer(server, binary_input([1, 100], 10), bytes(10))


def case_negative_dim(server):
    return post_infer(server, binary_input([1, -5], 10), bytes(10))


def case_negative_binary_size(server):
    return post_infer(server, binary_input([1, 10], -10), bytes(10))


def case_dtype_lie(server):  # 4 bytes per element declared, 1 sent
    return post_infer(server, binary_input([1, 10], 10, "FP32"), bytes(10))


def case_json_data_not_numbers(server):
    return post_infer(
        server, {"inputs": [{"name": "INPUT", "shape": [1, 3], "datatype": "UINT8", "data": ["a", {"b": 1}, None]}]}
    )


def case_large_json_body(server):  # 10 MB of JSON numbers, not an image
    count = 3_000_000
    return post_infer(
        server, {"inputs": [{"name": "INPUT", "shape": [1, count], "datatype": "UINT8", "data": [255] * count}]}
    )


def case_json_nested_100000(server):
    body = deep_json(100_000)
    response = requests.post(f"http://{server.http_url}/v2/models/{ENSEMBLE}/infer", data=body, timeout=ANSWER_S)
    return response.status_code, response.text


def case_url_8kb(server):
    return raw_http(server, f"GET /v2/models/{'x' * 8192}/ready HTTP/1.1\r\nHost: a\r\n\r\n".encode())


def case_header_16kb(server):
    return raw_http(server, f"GET /v2/health/ready HTTP/1.1\r\nHost: a\r\nX-Big: {'x' * 16384}\r\n\r\n".encode())


def case_bomb_by_header(server):
    return post_infer(server, *image_request([decompression_bomb()]))


def case_bomb_by_real_size(server):  # 3 real 4000x4000 images: 48 MP, 170 KB sent
    return post_infer(server, *image_request([png(4000, 4000)] * 3))


def case_bomb_by_real_size_pillow_model(server):  # the same budget module, in the Pillow model
    return post_infer(server, *image_request([png(4000, 4000)] * 3), model=PILLOW_ENSEMBLE)


def case_bomb_by_header_pillow_model(server):
    return post_infer(server, *image_request([decompression_bomb()]), model=PILLOW_ENSEMBLE)


def case_shm_key_linux_refuses(server):
    """A system shared-memory key with a slash inside: the admin API (403 without
    the key; with it, Triton's own 500)."""
    url = f"http://{server.http_url}/v2/systemsharedmemory/region/r1/register"
    body = {"key": "/a/b/c", "offset": 0, "byte_size": 64}
    refused = requests.post(url, json=body, timeout=ANSWER_S)
    assert refused.status_code == 403
    response = requests.post(url, json=body, headers=server.admin_headers("http"), timeout=ANSWER_S)
    return response.status_code, response.text


def case_grpc_70mb_refused(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("INPUT", [1, 70 * MiB], "UINT8")
    tensor.set_data_from_numpy(np.zeros((1, 70 * MiB), np.uint8))
    try:
        client.infer(ENSEMBLE, [tensor], client_timeout=ANSWER_S)
        return 200, ""
    except InferenceServerException as error:
        return 400 if error.status() == "StatusCode.INVALID_ARGUMENT" else error.status(), error.message()
    finally:
        client.close()


def case_slow_client(server):
    """A client that sends its headers a byte at a time (~2 s): others are served
    meanwhile, and it is answered at the end. (Its request line is sent whole: sent
    a byte at a time too, Triton 2.51 answered 404.)"""
    headers = b"Host: a\r\nX-Slow: " + b"x" * 20 + b"\r\n\r\n"
    with socket.create_connection((server.config.host, server.config.http_port), timeout=ANSWER_S) as slow:
        slow.sendall(b"GET /v2/health/ready HTTP/1.1\r\n")
        for index, byte in enumerate(headers):
            slow.send(bytes([byte]))
            if index % 15 == 0:
                assert classify_coffee(server) == "espresso"
            time.sleep(0.05)
        answer = slow.recv(4096)
    return (int(answer.split()[1]), "answered at last") if answer else ("closed", "")


def case_1000_idle_connections(server):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 1200:  # the client's own limit, not the server's
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1200, hard), hard))
    idle = []
    try:
        for _ in range(1000):
            idle.append(socket.create_connection((server.config.host, server.config.http_port), timeout=ANSWER_S))
        assert classify_coffee(server) == "espresso"
        return 200, "served with 1000 idle connections open"
    finally:
        for connection in idle:
            connection.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# case: (expected status, words of the answer); "closed" = no answer at all.
HOSTILE = {
    case_shape_lie: (400, ["byte size mismatch", "Expected 100, got 10"]),
    case_negative_dim: (500, []),  # Triton 2.51's own parser: a client error answered as 500
    case_negative_binary_size: (500, []),  # the same
    case_dtype_lie: (400, ["INPUT", "FP32"]),
    case_json_data_not_numbers: (500, ["Unable to parse 'data'"]),  # Triton's own parser
    case_large_json_body: (400, ["cannot be decoded", "decoders.image"]),
    case_json_nested_100000: (400, []),
    case_url_8kb: ("closed", []),  # Triton 2.51 closes, no 414
    case_header_16kb: ("closed", []),  # no 431
    case_bomb_by_header: (400, ["60000x60000", "max_pixels 20000000"]),
    case_bomb_by_real_size: (400, ["48000000 pixels in total", "max_request_pixels 40000000"]),
    case_bomb_by_real_size_pillow_model: (400, ["48000000 pixels in total", "max_request_pixels 40000000"]),
    case_bomb_by_header_pillow_model: (400, ["60000x60000", "max_pixels 20000000"]),
    case_shm_key_linux_refuses: (500, []),  # Triton's: only the admin gets here
    case_grpc_70mb_refused: (400, ["max_input_bytes"]),
    case_slow_client: (200, []),
    case_1000_idle_connections: (200, []),
}
# tritonserver's RSS may grow by this much in one case (a refused 70 MB gRPC request
# leaves ~150 MB in Triton 2.51; the rest far less).
SERVER_GROWTH = 400 * MiB


@pytest.mark.parametrize("case", list(HOSTILE), ids=[case.__name__.removeprefix("case_") for case in HOSTILE])
def test_hostile_request_is_answered_and_the_server_serves_on(triton, case):
    expected_status, words = HOSTILE[case]
    server = psutil.Process(triton.pid)
    pid, before = triton.pid, server.memory_info().rss
    started = time.monotonic()
    status, text = case(triton)
    took = time.monotonic() - started
    print(f"{case.__name__}: {status} in {took:.2f} s: {text[:300]}")  # shown with -s
    assert status == expected_status, (status, text[:500])
    assert all(word in text for word in words), text[:500]
    assert took < ANSWER_S
    assert triton.pid == pid  # no crash, no restart
    assert triton.is_ready() and classify_coffee(triton) == "espresso"
    assert server.memory_info().rss - before < SERVER_GROWTH


def test_restarts_are_bounded_and_the_cause_logged(tmp_path, caplog):
    """A server that cannot start again (its model repository gone while it is
    dead) is retried a bounded number of times, then given up on, causes logged."""
    repository = tmp_path / "repository"
    repository.mkdir()
    server = TritonServer(ServerConfig(repository, stop_grace_s=5)).start()  # no models: starts in seconds
    try:
        server.restarter.attempts, server.restarter.first_wait_s = 2, 0.1
        repository.rmdir()
        os.kill(server.pid, signal.SIGKILL)
        assert server.restarter.gave_up.wait(RECOVERY_S)
        assert server.restarter.deaths[0][1] == "killed by SIGKILL" and not server.restarter.restarts
        assert "tritonserver died while it should run (killed by SIGKILL)" in caplog.text
        assert "did not come back after 2 attempts" in caplog.text
        assert "failed to stat file" in caplog.text  # the start-up error says why
    finally:
        server.stop()


def test_check_refuses_a_budget_that_refuses_everything(model_repository, tmp_path):
    from tritonstack.build.check import check_repository

    shutil.copytree(model_repository / PILLOW, tmp_path / PILLOW)
    assert check_repository(tmp_path) == []
    add_parameters(tmp_path / PILLOW, {"max_request_pixels": "500", "max_batch_pixels": "100"})
    messages = [problem.message for problem in check_repository(tmp_path)]
    assert any("max_request_pixels 500 is above max_batch_pixels 100" in m for m in messages), messages
    problems = check_repository(tmp_path)
    assert any(
        p.field.startswith("model_warmup") and "(451x300), above this model's max_request_pixels 500" in p.message
        for p in problems
    ), problems  # its own warmup image would be refused
