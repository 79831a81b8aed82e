"""The client library against the real server: every transport and mode
(HTTP/gRPC, sync/asyncio, binary data/system shared memory), batching, errors
per image, retries only where they help, timeouts, readiness."""

from __future__ import annotations

import asyncio
import os
import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import MODEL_REPOSITORY
from tests.reference import read_labels
from tritonstack.client.aio import AsyncClassifierClient
from tritonstack.client.classifier import ClassifierClient
from tritonstack.client.protocol import build_request
from tritonstack.client.retry import NO_RETRY, RetryPolicy, ServerUnavailableError, describe_error, is_retryable
from tritonstack.client.shm import PREFIX
from tritonstack.contract import BATCH_PRIORITY, DEFAULT_MODEL, ENSEMBLE_INPUT
from tritonstack.samples.photos import PHOTOS, photo_bytes
from tritonstack.serve.network import free_port

NAMES = ["coffee.png", "chelsea.png", "rocket.jpg"]
MODES = [
    (protocol, use_async, shm)
    for protocol in ("http", "grpc")
    for use_async in (False, True)
    for shm in ("none", "system")
]


def url_of(server, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def our_registered_regions(server, protocol: str) -> list[str]:
    headers = server.admin_headers(protocol)
    if protocol == "http":
        status = httpclient.InferenceServerClient(server.http_url).get_system_shared_memory_status(headers=headers)
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        status = client.get_system_shared_memory_status(headers=headers, as_json=True).get("regions", {}).values()
    # Only this process's regions: other tests' clients share the session server.
    return [region["name"] for region in status if region["name"].startswith(f"{PREFIX}_{os.getpid()}_")]


def our_dev_shm_files() -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"{PREFIX}_{os.getpid()}_")]


def run_mode(server, protocol, use_async, shm, work):
    """work(client) -> result, with a sync or an asyncio client (awaited)."""
    options = {"shm": shm, "headers": server.admin_headers(protocol)}
    if not use_async:
        with ClassifierClient(url_of(server, protocol), protocol, **options) as client:
            return work(client)

    async def run():
        async with AsyncClassifierClient(url_of(server, protocol), protocol, **options) as client:
            return await work(client)

    return asyncio.run(run())


@pytest.mark.parametrize("protocol,use_async,shm", MODES)
def test_every_transport_and_mode_classifies_known_photos(server, protocol, use_async, shm):
    images = [photo_bytes(name) for name in NAMES]
    tops, probabilities = run_mode(server, protocol, use_async, shm, lambda c: _tops_and_probabilities(c, images))
    assert [top[0].label in PHOTOS[name] for name, top in zip(NAMES, tops)] == [True] * 3, tops
    assert tops[0][0].index == 967
    assert [len(top) for top in tops] == [3, 3, 3]
    assert probabilities.shape == (3, 1000)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-4)
    # The ranking agrees with the probabilities, however they travelled.
    assert [top[0].index for top in tops] == list(probabilities.argmax(axis=1))
    assert our_registered_regions(server, protocol) == []
    assert our_dev_shm_files() == []


def _tops_and_probabilities(client, images):
    if isinstance(client, AsyncClassifierClient):

        async def both():
            return await client.classify(images, top_k=3), await client.probabilities(images)

        return both()
    return client.classify(images, top_k=3), client.probabilities(images)


def test_shared_memory_matches_binary_tensor_data(server):
    images = [photo_bytes(name) for name in NAMES]
    with (
        ClassifierClient(server.grpc_url, "grpc") as plain,
        ClassifierClient(server.grpc_url, "grpc", shm="system", headers=server.admin_headers("grpc")) as shared,
    ):
        np.testing.assert_allclose(shared.probabilities(images), plain.probabilities(images), atol=1e-6)
        # Labels by index, as written in the repository's label file (not one client
        # compared with another).
        assert shared.labels(images[0]) == read_labels(MODEL_REPOSITORY / "efficientnet_lite0" / "labels.txt")
        assert len(our_registered_regions(server, "grpc")) == 2  # in use: input and output
    assert our_registered_regions(server, "grpc") == []


def test_model_info_comes_from_the_server(server):
    with ClassifierClient(server.http_url, "http") as client:
        info = client.info
    assert (info.input_name, info.input_datatype) == ("INPUT", "UINT8")
    assert (info.output_name, info.output_datatype, info.output_shape) == ("OUTPUT", "FP32", (1000,))
    config = httpclient.InferenceServerClient(server.http_url).get_model_config(info.name)
    assert info.max_batch_size == config["max_batch_size"] > 0


def test_more_images_than_max_batch_size_go_in_several_requests(server):
    with ClassifierClient(server.grpc_url, "grpc") as client:
        count = client.info.max_batch_size + 3
        tops = client.classify([photo_bytes("coffee.png")] * count, top_k=1)
    assert [top[0].label for top in tops] == ["espresso"] * count


@pytest.mark.parametrize("protocol,use_async,shm", [("http", False, "system"), ("grpc", True, "none")])
def test_a_broken_image_fails_alone_and_regions_are_still_released(server, protocol, use_async, shm):
    images = [photo_bytes("coffee.png"), b"\xff\xd8\xff not really a JPEG", photo_bytes("chelsea.png")]
    outcomes = run_mode(server, protocol, use_async, shm, lambda client: client.classify_each(images, top_k=1))
    assert outcomes[0][0].label == "espresso"
    assert outcomes[2][0].label in PHOTOS["chelsea.png"]
    assert isinstance(outcomes[1], InferenceServerException)
    assert str(outcomes[1].status()) in {"400", "StatusCode.UNKNOWN"}
    assert not is_retryable(outcomes[1])
    assert our_registered_regions(server, protocol) == []
    assert our_dev_shm_files() == []


@pytest.mark.parametrize("use_async", [False, True])
def test_close_releases_a_region_whose_registration_state_was_lost(server, use_async):
    """A registration cut short (a timeout, a cancelled task) may have reached the
    server while the client still thinks the region unregistered."""

    def forget_after_one_request(client):
        result = client.classify([photo_bytes("coffee.png")], top_k=1)
        for regions in getattr(client, "_all_regions", None) or [client._regions]:
            regions.forget_registration()
        return result

    async def forget_async(client):
        result = await client.classify([photo_bytes("coffee.png")], top_k=1)
        for regions in client._all_regions:
            regions.forget_registration()
        return result

    tops = run_mode(server, "grpc", use_async, "system", forget_async if use_async else forget_after_one_request)
    assert tops[0][0].label == "espresso"
    assert our_registered_regions(server, "grpc") == []
    assert our_dev_shm_files() == []


def fail_next_inference(client) -> None:
    """The asyncio client's next inference fails once as if its connection dropped
    before the request reached the server (UNAVAILABLE: retried); the server is real."""
    infer = client._client.infer

    async def fail_once(*args, **kwargs):
        client._client.infer = infer
        raise InferenceServerException("connection reset (injected by the test)", status="StatusCode.UNAVAILABLE")

    client._client.infer = fail_once


def test_a_retried_request_leaves_the_other_requests_regions_registered(server):
    """Many requests in flight in shared memory, each with its own regions; one is
    retried after a transient failure. That says nothing of the other regions: they
    stay registered as the server has them, and when a bigger image comes, each is
    unregistered before it is registered again at its new size (registering a name
    the server still has fails: ALREADY_EXISTS)."""
    small, big = photo_bytes("rocket.jpg"), photo_bytes("coffee.png")  # 110 KB, 460 KB: regions grow
    concurrent = 8

    async def work(client):
        first = await asyncio.gather(*(client.probabilities([small]) for _ in range(concurrent)))
        assert len(our_registered_regions(server, "grpc")) == 2 * concurrent
        fail_next_inference(client)
        retried = await client.probabilities([small])
        grown = await asyncio.gather(*(client.probabilities([big]) for _ in range(concurrent)))
        assert len(our_registered_regions(server, "grpc")) == 2 * concurrent  # grown, none added
        return first + [retried], grown

    async def run():
        options = {"shm": "system", "headers": server.admin_headers("grpc"), "retry": RetryPolicy(base_delay_s=0.01)}
        async with AsyncClassifierClient(server.grpc_url, "grpc", **options) as client:
            return await work(client)

    smalls, bigs = asyncio.run(run())
    assert {int(p.argmax()) for p in smalls} == {int(smalls[0].argmax())} and len(smalls) == concurrent + 1
    assert [int(p.argmax()) for p in bigs] == [967] * concurrent  # espresso
    assert our_registered_regions(server, "grpc") == []
    assert our_dev_shm_files() == []


def test_a_request_given_up_on_keeps_its_regions_out_of_the_next_ones_way(server):
    """A cancelled request may still be running in the server, reading its input region
    and about to write its output region. The next request must not use them: it gets
    its own, and the given-up pair comes back to the pool only once the server let go."""
    big, small = [photo_bytes("coffee.png")] * 8, photo_bytes("rocket.jpg")

    async def work(client):
        await client.probabilities([small])  # one pair, registered, in the pool
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.probabilities(big), 0.02)  # the server is still on it
        assert client._free_regions == []  # not handed to the next request
        answer = await client.probabilities([small])
        for _ in range(600):  # the server lets go within its ~0.2 s of work
            if len(client._free_regions) == 2:
                break
            await asyncio.sleep(0.01)
        return answer, len(client._free_regions), len(client._all_regions)

    async def run():
        options = {"shm": "system", "headers": server.admin_headers("grpc")}
        async with AsyncClassifierClient(server.grpc_url, "grpc", **options) as client:
            return await work(client)

    answer, free, allocated = asyncio.run(run())
    assert (
        read_labels(MODEL_REPOSITORY / "efficientnet_lite0" / "labels.txt")[int(answer[0].argmax())]
        in PHOTOS["rocket.jpg"]
    )
    assert (free, allocated) == (2, 2)  # the given-up pair came back
    assert our_registered_regions(server, "grpc") == []
    assert our_dev_shm_files() == []


def test_a_sync_request_that_timed_out_waits_for_the_server_to_let_go(server):
    """The sync client's one pair of regions: after a request it gave up on (its
    timeout), the next one uses them only once the server let go of them."""
    big = [photo_bytes("coffee.png")] * 8
    options = {"shm": "system", "headers": server.admin_headers("grpc"), "timeout_s": 0.05, "retry": NO_RETRY}
    with ClassifierClient(server.grpc_url, "grpc", **options) as client:
        with pytest.raises(InferenceServerException):
            client.probabilities(big)
        assert not any(region.registered for region in client._regions)
        assert our_registered_regions(server, "grpc") == []  # unregistered: the server let go
    assert our_dev_shm_files() == []


@pytest.mark.parametrize("use_async", [False, True])
def test_close_waits_until_the_server_lets_go_of_a_region_in_use(server, use_async):
    """Triton refuses to unregister a region that a request still holds: one a task
    gave up on, or one answered a moment ago (the server lets go of its regions a
    little after the answer). Close asks again until the server lets go, instead of
    leaving the region registered for good."""
    images = [photo_bytes("coffee.png")] * 4
    answered: queue.SimpleQueue = queue.SimpleQueue()
    other = grpcclient.InferenceServerClient(server.grpc_url)

    def hold_the_regions(client) -> None:
        """A request of our own on the client's regions, still in the server when close begins."""
        regions = client._all_regions[0] if use_async else client._regions
        inputs, outputs = build_request("grpc", client.info, client.info.encode(images), 0, regions)
        other.async_infer(client.info.name, inputs, lambda result, error: answered.put(error), outputs=outputs)
        time.sleep(0.02)  # in the server by now; its 4 images take it ~0.1 s on an idle machine

    def work(client):
        client.probabilities(images)  # the regions, at the size of these images
        hold_the_regions(client)

    async def work_async(client):
        await client.probabilities(images)
        hold_the_regions(client)

    run_mode(server, "grpc", use_async, "system", work_async if use_async else work)
    assert answered.get(timeout=60) is None  # its regions were there until it ended
    other.close()
    assert our_registered_regions(server, "grpc") == []
    assert our_dev_shm_files() == []


def test_client_errors_are_never_retried(server):
    retried = []
    policy = RetryPolicy(retries=3, base_delay_s=0.01)
    with ClassifierClient(server.http_url, "http", retry=NO_RETRY) as client:
        with pytest.raises(InferenceServerException) as raised:
            policy.call(lambda: client.classify([b"not an image"]), on_retry=retried.append)
    assert raised.value.status() == "400"
    assert retried == []


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_connection_errors_are_retried_then_reported(protocol):
    retried = []
    policy = RetryPolicy(retries=3, base_delay_s=0.01)
    url = f"127.0.0.1:{free_port()}"
    client = (httpclient if protocol == "http" else grpcclient).InferenceServerClient(url)
    with pytest.raises(Exception) as raised:
        policy.call(client.is_server_ready, on_retry=retried.append)
    assert is_retryable(raised.value)
    assert len(retried) == 3


@pytest.mark.parametrize("protocol,use_async", [("http", False), ("grpc", False), ("http", True), ("grpc", True)])
def test_no_server_gives_a_clear_message(protocol, use_async):
    url = f"127.0.0.1:{free_port()}"
    quick = RetryPolicy(retries=1, base_delay_s=0.01)
    with pytest.raises(ServerUnavailableError) as raised:
        if use_async:
            asyncio.run(AsyncClassifierClient(url, protocol, retry=quick).connect())
        else:
            ClassifierClient(url, protocol, retry=quick)
    assert f"no Triton server at {url}" in str(raised.value)
    assert "make serve" in str(raised.value)


def test_an_unknown_model_is_reported_not_retried(server):
    with pytest.raises(ServerUnavailableError, match="model 'no_such_model' is not ready"):
        ClassifierClient(
            server.http_url, "http", model="no_such_model", retry=RetryPolicy(retries=1, base_delay_s=0.01)
        )


@pytest.mark.parametrize("use_async", [False, True])
def test_a_request_slower_than_its_timeout_fails_as_timed_out(server, use_async):
    images = [photo_bytes("chelsea.png")] * 8
    timeout_s = 0.001

    async def run_async():
        async with AsyncClassifierClient(server.grpc_url, "grpc", timeout_s=timeout_s) as client:
            return await client.classify_each(images)

    if use_async:
        outcomes = asyncio.run(run_async())
    else:
        with ClassifierClient(server.grpc_url, "grpc", timeout_s=timeout_s) as client:
            outcomes = client.classify_each(images)
    assert {describe_error(outcome, timeout_s) for outcome in outcomes} == {"timed out after 0.001 s"}


def test_our_http_client_asks_for_answers_that_need_no_inflating(server):
    """aiohttp asks for gzip by default and Triton then compresses each answer; the
    headers our client sends ask for none, and the answer comes as it is."""
    import io

    import aiohttp
    from PIL import Image

    picture = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(picture, "JPEG")
    encoded = list(picture.getvalue())
    body = {
        "inputs": [{"name": ENSEMBLE_INPUT, "shape": [1, len(encoded)], "datatype": "UINT8", "data": encoded}],
        "parameters": {"priority": BATCH_PRIORITY},  # answered whatever an earlier test left queued
    }
    url = f"http://{server.http_url}/v2/models/{DEFAULT_MODEL}/infer"
    ours = AsyncClassifierClient(server.http_url, "http", retry=NO_RETRY)._headers()

    async def content_encoding(headers) -> str | None:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            async with session.post(url, json=body, headers=headers) as response:
                assert response.status == 200, await response.text()
                return response.headers.get("Content-Encoding")

    assert asyncio.run(content_encoding(None)) == "gzip"  # aiohttp's default asks for it
    assert asyncio.run(content_encoding(ours)) is None
