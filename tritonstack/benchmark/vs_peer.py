"""Our ensembles against the peer (tritonstack.benchmark.peer_service): what a user who
tries both on one machine would measure.

Both are driven by the same asyncio client over HTTP (aiohttp underneath), one image
a request from the same corpus, the same number in flight, in the same interleaved
rounds as the rest of the benchmark; CPU per image counts each server's whole
process tree (tritonserver and its stubs; uvicorn and its workers). Writes:

- peer_images_per_s, peer_cpu_ms_per_image, vs_peer_throughput (ours / the peer's
  images per second), vs_peer_cpu (our CPU per image / the peer's: below 1 is
  cheaper), each with its spread; the same with `int8_` for the INT8 preset against
  the peer serving the same INT8 ONNX file;
- vs_peer_latency: p50 and p99 of both at saturation (the closed-loop rounds), and
  in an open loop at OPEN_LOOP_LOAD of the slower side's saturation, the same
  Poisson arrivals for both, `repeats` interleaved times; vs_peer_open_loop_p99,
  our p99 over the peer's in that open loop (per round: median and spread).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from tritonstack.benchmark.peer import PEER_PROTOCOL
from tritonstack.benchmark.phases import Phase, interleaved, measured_phase, open_loop, ratios, url_for, write_median
from tritonstack.benchmark.settings import (
    CLASSIFIER,
    DALI_ENSEMBLE,
    INT8_CLASSIFIER,
    INT8_ENSEMBLE,
    OPEN_LOOP_LOAD,
    Settings,
)

# round name -> (side, protocol, model); our side's HTTP round is the benchmark's own "http".
PEER_ROUNDS = {
    "peer": ("peer", PEER_PROTOCOL, CLASSIFIER),
    "int8_http": ("ours", "http", INT8_ENSEMBLE),
    "peer_int8": ("peer", PEER_PROTOCOL, INT8_CLASSIFIER),
}
# key prefix -> (our round, the peer's round)
PAIRS = {"": ("http", "peer"), "int8_": ("int8_http", "peer_int8")}


def peer_measures(
    server, peer, images: list[bytes], concurrency: int, settings: Settings, int8: bool
) -> dict[str, Callable[[], Phase]]:
    """The rounds the peer adds to the benchmark's (which measures "http" itself)."""
    servers = {"ours": server, "peer": peer}
    return {
        name: (
            lambda side=side, protocol=protocol, model=model: measured_phase(
                servers[side], protocol, model, images, concurrency, settings
            )
        )
        for name, (side, protocol, model) in PEER_ROUNDS.items()
        if int8 or "int8" not in name
    }


def write_vs_peer(results: dict, rounds: dict[str, list[Phase]]) -> None:
    """The keys above from the rounds; None where the peer was not measured."""
    for prefix, (ours, theirs) in PAIRS.items():
        rates = {name: [phase.images_per_s for phase in rounds.get(name, [])] for name in (ours, theirs)}
        per_cpu = {name: [phase.images_per_cpu_s for phase in rounds.get(name, [])] for name in (ours, theirs)}
        write_median(results, f"{prefix}peer_images_per_s", rates[theirs])
        write_median(results, f"{prefix}peer_cpu_ms_per_image", [1000 / value for value in per_cpu[theirs] if value])
        write_median(results, f"{prefix}vs_peer_throughput", ratios(rates[ours], rates[theirs]))
        write_median(results, f"{prefix}vs_peer_cpu", ratios(per_cpu[theirs], per_cpu[ours]))
    results["vs_peer_latency"] = {"saturation": saturation_latency(rounds)} if "peer" in rounds else None
    write_median(results, "vs_peer_open_loop_p99", [])  # written by write_peer_open_loop when it runs


def saturation_latency(rounds: dict[str, list[Phase]]) -> dict:
    def median_ms(name: str, q: float) -> float:
        return float(np.median([phase.percentile_ms(q) for phase in rounds[name]]))

    return {
        side: {"ms_p50": median_ms(name, 50), "ms_p99": median_ms(name, 99)}
        for side, name in (("ours", "http"), ("peer", "peer"))
    }


def write_peer_open_loop(results: dict, server, peer, images: list[bytes], settings: Settings, log) -> int:
    """Both at the same Poisson rate, OPEN_LOOP_LOAD of the slower's saturation;
    returns failures."""
    slower = min(results["http_images_per_s"] or 0.0, results["peer_images_per_s"] or 0.0)
    if not slower:
        return 0
    rate = OPEN_LOOP_LOAD * slower
    seconds = max(settings.open_loop_s, (settings.open_loop_min_requests + 1) / rate)
    log(f"open loop against the peer: {rate:.1f} requests/s over HTTP, {settings.repeats} interleaved rounds...")
    sides = {"ours": (server, "http", DALI_ENSEMBLE), "peer": (peer, PEER_PROTOCOL, CLASSIFIER)}

    def measure(side: str, seed: int) -> Phase:
        target, protocol, model = sides[side]
        loop = open_loop(url_for(target, protocol), model, images, rate, seconds, settings.warmup_s, seed, protocol)
        return asyncio.run(loop)

    rounds = interleaved({side: (lambda side=side: measure(side, seed=7)) for side in sides}, settings.repeats, log)
    latency = results["vs_peer_latency"]["open_loop"] = {"rate": rate}
    for side, phases in rounds.items():
        measured = [phase for phase in phases if phase.latencies_s]
        latency[side] = {
            f"ms_p{q}": float(np.median([phase.percentile_ms(q) for phase in measured])) if measured else None
            for q in (50, 99)
        }
    p99 = {side: [phase.percentile_ms(99) if phase.latencies_s else None for phase in rounds[side]] for side in sides}
    write_median(results, "vs_peer_open_loop_p99", ratios(p99["ours"], p99["peer"]))
    return sum(phase.errors for phases in rounds.values() for phase in phases)
