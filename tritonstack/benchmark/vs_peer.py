"""Our ensembles against the peer (tritonstack.benchmark.peer_service): what a user who
tries both on one machine would measure.

Both are driven by the same asyncio client over HTTP (aiohttp underneath), one image
a request from the same corpus, each side at the number in flight that saturated it
(peer_best_concurrency beside our server_best_concurrency: a competent user tunes
both), in the same interleaved rounds as the rest of the benchmark; CPU per image counts each server's whole
process tree (tritonserver and its stubs; uvicorn and its workers). Its figures
(declared in tritonstack/measure/figures.py):

- peer_images_per_s, peer_cpu_ms_per_image, vs_peer_throughput (ours / the peer's
  images per second), vs_peer_cpu (our CPU per image / the peer's: below 1 is
  cheaper), each a Median of the rounds (interval, n, spread); the same with `int8_` for the INT8 preset against
  the peer serving the same INT8 ONNX file;
- vs_peer_latency: p50 and p99 of both at saturation (the closed-loop rounds), and
  in an open loop at OPEN_LOOP_LOAD of the slower side's saturation, `repeats`
  interleaved rounds, both sides the same Poisson arrivals in a round, each round
  others; vs_peer_saturation_p99, our p99 over the peer's in the closed-loop rounds
  (each side at its best concurrency), and vs_peer_open_loop_p99, the same in that
  open loop (per round: median, interval, n).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tritonstack.measure.figures import Median
from tritonstack.measure.load_loops import Phase, measured_phase, open_loop, saturate, url_for
from tritonstack.measure.load_settings import OPEN_LOOP_LOAD, Settings
from tritonstack.measure.measured_models import CLASSIFIER, DALI_ENSEMBLE, INT8_CLASSIFIER, INT8_ENSEMBLE
from tritonstack.measure.peer_client import PEER_PROTOCOL
from tritonstack.measure.rounds import interleaved, ratios

# round name -> (side, protocol, model); our side's HTTP round is the benchmark's own "http".
PEER_ROUNDS = {
    "peer": ("peer", PEER_PROTOCOL, CLASSIFIER),
    "int8_http": ("ours", "http", INT8_ENSEMBLE),
    "peer_int8": ("peer", PEER_PROTOCOL, INT8_CLASSIFIER),
}
# key prefix -> (our round, the peer's round)
PAIRS = {"": ("http", "peer"), "int8_": ("int8_http", "peer_int8")}


def peer_saturation(peer, images: list[bytes], settings: Settings) -> tuple[int, int]:
    """The peer's own best concurrency over the levels tried for ours, and the failures."""
    _, concurrency, errors = saturate(url_for(peer, PEER_PROTOCOL), PEER_PROTOCOL, CLASSIFIER, images, settings)
    return concurrency, errors


def peer_measures(
    server, peer, images: list[bytes], concurrency: dict[str, int], settings: Settings, int8: bool
) -> dict[str, Callable[[], Phase]]:
    """The rounds the peer adds to the benchmark's (which measures "http" itself), each
    side at its own concurrency (`concurrency`: side -> requests in flight)."""
    servers = {"ours": server, "peer": peer}
    return {
        name: (
            lambda side=side, protocol=protocol, model=model: measured_phase(
                servers[side], protocol, model, images, concurrency[side], settings
            )
        )
        for name, (side, protocol, model) in PEER_ROUNDS.items()
        if int8 or "int8" not in name
    }


@dataclass(frozen=True)
class PeerOpenLoop:
    """Both sides at the same Poisson rate: the rate and each side's p50 and p99
    (`latency`), our p99 over the peer's per round, the failures."""

    latency: dict
    p99_ratio: Median
    errors: int


@dataclass(frozen=True)
class PeerFigures:
    peer_images_per_s: Median
    peer_cpu_ms_per_image: Median
    vs_peer_throughput: Median
    vs_peer_cpu: Median
    int8_peer_images_per_s: Median
    int8_peer_cpu_ms_per_image: Median
    int8_vs_peer_throughput: Median
    int8_vs_peer_cpu: Median
    vs_peer_latency: dict | None
    vs_peer_saturation_p99: Median
    vs_peer_open_loop_p99: Median
    peer_best_concurrency: int | None
    errors: int


def peer_figures(
    rounds: dict[str, list[Phase]], open_loop: PeerOpenLoop | None, saturation: tuple[int, int] | None = None
) -> PeerFigures:
    """The figures above from the rounds and the open loop; None where the peer was not measured."""
    medians = {}
    for prefix, (ours, theirs) in PAIRS.items():
        rates = {name: [phase.images_per_s for phase in rounds.get(name, [])] for name in (ours, theirs)}
        per_cpu = {name: [phase.images_per_cpu_s for phase in rounds.get(name, [])] for name in (ours, theirs)}
        medians[f"{prefix}peer_images_per_s"] = Median.of(rates[theirs])
        medians[f"{prefix}peer_cpu_ms_per_image"] = Median.of([1000 / value for value in per_cpu[theirs] if value])
        medians[f"{prefix}vs_peer_throughput"] = Median.of(ratios(rates[ours], rates[theirs]))
        medians[f"{prefix}vs_peer_cpu"] = Median.of(ratios(per_cpu[theirs], per_cpu[ours]))
    latency = None
    if "peer" in rounds:
        latency = {"saturation": saturation_latency(rounds)} | ({"open_loop": open_loop.latency} if open_loop else {})
    return PeerFigures(
        **medians,
        vs_peer_latency=latency,
        vs_peer_saturation_p99=Median.of(ratios(*(p99_ms_rounds(rounds.get(name, [])) for name in PAIRS[""]))),
        vs_peer_open_loop_p99=open_loop.p99_ratio if open_loop else Median.of([]),
        peer_best_concurrency=saturation[0] if saturation else None,
        errors=(open_loop.errors if open_loop else 0) + (saturation[1] if saturation else 0),
    )


def saturation_latency(rounds: dict[str, list[Phase]]) -> dict:
    def median_ms(name: str, q: float) -> float:
        return float(np.median([phase.percentile_ms(q) for phase in rounds[name]]))

    return {
        side: {"ms_p50": median_ms(name, 50), "ms_p99": median_ms(name, 99)}
        for side, name in (("ours", "http"), ("peer", "peer"))
    }


def p99_ms_rounds(phases: list[Phase]) -> list[float | None]:
    """Each round's p99, None for a round that answered nothing."""
    return [phase.percentile_ms(99) if phase.latencies_s else None for phase in phases]


def slower_rate(rounds: dict[str, list[Phase]]) -> float:
    """The slower side's median images per second in the HTTP rounds; 0 where one was not measured."""
    ours = Median.of([phase.images_per_s for phase in rounds.get("http", []) if phase.images_per_s]).value
    theirs = Median.of([phase.images_per_s for phase in rounds.get("peer", [])]).value
    return min(ours or 0.0, theirs or 0.0)


def seeded_rounds(sides, measure: Callable[[str, int], Phase]) -> dict[str, Callable[[], Phase]]:
    """`measure(side, seed)` for each side, the seed the round's index: both sides see
    the same Poisson arrivals in a round (the same query set), and each round others,
    so that the rounds sample the arrivals too."""
    seeds = {side: itertools.count() for side in sides}
    return {side: (lambda side=side: measure(side, next(seeds[side]))) for side in sides}


def peer_open_loop(server, peer, images: list[bytes], settings: Settings, slower: float, log) -> PeerOpenLoop | None:
    """Both at the same Poisson rate, OPEN_LOOP_LOAD of the slower's saturation
    (`slower`); None when a side measured nothing."""
    if not slower:
        return None
    rate = OPEN_LOOP_LOAD * slower
    seconds = max(settings.open_loop_s, (settings.open_loop_min_requests + 1) / rate)
    log(f"open loop against the peer: {rate:.1f} requests/s over HTTP, {settings.repeats} interleaved rounds...")
    sides = {"ours": (server, "http", DALI_ENSEMBLE), "peer": (peer, PEER_PROTOCOL, CLASSIFIER)}

    def measure(side: str, seed: int) -> Phase:
        target, protocol, model = sides[side]
        loop = open_loop(url_for(target, protocol), model, images, rate, seconds, settings.warmup_s, seed, protocol)
        return asyncio.run(loop)

    rounds = interleaved(seeded_rounds(sides, measure), settings.repeats, log)
    latency: dict = {"rate": rate}
    for side, phases in rounds.items():
        measured = [phase for phase in phases if phase.latencies_s]
        latency[side] = {
            f"ms_p{q}": float(np.median([phase.percentile_ms(q) for phase in measured])) if measured else None
            for q in (50, 99)
        }
    p99 = {side: p99_ms_rounds(rounds[side]) for side in sides}
    errors = sum(phase.errors for phases in rounds.values() for phase in phases)
    return PeerOpenLoop(latency, Median.of(ratios(p99["ours"], p99["peer"])), errors)
