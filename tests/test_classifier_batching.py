"""The committed classifiers prefer batches of 8 on the CPU (`preferred_batch_size`,
build option `--classifier-batch`): queued single-image requests are run 8 at a
time at most, while one request of more images still runs whole. Checked on the
session's server from Triton's own batch statistics, before and after."""

from __future__ import annotations

import asyncio
from collections import Counter

import tritonclient.http as httpclient

from tests.processes import wait_for
from tritonstack.build.presets import BuildOptions
from tritonstack.client.aio import AsyncClassifierClient
from tritonstack.client.retry import NO_RETRY
from tritonstack.repository_files import read_config
from tritonstack.samples.photos import photo_bytes

ENSEMBLE = "ensemble_dali_efficientnet_lite0"
CLASSIFIER = "efficientnet_lite0"
PREFERRED = BuildOptions().classifier_batch
IN_FLIGHT = 4 * PREFERRED  # several preferred batches queue behind a ~7 ms classifier run


def executions_by_batch_size(server, model: str) -> Counter:
    with httpclient.InferenceServerClient(server.http_url) as client:
        stats = client.get_inference_statistics(model, headers=server.admin_headers("http"))["model_stats"][0]
    return Counter(
        {int(entry["batch_size"]): int(entry["compute_infer"]["count"]) for entry in stats.get("batch_stats", [])}
    )


def executions_since(server, model: str, before: Counter, images: int) -> Counter:
    """The executions since `before`, once they cover `images` images: Triton records a
    batch's statistics after it answers, so a read right after the answer may miss it."""
    return wait_for(
        lambda: (
            (ran := executions_by_batch_size(server, model) - before)
            and sum(size * count for size, count in ran.items()) >= images
            and ran
        ),
        timeout_s=10,
        what=f"statistics of {images} images",
    )


async def send(url: str, requests: list[list[bytes]]) -> None:
    # Batch priority: every request waits its turn, none is refused at the latency objective.
    async with AsyncClassifierClient(url, "grpc", ENSEMBLE, retry=NO_RETRY, timeout_s=60, batch=True) as client:
        results = await asyncio.gather(*(client.probabilities(images) for images in requests))
    assert [len(result) for result in results] == [len(images) for images in requests]


def test_the_committed_classifiers_prefer_the_built_batch(model_repository):
    for name in (CLASSIFIER, "efficientnet_lite0_int8", "efficientnet_lite2"):
        assert list(read_config(model_repository / name).dynamic_batching.preferred_batch_size) == [PREFERRED]


def test_queued_requests_run_in_preferred_batches(server):
    image = photo_bytes("rocket.jpg")
    before = executions_by_batch_size(server, CLASSIFIER)
    asyncio.run(send(server.grpc_url, [[image]] * IN_FLIGHT))
    ran = executions_since(server, CLASSIFIER, before, IN_FLIGHT)
    assert sum(size * count for size, count in ran.items()) == IN_FLIGHT, ran
    assert max(ran) > 1, f"no batch formed from {IN_FLIGHT} requests in flight: {ran}"
    assert max(ran) <= PREFERRED, f"batches above the preferred {PREFERRED}: {ran}"


def test_a_request_of_more_images_runs_whole(server):
    images = [photo_bytes("rocket.jpg")] * (2 * PREFERRED)
    before = executions_by_batch_size(server, CLASSIFIER)
    asyncio.run(send(server.grpc_url, [images]))
    assert executions_since(server, CLASSIFIER, before, len(images)) == Counter({len(images): 1})
