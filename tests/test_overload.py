"""Deadlines under load, on a real server built with the default queue policy: a
request still queued when its deadline passes is refused with a clear status over
both protocols and never computed, our client sends its deadline to the server, a
cancelled request is not computed, the client's retries of refusals stay within
their budget, a client the server keeps refusing refuses some requests itself, the
load test counts refusals and missed deadlines apart, and the overload measurement
and its soak account for every request."""

from __future__ import annotations

import asyncio
import io
import time

import numpy as np
import pytest
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as http_aio
from google.protobuf import json_format
from PIL import Image
from tritonclient.grpc import model_config_pb2 as pb
from tritonclient.utils import InferenceServerException

from tests import repo_factory as rf
from tests.conftest import TEST_STOP_GRACE_S, served_instances
from tests.processes import wait_for
from tritonstack.build.presets import BuildOptions, preset_named
from tritonstack.build.repository import classifier_config, dali_config, write_repository
from tritonstack.client.aio import AsyncClassifierClient
from tritonstack.client.protocol import request_deadline_options
from tritonstack.client.retry import (
    DEADLINE_EXPIRED,
    NO_RETRY,
    QUEUE_FULL,
    RetryPolicy,
    RetryThrottle,
    describe_error,
    is_expired,
    is_refusal,
    is_timeout,
)
from tritonstack.client.throttle import ClientThrottledError
from tritonstack.commands import overload as overload_command
from tritonstack.contract import PREPROCESS_INPUT, pad_batch
from tritonstack.experiments import goodput, overload_soak
from tritonstack.loadtests.metrics import REFUSED_REASON
from tritonstack.loadtests.metrics import failures_by_reason as exported_failures
from tritonstack.measure.load_loops import weighted_images
from tritonstack.objective import DEFAULT_OBJECTIVE_MS, OBJECTIVE_PARAMETER
from tritonstack.repository_files import read_config
from tritonstack.samples.photos import photo_bytes, photo_path, sample_jpeg
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import ServerConfig

FIRST_STEP = "preprocess_dali_efficientnet_lite0"
LATE_REQUESTS = 2
BLOCKER_IMAGES = 8
FIRST_STEP_ENSEMBLE = "ensemble_dali_efficientnet_lite0"


LITE0 = preset_named("dali_efficientnet_lite0")


@pytest.fixture(scope="module")
def admission_repository(tmp_path_factory, model_repository):
    """The Lite0 ensemble built without a latency objective: no queue ceilings."""
    out = tmp_path_factory.mktemp("admission")
    rf.seed_lite0_export(out)
    write_repository(out, presets=(LITE0,), options=BuildOptions(latency_objective_ms=0))
    return out


@pytest.fixture(scope="module")
def admission_server(admission_repository):
    """The Lite0 ensemble served with the default objective, applied at load: what
    `tritonstack build` writes by default, and what `serve --latency-objective-ms` does."""
    config = ServerConfig(
        admission_repository,
        restricted_apis=(),
        stop_grace_s=TEST_STOP_GRACE_S,
        latency_objective_ms=DEFAULT_OBJECTIVE_MS,
    )
    with TritonServer(config) as running:
        yield running


def test_an_objective_served_sets_the_ceilings_the_build_writes_and_leaves_the_files(
    admission_server, admission_repository
):
    built = {
        FIRST_STEP: dali_config(LITE0, BuildOptions(), sample_jpeg()),
        "efficientnet_lite0": classifier_config(LITE0.classifier, BuildOptions()),
    }
    with httpclient.InferenceServerClient(admission_server.http_url) as client:
        for model, config in built.items():
            served = json_format.ParseDict(client.get_model_config(model), pb.ModelConfig(), ignore_unknown_fields=True)
            assert served.dynamic_batching == config.to_proto().dynamic_batching, model
        parameters = client.get_model_config(FIRST_STEP_ENSEMBLE)["parameters"]
    assert parameters[OBJECTIVE_PARAMETER]["string_value"] == str(DEFAULT_OBJECTIVE_MS)
    on_disk = read_config(admission_repository / FIRST_STEP).dynamic_batching
    assert not on_disk.HasField("default_queue_policy") and on_disk.priority_levels == 0  # never written


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


def instances(server) -> int:
    """A blocker for each instance of the first step: every instance busy, what follows waits."""
    return served_instances(server, FIRST_STEP)


def step_stats(server, model: str) -> dict:
    with httpclient.InferenceServerClient(server.http_url) as client:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    failures = exported_failures(server.metrics_url)
    return {
        "inferences": int(stats["inference_count"]),
        "failed": int(stats["inference_stats"]["fail"]["count"]),
        "refused": failures.get((model, REFUSED_REASON), 0),
    }


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_past_its_deadline_is_refused_with_a_clear_status(admission_server, blocker, protocol):
    """Queued behind a long request, requests whose `timeout` passes are refused by the
    server (HTTP 503, gRPC UNAVAILABLE, "Request timeout expired"), not decoded."""
    before = step_stats(admission_server, FIRST_STEP)
    refused = asyncio.run(behind_the_blocker(admission_server, protocol, blocker))
    expected_status = "503" if protocol == "http" else "StatusCode.UNAVAILABLE"
    assert len(refused) == LATE_REQUESTS, refused
    for error in refused:
        assert isinstance(error, InferenceServerException) and is_expired(error), error
        assert error.status() == expected_status and DEADLINE_EXPIRED in error.message()
        assert "latency objective or its own timeout" in describe_error(error)
        assert "retry later" in describe_error(error) and "batch request" in describe_error(error)
    blocked = BLOCKER_IMAGES * instances(admission_server)
    after = counted_at_least(admission_server, FIRST_STEP, before, blocked)
    assert after["failed"] - before["failed"] >= LATE_REQUESTS
    assert after["inferences"] - before["inferences"] == blocked  # none late
    # In /metrics, what the dashboard's refusals panel and the refusal alert count.
    assert after["refused"] - before["refused"] >= LATE_REQUESTS


def counted_at_least(server, model: str, before: dict, images: int) -> dict:
    """The step's statistics once `images` more inferences are counted: Triton records a
    batch's statistics after it has sent the batch's responses, so a client can hear its
    answer first (seen: one blocker of two counted when both had been answered)."""

    def counted() -> dict | None:
        stats = step_stats(server, model)
        return stats if stats["inferences"] - before["inferences"] >= images else None

    return wait_for(counted, timeout_s=10, what=f"{images} inferences counted")


async def behind_the_blocker(server, protocol: str, blocker: np.ndarray) -> list:
    """The blocker, then LATE_REQUESTS requests with a 1 microsecond timeout and a
    client that waits long enough to hear the server's answer."""
    module = grpc_aio if protocol == "grpc" else http_aio
    url = server.grpc_url if protocol == "grpc" else server.http_url
    client = module.InferenceServerClient(url)
    try:
        running = [
            asyncio.create_task(client.infer(FIRST_STEP, tensors(module, blocker))) for _ in range(instances(server))
        ]
        await asyncio.sleep(0.2)  # the blockers run: what follows waits behind them
        image = pad_batch([photo_bytes("coffee.png")])
        late = [client.infer(FIRST_STEP, tensors(module, image), timeout=1) for _ in range(LATE_REQUESTS)]
        outcomes = await asyncio.gather(*late, return_exceptions=True)
        await asyncio.gather(*running)
    finally:
        await client.close()
    return [outcome for outcome in outcomes if isinstance(outcome, Exception)]


def tensors(module, batch: np.ndarray) -> list:
    tensor = module.InferInput(PREPROCESS_INPUT, list(batch.shape), "UINT8")
    tensor.set_data_from_numpy(batch)
    return [tensor]


def test_our_client_sends_its_deadline_to_the_server(admission_server, blocker):
    """ClassifierClient(timeout_s=...) gives up at its deadline, and the server, told
    it as the request's timeout, drops the request instead of computing it for nobody."""
    assert request_deadline_options("http", 0.5) == {"timeout": 250_000}  # two queues share it
    assert request_deadline_options("grpc", 0.5) == {"timeout": 250_000, "client_timeout": 0.5}
    before, blockers = step_stats(admission_server, FIRST_STEP), instances(admission_server)

    async def given_up() -> list:
        async with grpc_aio.InferenceServerClient(admission_server.grpc_url) as raw:
            running = [asyncio.create_task(raw.infer(FIRST_STEP, tensors(grpc_aio, blocker))) for _ in range(blockers)]
            await asyncio.sleep(0.2)
            async with AsyncClassifierClient(
                admission_server.http_url, "http", FIRST_STEP_ENSEMBLE, retry=NO_RETRY, timeout_s=0.1
            ) as client:
                outcomes = await asyncio.gather(
                    *(client.probabilities([photo_bytes("coffee.png")]) for _ in range(LATE_REQUESTS)),
                    return_exceptions=True,
                )
            await asyncio.gather(*running)
        return outcomes

    outcomes = asyncio.run(given_up())
    assert all(isinstance(outcome, Exception) and is_timeout(outcome) for outcome in outcomes), outcomes
    time.sleep(1.0)  # the server has answered the requests nobody waits for by now
    after = step_stats(admission_server, FIRST_STEP)
    assert after["failed"] - before["failed"] >= LATE_REQUESTS  # refused as expired
    assert after["inferences"] - before["inferences"] == BLOCKER_IMAGES * blockers


def test_a_client_the_server_keeps_refusing_refuses_some_requests_itself(admission_server, blocker):
    """Client-side throttling on a real server: a first wave of requests behind the
    blockers all miss their deadline; of a second wave right after, most are refused by
    the client itself, at once, with an error that says so and is counted as a refusal."""
    wave = 16

    async def two_waves() -> tuple[list, list]:
        async with grpc_aio.InferenceServerClient(admission_server.grpc_url) as raw:
            running = [asyncio.create_task(raw.infer(FIRST_STEP, tensors(grpc_aio, blocker))) for _ in range(blockers)]
            await asyncio.sleep(0.2)  # the blockers run: what follows waits behind them
            async with AsyncClassifierClient(
                admission_server.grpc_url, "grpc", FIRST_STEP_ENSEMBLE, retry=NO_RETRY, timeout_s=0.02
            ) as client:
                image = photo_bytes("coffee.png")

                async def one_wave() -> list:
                    calls = (client.probabilities([image]) for _ in range(wave))
                    return await asyncio.gather(*calls, return_exceptions=True)

                first = await one_wave()
                second = await one_wave()
            await asyncio.gather(*running)
        return first, second

    before, blockers = step_stats(admission_server, FIRST_STEP), instances(admission_server)
    first, second = asyncio.run(two_waves())
    # The blockers' statistics before the next test reads its own (Triton counts a batch
    # after answering it).
    counted_at_least(admission_server, FIRST_STEP, before, BLOCKER_IMAGES * blockers)
    assert all(isinstance(outcome, Exception) and is_timeout(outcome) for outcome in first), first
    throttled = [outcome for outcome in second if isinstance(outcome, ClientThrottledError)]
    assert len(throttled) >= wave // 2, second  # each refused with probability 16/17
    assert all(is_refusal(error) and "refused by this client" in describe_error(error) for error in throttled)


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
            running = [
                asyncio.create_task(client.infer(FIRST_STEP, grpc_input(blocker), client_timeout=60))
                for _ in range(blockers)
            ]
            await asyncio.sleep(0.2)  # the blockers run: what follows waits behind them
            image = pad_batch([photo_bytes("coffee.png")])
            calls = [client.infer(FIRST_STEP, grpc_input(image), client_timeout=0.05) for _ in range(LATE_REQUESTS)]
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            await asyncio.gather(*running)
        return outcomes

    before, blockers = step_stats(admission_server, FIRST_STEP), instances(admission_server)
    outcomes = asyncio.run(cancelled_calls())
    assert all(isinstance(outcome, InferenceServerException) for outcome in outcomes), outcomes
    assert {outcome.status() for outcome in outcomes} == {"StatusCode.DEADLINE_EXCEEDED"}
    time.sleep(1.0)  # whatever was still queued has been dropped or skipped by now
    after = step_stats(admission_server, FIRST_STEP)
    assert after["inferences"] - before["inferences"] == BLOCKER_IMAGES * blockers  # none of the cancelled ones


def test_refusals_are_retried_within_the_budget():
    """A server that refuses every request (a full queue): with three retries each and
    no budget, 100 requests would be 400 attempts; the budget allows about one retry
    per ten successes, and there are none."""
    attempts = 0
    refusal = InferenceServerException(msg=f"[request id: <id_unknown>] {QUEUE_FULL}", status="StatusCode.UNAVAILABLE")

    def refused():
        nonlocal attempts
        attempts += 1
        raise refusal

    policy, throttle = RetryPolicy(retries=3, base_delay_s=0.0001, max_delay_s=0.0002), RetryThrottle()
    for _ in range(100):
        with pytest.raises(InferenceServerException):
            policy.call(refused, throttle=throttle)
    assert is_refusal(refusal)
    assert 100 < attempts <= 100 + throttle.max_tokens / 2, attempts


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


@pytest.mark.parametrize("user", ["grpc", "http"])
def test_the_load_test_counts_refusals_apart_and_reports_goodput(admission_server, tmp_path, user):
    """Locust users with a deadline shorter than the queue's wait: requests are refused
    or miss it, and the report counts them apart from failures and says the goodput."""
    from tritonstack.commands import loadtest

    code = loadtest.main(
        ["--url", admission_server.http_url, "--grpc-url", admission_server.grpc_url, "--out", str(tmp_path)]
        + ["--user", user, "--shape", "closed", "--users", "24", "--run-time", "4", "--deadline-ms", "100"]
    )
    summary = (tmp_path / "summary.md").read_text()
    outcomes = summary.split("## Outcomes", 1)[1].split("##", 1)[0]
    cells = [line.split("|") for line in outcomes.splitlines() if line.count("|") == 4]
    rows = {cell[1].strip(): int(cell[2]) for cell in cells if cell[2].strip().isdigit()}
    assert rows["Refused"] + rows["DeadlineExceeded"] > 0, outcomes
    assert rows["failed"] == 0, outcomes
    assert "Goodput:" in outcomes
    assert code in (0, 1)  # Locust exits 1 when any request failed, refusals included


def quiet(text: str) -> None:
    pass


@pytest.fixture(scope="module")
def overload_target(admission_server):
    server = admission_server
    return goodput.Target(server.http_url, server.grpc_url, server.admin_headers("http"), server.pid)


@pytest.mark.parametrize("clients", goodput.CLIENTS)
def test_the_overload_measurement_accounts_for_every_request(overload_target, clients):
    """`tritonstack overload`, short: at 3x the capacity measured first, every request
    ends in time, refused or late (none failed), the steps' own counters say what was
    computed, and the server is back to idle latency soon after. Stock clients, which
    send no `timeout`, are refused too: by the latency objective."""
    settings = goodput.OverloadSettings(
        seconds=4.0, multiples=(3.0,), protocols=("grpc",), capacity_s=3.0, clients=clients, rounds=1
    )
    report = goodput.run_overload(overload_target, FIRST_STEP_ENSEMBLE, weighted_images(40), settings, log=quiet)
    phase = report["phases"][0]
    assert report["capacity_rps"] > 0 and phase["round"] == 1
    (load,) = report["loads"]  # one round: its figures, n=1 and no interval
    assert load["goodput_share"] == phase["goodput_share"] and load["goodput_share_n"] == 1
    assert phase["failed"] == 0, phase["failures"]
    ended = ("in_time", "refused", "refused_by_client", "late")
    assert phase["sent"] == sum(phase[key] for key in ended) > 0, phase
    assert phase["in_time"] > 0 and phase["refused"] > 0, phase  # served some, the server shed the excess
    computed = phase["computed_by_step"]
    assert set(computed) == {FIRST_STEP, "efficientnet_lite0"}
    assert all(count >= phase["in_time"] for count in computed.values()), phase
    assert phase["recovery_s"] < goodput.RECOVERY_LIMIT_S, phase  # back to idle latency, not given up
    assert phase["server_rss_growth_mb"] is not None and phase["clients"] == clients
    assert clients == "ours" or phase["refused_by_client"] == 0, phase  # stock clients have no throttle


def test_the_overload_soak_checks_every_answer_and_leaves_none_unresolved(admission_server, overload_target):
    """The soak, short: below then beyond capacity, over both protocols at once; every
    request answered (rightly) or refused within its deadline + 1 s."""
    settings = overload_soak.SoakSettings(seconds=8.0, period_s=4.0, capacity_s=3.0)
    report = overload_soak.run_overload_soak(
        overload_target, admission_server.pid, FIRST_STEP_ENSEMBLE, weighted_images(40), settings, log=quiet
    )
    assert [period["multiple"] for period in report["periods"]] == [0.5, 2.0]
    assert report["unresolved"] == 0 and report["wrong"] == 0 and report["failed"] == 0, report["periods"]
    assert report["in_time"] > 0
    assert report["memory"]["passed"] is None  # 8 s is too short to judge the memory
    assert report["passed"] is None  # and a memory not judged is not a pass


def test_the_soak_refuses_the_open_loops_options_it_would_ignore(tmp_path, capsys):
    """--soak swings its own loads: --rounds or --multiples with it is a mistake said at
    once, before a server starts or a file is written."""
    out = tmp_path / "soak.json"
    for given in (["--rounds", "3"], ["--multiples", "2"], ["--within-capacity"]):
        with pytest.raises(SystemExit) as refused:  # as argparse refuses a bad option
            overload_command.main(["--soak", *given, "--out", str(out)])
        assert refused.value.code == 2 and f"{given[0]}: not with --soak" in capsys.readouterr().err
    assert not out.exists()


def test_the_overload_soak_tells_a_wrong_answer_and_an_unresolved_request_apart():
    settings = overload_soak.SoakSettings(deadline_s=1.0, grace_s=1.0)
    tally = overload_soak.PeriodTally(2.0)
    expired = InferenceServerException(DEADLINE_EXPIRED, status="StatusCode.UNAVAILABLE")
    tally.record(0.2, settings, None, right=True)
    tally.record(0.2, settings, None, right=False)
    tally.record(1.5, settings, None, right=True)
    tally.record(0.9, settings, expired, right=False)
    tally.record(2.5, settings, expired, right=False)
    tally.record(2.0, settings, asyncio.TimeoutError(), right=False)
    tally.record(0.1, settings, ConnectionResetError("reset"), right=False)
    summary = tally.summary(capacity=10.0, period_s=1.0)
    assert (summary["in_time"], summary["wrong"], summary["answered_late"], summary["refused"]) == (1, 1, 1, 1)
    assert (summary["unresolved"], summary["failed"]) == (2, 1)


def soak_samples(settings, trough_mib, peak_mib, rise_per_cycle_mib=0.0) -> list[dict]:
    """One RSS sample a second: `peak_mib` during the high-load periods, `trough_mib`
    (plus a rise each cycle) during the low ones."""
    cycle_s = settings.period_s * 2
    rows = []
    for second in range(int(settings.seconds)):
        high = (second % cycle_s) >= settings.period_s
        value = (peak_mib if high else trough_mib) + rise_per_cycle_mib * (second // cycle_s)
        rows.append({"t_s": float(second), "rss_mib": {"tritonserver": value}})
    return rows


def test_the_soak_judges_memory_by_the_troughs_not_the_backlog_between():
    settings = overload_soak.SoakSettings(seconds=300.0, period_s=30.0)
    backlog = overload_soak.memory_verdict(soak_samples(settings, 120.0, 160.0), settings)
    assert backlog["passed"] is True and backlog["worst_growth_pct"] == pytest.approx(0.0)
    leak = overload_soak.memory_verdict(soak_samples(settings, 120.0, 160.0, rise_per_cycle_mib=2.0), settings)
    assert leak["passed"] is False and leak["worst_growth_pct"] == pytest.approx(100 * 4 / 124)
    # An allocator that grows to the largest backlog of the first cycles, then holds it.
    settled = soak_samples(settings, 120.0, 160.0)
    for row in settled:
        row["rss_mib"]["tritonserver"] += min(row["t_s"] // 60, 2) * 10.0
    assert overload_soak.memory_verdict(settled, settings)["passed"] is True
    short = overload_soak.SoakSettings(seconds=120.0, period_s=30.0)
    assert overload_soak.memory_verdict(soak_samples(short, 120.0, 160.0), short)["passed"] is None
