"""Load loops against a server: closed loops (N in flight), open loops (a rate, optionally
Poisson), saturation and capacity under an SLO. A Phase is what one load loop measured;
that is all "phase" means in the tools."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from tritonstack.client.aio import AsyncClassifierClient
from tritonstack.client.retry import NO_RETRY
from tritonstack.measure.ideal_queue import highest_passing
from tritonstack.measure.load_settings import CAPACITY_MAX_FRACTION, REQUEST_TIMEOUT_S, Settings
from tritonstack.measure.measured_models import DALI_ENSEMBLE
from tritonstack.measure.peer_client import PEER_PROTOCOL, PeerClient
from tritonstack.measure.server_usage import server_cpu_seconds
from tritonstack.samples.corpus import WeightedSampler, build_corpus
from tritonstack.serve import process_tree


@dataclass
class Phase:
    """One measured load: latencies of successful requests, failures, duration."""

    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None  # warm-up included
    warmup_s: float | None = None  # set with server_cpu_s
    images: int | None = None  # when not one per latency (the in-process reference)
    offered_rate: float | None = None  # an open loop's requests/s
    # Ours: tritonserver, each model's stubs, and the rest (process_tree.cpu_by_role_between).
    server_cpu_by_model_s: dict[str, float] | None = None

    @property
    def images_per_s(self) -> float:
        done = len(self.latencies_s) if self.images is None else self.images
        return done / self.seconds if self.seconds else 0.0

    @property
    def images_per_cpu_s(self) -> float | None:
        """Images per second of server CPU; the CPU covers warm-up, so the images
        of the same window count (at the measured rate)."""
        if not self.server_cpu_s or self.warmup_s is None:
            return None
        return self._window_images / self.server_cpu_s

    @property
    def _window_images(self) -> float:
        """The images of the window the server's CPU covers (warm-up included), at the
        measured rate."""
        return self.images_per_s * (self.seconds + (self.warmup_s or 0.0))

    @property
    def cpu_ms_per_image_by_model(self) -> dict[str, float]:
        """CPU milliseconds per image of tritonserver and of each model's stubs (the
        same window as images_per_cpu_s)."""
        if not self.server_cpu_by_model_s or self.warmup_s is None or not self.images_per_s:
            return {}
        return {name: 1000 * seconds / self._window_images for name, seconds in self.server_cpu_by_model_s.items()}

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q)) * 1000 if self.latencies_s else float("nan")


def load_client(url: str, protocol: str, model: str, max_connections: int = 100):
    """The client a load phase drives: ours over "http" or "grpc", the peer's over
    PEER_PROTOCOL; each answers `probabilities([image])`."""
    if protocol == PEER_PROTOCOL:
        return PeerClient(url, model, REQUEST_TIMEOUT_S, max_connections)
    # Batch priority: a closed loop measures what the server computes, not its refusals.
    # No client-side throttle: a load generator offers the load it is told.
    return AsyncClassifierClient(
        url,
        protocol,
        model,
        retry=NO_RETRY,
        timeout_s=REQUEST_TIMEOUT_S,
        max_connections=max_connections,
        batch=True,
        throttle_ratio=0,
    )


async def closed_loop(
    url: str,
    protocol: str,
    model: str,
    images: list,
    concurrency: int,
    seconds: float,
    warmup_s: float,
    send=None,
) -> Phase:
    """`concurrency` requests always in flight, one image each, for `seconds` after
    warm-up; the requests that ended in that window count (window_phase). `send(client,
    item)`: what one request of `images`' items is, when not the probabilities of one
    encoded image."""
    send = send or (lambda client, image: client.probabilities([image]))
    ended: list[Ended] = []
    async with load_client(url, protocol, model) as client:
        loop = asyncio.get_running_loop()
        measure_from = loop.time() + warmup_s
        end = measure_from + seconds

        async def worker(offset: int):
            index = offset
            while loop.time() < end:
                image = images[index % len(images)]
                index += concurrency
                sent = loop.time()
                try:
                    await send(client, image)
                    ok = True
                except Exception:
                    ok = False
                ended.append(Ended(sent, loop.time(), ok))

        cpu = time.process_time()
        await asyncio.gather(*(worker(offset) for offset in range(concurrency)))
        client_cpu_s = time.process_time() - cpu
    phase = window_phase(ended, measure_from, end)
    phase.client_cpu_s = client_cpu_s
    return phase


@dataclass(frozen=True)
class Ended:
    """One request of a closed loop: when it was sent and ended (the loop's clock), and
    whether it was answered."""

    sent: float
    done: float
    ok: bool


def window_phase(ended: list[Ended], measure_from: float, end: float) -> Phase:
    """The requests that ended within [measure_from, end], whenever sent: a window's
    completions. Counting only those sent in it and done in it would miss about
    `concurrency` requests a window (1.3 % of a 10 s overload capacity at 16 in flight)."""
    phase = Phase(seconds=end - measure_from)
    for request in ended:
        if measure_from <= request.done <= end:
            if request.ok:
                phase.latencies_s.append(request.done - request.sent)
            else:
                phase.errors += 1
    return phase


async def open_loop(
    url: str,
    model: str,
    images: list[bytes],
    rate: float,
    seconds: float,
    warmup_s: float,
    poisson_seed: int | None = None,
    protocol: str = "grpc",
) -> Phase:
    """Requests sent at a fixed rate whatever the answers do; latency counts from the
    scheduled send time (no coordinated omission). With `poisson_seed`, the gaps
    between sends are exponential (Poisson arrivals at that mean rate) instead of equal."""
    phase = Phase(offered_rate=rate)
    total = max(int((warmup_s + seconds) * rate), 1)
    if poisson_seed is None:
        offsets = np.arange(total) / rate
    else:
        gaps = np.random.default_rng(poisson_seed).exponential(1 / rate, total)
        offsets = np.cumsum(gaps) - gaps[0]  # the first request at once, as with equal gaps
    async with load_client(url, protocol, model, max_connections=int(rate * 2) + 16) as client:
        loop = asyncio.get_running_loop()
        start = loop.time()
        measure_from = start + warmup_s

        async def one(scheduled: float, image: bytes):
            try:
                await client.probabilities([image])
            except Exception:
                if scheduled >= measure_from:
                    phase.errors += 1
                return
            if scheduled >= measure_from:
                phase.latencies_s.append(loop.time() - scheduled)

        tasks = []
        for index in range(total):
            scheduled = start + float(offsets[index])
            await asyncio.sleep(max(0.0, scheduled - loop.time()))
            tasks.append(asyncio.create_task(one(scheduled, images[index % len(images)])))
        await asyncio.gather(*tasks)
        phase.seconds = seconds
    return phase


def saturate(url: str, protocol: str, model: str, images: list[bytes], settings: Settings) -> tuple[Phase, int, int]:
    """The best throughput over the concurrency levels tried, that level, and the
    failures of all levels."""
    phases = {
        concurrency: asyncio.run(
            closed_loop(url, protocol, model, images, concurrency, settings.seconds, settings.warmup_s)
        )
        for concurrency in settings.concurrency
    }
    best = max(phases, key=lambda concurrency: phases[concurrency].images_per_s)
    return phases[best], best, sum(phase.errors for phase in phases.values())


def url_for(server, protocol: str) -> str:
    """The endpoint of `server` (ours, or the peer) that speaks `protocol`."""
    if protocol == PEER_PROTOCOL:
        return server.url
    return server.http_url if protocol == "http" else server.grpc_url


def measured_phase(
    server, protocol: str, model: str, images: list[bytes], concurrency: int, settings: Settings
) -> Phase:
    """One closed-loop phase on `model`, with the server's CPU time over it (ours: by
    process role too)."""
    ours = protocol != PEER_PROTOCOL
    cpu, by_model = server_cpu_seconds(server), process_tree.cpu_seconds_by_model(server.pid) if ours else {}
    url = url_for(server, protocol)
    phase = asyncio.run(closed_loop(url, protocol, model, images, concurrency, settings.seconds, settings.warmup_s))
    phase.server_cpu_s, phase.warmup_s = server_cpu_seconds(server) - cpu, settings.warmup_s
    if ours:
        after = process_tree.cpu_seconds_by_model(server.pid)
        phase.server_cpu_by_model_s = process_tree.cpu_by_role_between(by_model, after, phase.server_cpu_s)
    return phase


def current_saturation(server, images: list[bytes], concurrency: int, settings: Settings) -> Phase:
    """The ensemble's closed-loop rate now. An open loop's rate is set from the
    saturation measured just before it: a shared machine's speed drifts within minutes,
    and a fraction of a stale saturation is another load, with another tail
    (docs/performance.md, "Method")."""
    return asyncio.run(
        closed_loop(server.grpc_url, "grpc", DALI_ENSEMBLE, images, concurrency, settings.seconds, settings.warmup_s)
    )


@dataclass(frozen=True)
class CapacitySearch:
    """One search of capacity_at_slo: the saturation it was a fraction of, the highest
    fraction that met the SLO and every probe."""

    saturation: Phase
    fraction: float
    probes: list[dict]


def capacity_at_slo(
    server, images: list[bytes], concurrency: int, slo_ms: float, settings: Settings, first_seed: int = 0
) -> CapacitySearch:
    """The closed-loop saturation at `concurrency` measured once, then the highest
    fraction of it whose open loop (Poisson arrivals, each probe its own seed from
    `first_seed`) keeps p99 under `slo_ms` with no failure: the upper bound
    CAPACITY_MAX_FRACTION first, then a bisection of [0, bound] in
    `settings.capacity_probes` steps."""
    saturation = current_saturation(server, images, concurrency, settings)
    probes: list[dict] = []

    def meets(fraction: float) -> bool:
        rate = fraction * saturation.images_per_s or 1.0
        phase = asyncio.run(
            open_loop(
                server.grpc_url,
                DALI_ENSEMBLE,
                images,
                rate,
                settings.capacity_s,
                settings.warmup_s,
                poisson_seed=first_seed + len(probes),
            )
        )
        p99 = phase.percentile_ms(99)
        met = phase.errors == 0 and bool(phase.latencies_s) and p99 < slo_ms
        probes.append(
            {
                "fraction": fraction,
                "saturation": saturation.images_per_s,
                "rate": rate,
                "p99_ms": p99,
                "errors": phase.errors,
                "met": met,
            }
        )
        return met

    fraction = highest_passing(meets, CAPACITY_MAX_FRACTION, settings.capacity_probes)
    return CapacitySearch(saturation, fraction, probes)


def typical_image() -> bytes:
    """The corpus's most common kind: a medium-size photo."""
    return next(image.data for image in build_corpus() if "@640" in image.name)


def weighted_images(count: int) -> list[bytes]:
    """`count` encoded images drawn from the load tests' weighted corpus, the same every run."""
    sampler = WeightedSampler(build_corpus(), seed=0)
    return [sampler.draw().data for _ in range(count)]
