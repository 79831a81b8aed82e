"""Beyond capacity: how much of it the stack still serves in time, and what it wastes.

    tritonstack overload --out reports/overload.json                 # starts its own server
    tritonstack overload --url 127.0.0.1:8000 --grpc-url 127.0.0.1:8001 --out reports/overload.json

    tritonstack overload --clients stock --out reports/overload-stock.json   # Triton's own clients
    tritonstack overload --within-capacity --out reports/busy.json             # 0.9x: refusals, misses

First the capacity (requests/s, one image each, a closed loop over gRPC at batch
priority), then for each protocol and load multiple an open loop of Poisson arrivals at
that multiple of the capacity, every request with the same deadline: our clients send
it to the server as the request's timeout too; Triton's stock clients (`--clients
stock`) only stop waiting then, as most callers do. Every request ends one way:

- in time: answered (200) before its deadline;
- refused: the server said no (a full queue, or its timeout passed while queued:
  HTTP 503 / gRPC UNAVAILABLE) before the deadline;
- refused by our client: its throttle said no at once, never sending it
  (tritonstack.client.throttle: a server refusing more than a fifth of the requests
  is spared some), counted apart: an instant refusal is not the server's;
- late: no answer before the deadline (the client gave up), or one after it;
- failed: anything else (a wrong status, a broken connection).

It writes, per protocol and multiple:
- goodput_share: answered in time / (capacity x seconds): 1.0 is all the capacity
  serving requests that someone still waits for;
- refused_share, refused_by_client_share, late_share: of all requests sent;
- wasted_share: of the images each step of the ensemble computed (Triton's own
  inference counters, read after the backlog drained), the share that did not reach
  a client in time, the worst step's;
- answered_ms_p99: latency of every answer, late ones included; refused_ms_p99: of
  the server's refusals;
- recovery_s: wall seconds from the last send until a lone request has been answered
  within twice the idle latency again.

With --rounds N the capacity and every open loop are measured N times, in rounds (the
capacity, then each loop; again), and "loads" gives each protocol and multiple's figures
as the median over the rounds with a 95 % bootstrap interval and n: one run of an
overload gives one value per load, and runs on one machine differ by more than the
targets' margins.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

import numpy as np
import tritonclient.http as httpclient

from tritonstack import cli
from tritonstack.client.aio import AsyncClassifierClient
from tritonstack.client.retry import NO_RETRY
from tritonstack.experiments import overload_loads
from tritonstack.experiments.deadline_loop import Outcomes, deadline_open_loop
from tritonstack.measure import figures
from tritonstack.measure.load_loops import closed_loop
from tritonstack.serve import process_tree

DEADLINE_S = 1.0
MULTIPLES = (1.5, 3.0)
PROTOCOLS = ("grpc", "http")
# Whose clients send the load: ours (the deadline sent as Triton's `timeout` too), or
# Triton's stock clients with only a client-side timeout, as most callers are.
CLIENTS = ("ours", "stock")
WITHIN_CAPACITY = 0.9  # the multiple of --within-capacity: a busy hour, not an overload
CAPACITY_CONCURRENCY = 16
RECOVERY_LIMIT_S = 60.0
ROUNDS = 5  # as `tritonstack compare`'s: the fewest whose [min, max] holds the median 94 % of the time
RECOVERY_FACTOR = 2.0  # "back to idle": a lone request within twice the idle latency


def p99_ms(latencies_s: list[float]) -> float | None:
    return float(np.percentile(latencies_s, 99)) * 1000 if latencies_s else None


def ensemble_steps(http_url: str, model: str, headers: dict[str, str]) -> list[str]:
    with httpclient.InferenceServerClient(http_url) as client:
        config = client.get_model_config(model, headers=headers)
    return [step["model_name"] for step in config.get("ensemble_scheduling", {}).get("step", [])] or [model]


def inference_counts(http_url: str, models: list[str], headers: dict[str, str]) -> dict[str, int]:
    """Images computed so far by each model (Triton's inference_count)."""
    with httpclient.InferenceServerClient(http_url) as client:
        counts = {}
        for model in models:
            stats = client.get_inference_statistics(model, headers=headers)["model_stats"]
            counts[model] = sum(int(entry.get("inference_count", 0)) for entry in stats)
    return counts


def settled_counts(http_url: str, models: list[str], headers: dict[str, str], quiet_s: float = 1.0) -> dict[str, int]:
    """The counters once the backlog has drained: unchanged for `quiet_s`."""
    counts = inference_counts(http_url, models, headers)
    deadline = time.monotonic() + RECOVERY_LIMIT_S
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = inference_counts(http_url, models, headers)
        if now == counts:
            return now
        counts = now
    return counts


async def lone_latency_s(url: str, protocol: str, model: str, image: bytes, timeout_s: float = 30.0) -> float | None:
    async with AsyncClassifierClient(url, protocol, model, retry=NO_RETRY, timeout_s=timeout_s) as client:
        started = time.perf_counter()
        try:
            await client.probabilities([image])
        except Exception:
            return None
        return time.perf_counter() - started


async def idle_latency_s(url: str, protocol: str, model: str, image: bytes, requests: int = 10) -> float:
    async with AsyncClassifierClient(url, protocol, model, retry=NO_RETRY, timeout_s=30.0) as client:
        latencies = []
        for _ in range(requests):
            started = time.perf_counter()
            await client.probabilities([image])
            latencies.append(time.perf_counter() - started)
    return float(np.median(latencies))


async def recovery_seconds(
    probe: Callable[[], Awaitable[float | None]], idle_s: float, since: float, clock: Callable[[], float]
) -> tuple[float, int]:
    """Wall seconds from `since` (`clock`'s time of the last send) until a lone request,
    `probe()` (its latency, None when it failed), is answered within RECOVERY_FACTOR x
    the idle latency, that answer included: what a user waits for the server to be
    itself again. And the probes answered."""
    answered = 0
    while clock() - since < RECOVERY_LIMIT_S:
        latency = await probe()
        answered += latency is not None
        if latency is not None and latency <= RECOVERY_FACTOR * idle_s:
            return clock() - since, answered
        await asyncio.sleep(0.05)
    return RECOVERY_LIMIT_S, answered


@dataclass
class Target:
    """The server measured: its two endpoints, the admin headers for its statistics, and
    its process when it runs here (None: a server given by its address)."""

    http_url: str
    grpc_url: str
    headers: dict[str, str]
    pid: int | None = None

    def url(self, protocol: str) -> str:
        return self.grpc_url if protocol == "grpc" else self.http_url

    def rss_mib(self) -> float | None:
        """tritonserver's process tree, stubs included."""
        return process_tree.tree_rss_mib(self.pid) if self.pid is not None else None


def measure_capacity(target: Target, model: str, images: list[bytes], seconds: float) -> float:
    phase = asyncio.run(
        closed_loop(target.grpc_url, "grpc", model, images, CAPACITY_CONCURRENCY, seconds, warmup_s=2.0)
    )
    return phase.images_per_s


@dataclass(frozen=True)
class PhaseResult:
    """One open loop's figures, declared in tritonstack.measure.figures.OVERLOAD."""

    round: int
    protocol: str
    clients: str
    multiple: float
    offered_rps: float
    seconds: float
    deadline_s: float
    sent: int
    in_time: int
    refused: int
    refused_by_client: int
    late: int
    failed: int
    failures: dict
    refused_share: float
    refused_by_client_share: float
    late_share: float
    goodput_rps: float
    goodput_share: float
    wasted_share: float
    computed_by_step: dict
    answered_ms_p99: float | None
    refused_ms_p99: float | None
    idle_ms: float
    recovery_s: float
    server_rss_growth_mb: float | None


def overload_phase(
    target: Target,
    model: str,
    images: list[bytes],
    protocol: str,
    multiple: float,
    capacity: float,
    seed: int,
    settings: OverloadSettings,
    round_index: int = 1,
) -> dict:
    """One open loop at `multiple` x `capacity` over `protocol`, then its recovery."""
    rate, seconds = multiple * capacity, settings.seconds
    steps = ensemble_steps(target.http_url, model, target.headers)
    url = target.url(protocol)
    idle_s = asyncio.run(idle_latency_s(url, protocol, model, images[0]))
    before, rss_before = settled_counts(target.http_url, steps, target.headers), target.rss_mib()

    async def load_then_recover() -> tuple[Outcomes, float | None, tuple[float, int]]:
        outcomes, last_send = await deadline_open_loop(
            url, protocol, model, images, rate, seconds, settings.deadline_s, seed, settings.clients
        )
        rss_loaded = target.rss_mib()  # the backlog's peak: right after the last send
        probe = functools.partial(lone_latency_s, url, protocol, model, images[0])
        clock = asyncio.get_running_loop().time
        return outcomes, rss_loaded, await recovery_seconds(probe, idle_s, last_send, clock)

    outcomes, rss_loaded, (recovery, probes) = asyncio.run(load_then_recover())
    after = settled_counts(target.http_url, steps, target.headers)
    result = phase_result(
        outcomes,
        Load(protocol, settings.clients, multiple, capacity, seconds, round_index),
        computed={step: after[step] - before[step] for step in steps},
        probes=probes,
        idle_s=idle_s,
        recovery_s=recovery,
        rss_growth_mb=None if rss_before is None or rss_loaded is None else rss_loaded - rss_before,
    )
    return figures.report(figures.OVERLOAD, result)


@dataclass(frozen=True)
class Load:
    """What one open loop offered: over which protocol and clients, at what multiple of
    which capacity (requests/s), for how long."""

    protocol: str
    clients: str
    multiple: float
    capacity: float
    seconds: float
    round: int = 1  # of --rounds


def phase_result(
    outcomes: Outcomes,
    load: Load,
    computed: dict[str, int],
    probes: int,
    idle_s: float,
    recovery_s: float,
    rss_growth_mb: float | None,
) -> PhaseResult:
    """The figures of one open loop from how its requests ended; `computed`: each step's
    images over the phase, `probes`: the recovery's answered requests (computed too)."""
    in_time, sent = outcomes.in_time, max(outcomes.sent, 1)
    return PhaseResult(
        round=load.round,
        protocol=load.protocol,
        clients=load.clients,
        multiple=load.multiple,
        offered_rps=load.multiple * load.capacity,
        seconds=load.seconds,
        deadline_s=outcomes.deadline_s,
        sent=outcomes.sent,
        in_time=in_time,
        refused=len(outcomes.refused_by_server_s),
        refused_by_client=outcomes.refused_by_client,
        late=outcomes.late,
        failed=outcomes.failed,
        failures=outcomes.failures,
        refused_share=len(outcomes.refused_by_server_s) / sent,
        refused_by_client_share=outcomes.refused_by_client / sent,
        late_share=outcomes.late / sent,
        goodput_rps=in_time / load.seconds,
        goodput_share=in_time / (load.capacity * load.seconds),
        wasted_share=wasted_share(in_time + probes, computed),
        computed_by_step=computed,
        answered_ms_p99=p99_ms(outcomes.answered_s),
        refused_ms_p99=p99_ms(outcomes.refused_by_server_s),
        idle_ms=idle_s * 1000,
        recovery_s=recovery_s,
        server_rss_growth_mb=rss_growth_mb,
    )


def wasted_share(answered_in_time: int, computed: dict[str, int]) -> float:
    """The worst step's share of computed images that reached nobody in time."""
    shares = [max(0.0, 1 - answered_in_time / count) for count in computed.values() if count > 0]
    return max(shares) if shares else 0.0


@dataclass(frozen=True)
class OverloadSettings:
    """What `tritonstack overload` measures; each field is one of its options."""

    seconds: float = cli.option(30.0, "--seconds", type=cli.positive_float, help="per open loop")
    deadline_s: float = cli.option(
        DEADLINE_S,
        "--deadline-ms",
        type=cli.positive_float,
        convert=lambda ms: ms / 1000,
        command_default=DEADLINE_S * 1000,
        help="every request's deadline (default: %(default)s)",
    )
    multiples: tuple[float, ...] = cli.option(
        MULTIPLES,
        "--multiples",
        type=cli.positive_float,
        nargs="+",
        convert=tuple,
        help="the open loops' loads, in multiples of the capacity",
    )
    protocols: tuple[str, ...] = cli.option(
        PROTOCOLS, "--protocols", nargs="+", choices=PROTOCOLS, convert=tuple, help="each protocol's open loops"
    )
    capacity_s: float = cli.option(
        10.0, "--capacity-seconds", type=cli.positive_float, help="the closed loop that measures the capacity"
    )
    rounds: int = cli.option(
        ROUNDS,
        "--rounds",
        type=cli.positive_int,
        help="the capacity and every open loop measured this many times, in rounds; each load's figures are the "
        "median over them with a 95 %% interval (1: one value a load, no interval)",
    )
    clients: str = cli.option(
        "ours",
        "--clients",
        choices=CLIENTS,
        help="ours: the deadline is also sent as Triton's `timeout`; stock: Triton's own asyncio clients with only "
        "a client-side timeout (gRPC client_timeout, HTTP session timeout), as most callers are",
    )

    def as_dict(self) -> dict:
        return asdict(self)


def run_overload(target: Target, model: str, images: list[bytes], settings: OverloadSettings, log=print) -> dict:
    capacities, phases = [], []
    for round_index in range(1, settings.rounds + 1):
        if settings.rounds > 1:
            log(f"round {round_index}/{settings.rounds}")
        capacity = measure_capacity(target, model, images, settings.capacity_s)
        capacities.append(capacity)
        log(f"capacity: {capacity:.1f} requests/s (closed loop, {CAPACITY_CONCURRENCY} in flight, gRPC)")
        for protocol in settings.protocols:
            for multiple in settings.multiples:
                log(
                    f"{protocol}, {settings.clients} clients, at {multiple:g}x ({multiple * capacity:.0f} "
                    f"requests/s) for {settings.seconds:g} s ..."
                )
                seed = len(phases)  # a new arrival sequence for every loop, rounds included
                phase = overload_phase(target, model, images, protocol, multiple, capacity, seed, settings, round_index)
                log("  " + phase_line(phase))
                phases.append(phase)
    loads = overload_loads.over_rounds(phases)
    for load in loads:
        log(overload_loads.load_line(load))
    return {
        "model": model,
        "capacity_rps": float(np.median(capacities)),
        "capacity_rps_rounds": capacities,
        "settings": settings.as_dict(),
        "phases": phases,
        "loads": loads,
    }


def ms_text(value: float | None) -> str:
    """A latency for a log line: "412 ms", or "-" when none was measured."""
    return f"{value:.0f} ms" if value is not None else "-"


def phase_line(phase: dict) -> str:
    ms = ms_text
    return (
        f"goodput {phase['goodput_share']:.2f} of capacity, wasted {phase['wasted_share']:.2f}, "
        f"in time {phase['in_time']}, refused by the server {phase['refused']} ({phase['refused_share']:.1%}), "
        f"by our client at once {phase['refused_by_client']} ({phase['refused_by_client_share']:.1%}), "
        f"late {phase['late']} ({phase['late_share']:.1%}), failed {phase['failed']}; "
        f"p99 answered {ms(phase['answered_ms_p99'])}, refused {ms(phase['refused_ms_p99'])}; "
        f"recovered in {phase['recovery_s']:.1f} s"
    )
