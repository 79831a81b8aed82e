"""Admission under overload, on a real server whose ensemble's first step has a small
queue bound: refusals come at once with a clear status over both protocols, the
client's deadline reaches the server's queues, requests given up are not computed,
and the client's retries stay within their budget."""

from __future__ import annotations

import asyncio
import io
import time

import numpy as np
import pytest
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from tests import repo_factory as rf
from tritonstack.build.presets import BuildOptions, preset_named
from tritonstack.build.repository import write_repository
from tritonstack.client.aio import AsyncClassifierClient
from tritonstack.client.protocol import request_deadline_options
from tritonstack.client.retry import (
    NO_RETRY,
    QUEUE_FULL,
    RetryPolicy,
    RetryThrottle,
    describe_error,
    is_expired,
    is_refusal,
)
from tritonstack.contract import PREPROCESS_INPUT, pad_batch
from tritonstack.samples import photo_bytes, photo_path
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import ServerConfig

FIRST_STEP = "preprocess_dali_efficientnet_lite0"
QUEUE_BOUND = 2
BURST = 48
BLOCKER_IMAGES = 8


@pytest.fixture(scope="module")
def admission_server(tmp_path_factory, model_repository):
    """The Lite0 ensemble with a queue of QUEUE_BOUND before its first step."""
    out = tmp_path_factory.mktemp("admission")
    rf.seed_lite0_export(out)
    options = BuildOptions(max_queue_size=QUEUE_BOUND, queue_timeout_ms=5000)
    write_repository(out, presets=(preset_named("dali_efficientnet_lite0"),), options=options)
    with TritonServer(ServerConfig(out, restricted_apis=())) as running:
        yield running


def url_of(server, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.http_url


async def burst(server, protocol: str, count: int, timeout_s: float = 30.0, retry=NO_RETRY):
    """`count` one-image requests at once; (latency, error or None) for each."""
    image = photo_bytes("coffee.png")
    async with AsyncClassifierClient(url_of(server, protocol), protocol, retry=retry, timeout_s=timeout_s) as client:

        async def one():
            started = time.perf_counter()
            try:
                await client.probabilities([image])
                return time.perf_counter() - started, None
            except InferenceServerException as error:
                return time.perf_counter() - started, error

        return await asyncio.gather(*(one() for _ in range(count)))


@pytest.fixture(scope="module")
def blocker() -> np.ndarray:
    """A request that keeps the first step busy for a while: 8 photos of 12 MP."""
    with Image.open(photo_path("coffee.png")) as opened:
        large = opened.convert("RGB").resize((4000, 3000))
    buffer = io.BytesIO()
    large.save(buffer, "JPEG", quality=90)
    return pad_batch([buffer.getvalue()] * BLOCKER_IMAGES)


def step_stats(server, model: str) -> dict:
    with httpclient.InferenceServerClient(server.http_url) as client:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    return {"inferences": int(stats["inference_count"]), "failed": int(stats["inference_stats"]["fail"]["count"])}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_full_queue_refuses_at_once_with_a_clear_status(admission_server, protocol):
    outcomes = asyncio.run(burst(admission_server, protocol, BURST))
    refused = [(latency, error) for latency, error in outcomes if error is not None]
    answered = [latency for latency, error in outcomes if error is None]
    assert refused and answered, f"{len(refused)} refused, {len(answered)} answered"
    expected_status = "503" if protocol == "http" else "StatusCode.UNAVAILABLE"
    for _, error in refused:  # every request ended: answered or refused, nothing else
        assert is_refusal(error) and error.status() == expected_status, (error.status(), error.message())
        assert QUEUE_FULL in error.message()
        assert "queue is full" in describe_error(error) and "retry later" in describe_error(error)
    # Refused before any work: faster than the answers, which waited for theirs.
    assert sorted(latency for latency, _ in refused)[len(refused) // 2] < sorted(answered)[len(answered) // 2]


def test_the_clients_deadline_reaches_the_servers_queue(admission_server, blocker):
    """A request whose deadline passes while it is queued is refused by the server,
    not decoded: the client sends its timeout as the request's `timeout`."""
    assert request_deadline_options("http", 0.5) == {"timeout": 250_000}  # two queues share it
    assert request_deadline_options("grpc", 0.5) == {"timeout": 250_000, "client_timeout": 0.5}
    before = step_stats(admission_server, FIRST_STEP)
    with httpclient.InferenceServerClient(admission_server.http_url, concurrency=2, network_timeout=60) as client:
        running = client.async_infer(FIRST_STEP, [http_input(blocker)])
        time.sleep(0.2)  # the blocker runs: what follows waits behind it
        late = []
        for _ in range(QUEUE_BOUND):
            try:
                client.infer(
                    FIRST_STEP,
                    [http_input(pad_batch([photo_bytes("coffee.png")]))],
                    **request_deadline_options("http", 1e-6),
                )
            except InferenceServerException as error:
                late.append(error)
        running.get_result()
    assert len(late) == QUEUE_BOUND and all(is_expired(error) for error in late), [describe_error(e) for e in late]
    assert "deadline passed" in describe_error(late[0])
    after = step_stats(admission_server, FIRST_STEP)
    assert after["failed"] - before["failed"] >= len(late)
    assert after["inferences"] - before["inferences"] == BLOCKER_IMAGES  # none of the late ones


def http_input(batch: np.ndarray) -> httpclient.InferInput:
    tensor = httpclient.InferInput(PREPROCESS_INPUT, list(batch.shape), "UINT8")
    tensor.set_data_from_numpy(batch)
    return tensor


def test_a_cancelled_request_is_not_computed(admission_server, blocker):
    """gRPC deadlines cancel requests in Triton; a cancelled request queued at a step
    (Triton drops it) or already in a batch (our backend skips it) costs no decode."""

    def grpc_input(batch: np.ndarray):
        tensor = grpc_aio.InferInput(PREPROCESS_INPUT, list(batch.shape), "UINT8")
        tensor.set_data_from_numpy(batch)
        return [tensor]

    async def cancelled_calls() -> list:
        async with grpc_aio.InferenceServerClient(admission_server.grpc_url) as client:
            running = asyncio.create_task(client.infer(FIRST_STEP, grpc_input(blocker), client_timeout=60))
            await asyncio.sleep(0.2)  # the blocker runs: what follows waits behind it
            image = pad_batch([photo_bytes("coffee.png")])
            calls = [client.infer(FIRST_STEP, grpc_input(image), client_timeout=0.05) for _ in range(QUEUE_BOUND)]
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            await running
        return outcomes

    before = step_stats(admission_server, FIRST_STEP)
    outcomes = asyncio.run(cancelled_calls())
    assert all(isinstance(outcome, InferenceServerException) for outcome in outcomes), outcomes
    assert {outcome.status() for outcome in outcomes} == {"StatusCode.DEADLINE_EXCEEDED"}
    time.sleep(1.0)  # whatever was still queued has been dropped or skipped by now
    after = step_stats(admission_server, FIRST_STEP)
    assert after["inferences"] - before["inferences"] == BLOCKER_IMAGES  # none of the cancelled ones


def test_refusals_are_retried_within_the_budget(admission_server):
    """A burst that is mostly refused: with three retries each and no budget it would
    send up to four times the requests; the budget allows about one retry in ten."""
    attempts = 0
    policy = RetryPolicy(retries=3, base_delay_s=0.001, max_delay_s=0.002)

    async def counted_burst():
        nonlocal attempts
        image = photo_bytes("coffee.png")
        async with AsyncClassifierClient(admission_server.grpc_url, "grpc", retry=policy, timeout_s=30) as client:
            infer = client._infer

            async def counting(*args, **kwargs):
                nonlocal attempts
                attempts += 1
                return await infer(*args, **kwargs)

            client._infer = counting
            return await asyncio.gather(*(client.probabilities([image]) for _ in range(BURST)), return_exceptions=True)

    outcomes = asyncio.run(counted_burst())
    refused = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
    assert refused and all(is_refusal(error) for error in refused)
    budget = RetryThrottle()
    assert attempts <= BURST + budget.max_tokens / 2 + 1, f"{attempts} attempts for {BURST} requests"


def test_the_retry_budget_refills_only_by_successes():
    throttle = RetryThrottle(max_tokens=10, token_ratio=0.1)
    allowed = sum(throttle.allows_retry() for _ in range(100))
    assert allowed == 4  # 10 -> 9, 8, 7, 6 allowed; at 5 and below none
    for _ in range(9):
        throttle.on_success()
    assert not throttle.allows_retry()  # 0.9 tokens earned, taken by this refusal
    for _ in range(100):
        throttle.on_success()
    assert throttle.allows_retry()
