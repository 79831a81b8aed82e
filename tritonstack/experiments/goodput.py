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
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio

from tritonstack import cli
from tritonstack.client.aio import AsyncClassifierClient
from tritonstack.client.retry import NO_RETRY, is_expired, is_refusal, is_timeout
from tritonstack.client.throttle import ClientThrottledError
from tritonstack.contract import ENSEMBLE_INPUT, pad_batch
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


@dataclass
class Outcomes:
    """How the requests of one open loop ended; latencies from the scheduled send."""

    deadline_s: float
    answered_s: list[float] = field(default_factory=list)  # every answer, in time or late
    refused_by_server_s: list[float] = field(default_factory=list)  # before the deadline
    refused_by_client: int = 0  # our client's throttle: never sent, refused at once
    gave_up: int = 0  # no answer, nor refusal, before the deadline: the client stopped waiting
    failed: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # a few kinds, for the report

    @property
    def in_time(self) -> int:
        return sum(latency <= self.deadline_s for latency in self.answered_s)

    @property
    def late(self) -> int:
        """No answer before the deadline: an answer after it, or none at all."""
        return len(self.answered_s) - self.in_time + self.gave_up

    @property
    def sent(self) -> int:
        """Every request the loop made, our client's self-refusals included."""
        refused = len(self.refused_by_server_s) + self.refused_by_client
        return len(self.answered_s) + refused + self.gave_up + self.failed

    def record(self, latency_s: float, error: BaseException | None) -> None:
        if error is None:
            self.answered_s.append(latency_s)
        elif isinstance(error, ClientThrottledError):
            self.refused_by_client += 1
        elif (is_refusal(error) or is_expired(error)) and latency_s <= self.deadline_s:
            self.refused_by_server_s.append(latency_s)
        elif is_refusal(error) or is_expired(error) or is_timeout(error):
            self.gave_up += 1  # a refusal after the deadline reaches nobody who still waits
        else:
            self.failed += 1
            kind = f"{type(error).__name__}: {str(error)[:80]}"
            self.failures[kind] = self.failures.get(kind, 0) + 1


def p99_ms(latencies_s: list[float]) -> float | None:
    return float(np.percentile(latencies_s, 99)) * 1000 if latencies_s else None


def poisson_offsets(rate: float, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Send times (seconds from the start) of Poisson arrivals at `rate` for `seconds`."""
    gaps = rng.exponential(1 / rate, max(int(rate * seconds), 1))
    return np.cumsum(gaps) - gaps[0]


async def on_schedule(offsets: np.ndarray, request) -> float:
    """Starts `request(index, scheduled)` at each offset from now (loop.time()), an
    open loop: a late answer delays no later send. Waits for them all; returns the
    loop's time of the last send."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    for index, offset in enumerate(offsets):
        scheduled = start + float(offset)
        await asyncio.sleep(max(0.0, scheduled - loop.time()))
        tasks.append(asyncio.create_task(request(index, scheduled)))
    last_send = loop.time()
    await asyncio.gather(*tasks)
    return last_send


async def deadline_open_loop(
    url: str,
    protocol: str,
    model: str,
    images: list[bytes],
    rate: float,
    seconds: float,
    deadline_s: float,
    seed: int,
    clients: str = "ours",
) -> tuple[Outcomes, float]:
    """Poisson arrivals at `rate` for `seconds`, each request with `deadline_s`; the
    outcomes and the loop's time of the last send (loop.time())."""
    outcomes = Outcomes(deadline_s)
    offsets = poisson_offsets(rate, seconds, np.random.default_rng(seed))
    opener = stock_client if clients == "stock" else our_client
    async with opener(url, protocol, model, deadline_s, in_flight_bound(rate, deadline_s)) as classify:
        loop = asyncio.get_running_loop()

        async def one(index: int, scheduled: float) -> None:
            error = None
            try:
                await asyncio.wait_for(classify(images[index % len(images)]), deadline_s + 0.5)
            except Exception as raised:  # every outcome is counted, none raised
                error = raised
            outcomes.record(loop.time() - scheduled, error)

        last_send = await on_schedule(offsets, one)
    return outcomes, last_send


@contextlib.asynccontextmanager
async def our_client(url: str, protocol: str, model: str, deadline_s: float, connections: int):
    """The project's client: the deadline goes to the server as the request's timeout too."""
    async with AsyncClassifierClient(
        url, protocol, model, retry=NO_RETRY, timeout_s=deadline_s, max_connections=connections
    ) as client:
        yield lambda image: client.probabilities([image])


@contextlib.asynccontextmanager
async def stock_client(url: str, protocol: str, model: str, deadline_s: float, connections: int):
    """Triton's own asyncio clients as a user calls them: the deadline is the client's
    alone (gRPC `client_timeout`, the HTTP session's total timeout), never sent as
    Triton's `timeout` parameter."""
    if protocol == "grpc":
        client = grpcaio.InferenceServerClient(url)
        call = functools.partial(client.infer, client_timeout=deadline_s)
        make_input = grpcaio.InferInput
    else:
        client = httpaio.InferenceServerClient(url, conn_limit=connections, conn_timeout=deadline_s)
        call, make_input = client.infer, httpaio.InferInput

    async def classify(image: bytes):
        batch = pad_batch([image])
        tensor = make_input(ENSEMBLE_INPUT, list(batch.shape), "UINT8")
        tensor.set_data_from_numpy(batch)
        return await call(model, [tensor])

    try:
        yield classify
    finally:
        await client.close()


def in_flight_bound(rate: float, wait_s: float) -> int:
    """Connections an open loop may need: every request in flight its own (HTTP)."""
    return int(rate * wait_s * 2) + 16


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
    loads = over_rounds(phases)
    for load in loads:
        log(load_line(load))
    return {
        "model": model,
        "capacity_rps": float(np.median(capacities)),
        "capacity_rps_rounds": capacities,
        "settings": settings.as_dict(),
        "phases": phases,
        "loads": loads,
    }


def over_rounds(phases: list[dict]) -> list[dict]:
    """Per protocol and multiple, in the order first run: each figure declared in
    tritonstack.measure.figures.OVERLOAD_LOADS as its median over the rounds, with its
    interval and n (a round that measured none, e.g. no refusal to take a p99 of,
    gives no value), and the failed requests of every round summed."""
    loads = []
    for protocol, multiple in dict.fromkeys((phase["protocol"], phase["multiple"]) for phase in phases):
        rounds = [phase for phase in phases if (phase["protocol"], phase["multiple"]) == (protocol, multiple)]
        load = {"protocol": protocol, "multiple": multiple, "failed": sum(phase["failed"] for phase in rounds)}
        for figure in figures.OVERLOAD_LOADS:
            if figure.spread:
                values = [phase[figure.key] for phase in rounds if phase[figure.key] is not None]
                load |= figures.Median.of(values).written(figure.key)
        loads.append(load)
    return loads


def interval_text(load: dict, key: str, digits: int = 2) -> str:
    """`0.89 [0.85, 0.93]`, or the value alone without an interval, or "-"."""
    value, interval = load[key], load[f"{key}_interval"]
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return f"{text} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]" if interval else text


def load_line(load: dict) -> str:
    return (
        f"{load['protocol']} at {load['multiple']:g}x, n={load['goodput_share_n']}: "
        f"goodput {interval_text(load, 'goodput_share')}, wasted {interval_text(load, 'wasted_share')}, "
        f"refused p99 {interval_text(load, 'refused_ms_p99', 0)} ms, "
        f"answered p99 {interval_text(load, 'answered_ms_p99', 0)} ms, "
        f"recovery {interval_text(load, 'recovery_s', 1)} s, failed {load['failed']}"
    )


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
