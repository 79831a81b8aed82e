"""The DALI stub's memory under the same requests over photos of several sizes:
after a burst of full batches and two rounds (DALI's buffers reach the largest
image, the Python backend's shared memory its largest batch), a third identical
round must not raise the stub's RSS. Before docs/memory.md's fix each round added several MiB (glibc's
heap kept the freed image buffers)."""

from __future__ import annotations

import pytest

import psutil

from loadtests.memory_probe import MODEL, RoundSender, rss_mib, rss_parts_mib, sized_photos, stub_pid
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.stub_environment import STUB_ENVIRONMENT

ROUNDS = 3
REQUESTS_PER_ROUND = 300  # the 15 images 20 times, from 4 threads
# A burst of as many concurrent requests as the model's max_batch_size: full
# dynamic batches bring the Python backend's shared-memory region (its pages touched
# by the stub count in the stub's RSS) to its working size before the rounds.
BURST_WORKERS, BURST_REQUESTS = 32, 96
# Issue 17 asks for < 2 MiB and stays open: in full suite runs on a quiet machine the
# third round still added 2.4 and 3.0 MiB of heap (0 in isolated runs), so this guards
# against the growth coming back (several MiB a round before the fix), not the target.
MAX_THIRD_ROUND_GROWTH_MIB = 8.0


@pytest.fixture(scope="module")
def compact_server(model_repository):
    """The launcher's --compact-memory (an opt-in: it costs throughput), with only
    the DALI model loaded."""
    server = TritonServer(model_repository, environment=STUB_ENVIRONMENT,
                          extra_args=("--model-control-mode=explicit", f"--load-model={MODEL}"))
    with server:
        yield server


def test_dali_stub_rss_stays_flat_over_identical_rounds_of_varied_sizes(compact_server):
    server = compact_server
    images = sized_photos()  # 5 photos x 320/640/1280 px
    assert len(images) == 15 and len({len(image) for image in images}) == 15
    pid = stub_pid(server.pid, MODEL)
    burst = RoundSender(server.http_url, workers=BURST_WORKERS)
    try:
        burst.send_round(images, BURST_REQUESTS)
    finally:
        burst.close()
    sender = RoundSender(server.http_url, workers=4)
    rss, parts = [], []
    try:
        for _ in range(ROUNDS):
            sender.send_round(images, REQUESTS_PER_ROUND)  # raises on any failed request
            rss.append(rss_mib(pid))
            parts.append(rss_parts_mib(pid))
    finally:
        sender.close()
    print(f"{MODEL} RSS after each round: {[round(value, 1) for value in rss]} MiB; {parts}")
    assert stub_pid(server.pid, MODEL) == pid, "the stub was restarted during the test"
    assert rss[2] - rss[1] < MAX_THIRD_ROUND_GROWTH_MIB, (rss, parts)


def test_the_dali_stub_runs_with_the_launchers_allocator_settings(compact_server):
    server = compact_server
    """The rounds above pass with glibc's defaults too once a burst has grown the
    heap (docs/memory.md): the setting that keeps the heap small is checked here."""
    environ = psutil.Process(stub_pid(server.pid, MODEL)).environ()
    assert STUB_ENVIRONMENT and {key: environ.get(key) for key in STUB_ENVIRONMENT} == STUB_ENVIRONMENT
