"""Before and after in one run: two servers side by side, measured in interleaved rounds.

    tritonstack compare --b-repository /tmp/candidate --out reports/compare.json
    tritonstack compare --b-env DALI_MALLOC_POOL_THRESHOLD=0 --out reports/compare.json

A serves --a-repository (default: model_repository) with --a-env added to its
environment and --a-server-arg added to tritonserver's flags, B serves
--b-repository (default: A's) with --b-env and --b-server-arg:

    tritonstack compare --b-server-arg=--metrics-config=summary_latencies=false --out reports/summaries.json

Both run for the whole comparison, on free loopback ports, but only one is under load at a time:
each round measures every --model on A then B, on the next round B then A, so the
drift of a shared machine and the order of the sides both cancel out in the
medians. Per model it writes the closed-loop rate of each side (images/s at
--concurrency single-image requests in flight), `b_over_a` (the median of the
rounds' B/A) with `b_over_a_interval` (its 95 % bootstrap interval), `b_over_a_n`
(the rounds it rests on), `b_over_a_spread` [min, max] and `b_over_a_verdict`, each
side's median p50 and p99 latency with `b_over_a_ms_p99` (the median of the rounds'
B/A p99, with the same four), and each side's memory by process after the rounds
(every per-model key is declared in tritonstack/measure/figures.py, COMPARE).
Change one thing between A and B. The verdict is B "faster" or "slower" than A only
where the interval lies wholly on one side of 1, and "inconclusive" where it holds 1:
a median on the right side of 1 is not yet a change. At 5 rounds or fewer the 95 %
interval of a median is the rounds' [min, max], so every round must agree.

With --rate R the load is an open loop instead: Poisson arrivals at R requests/s,
latency counted from each request's scheduled send, the same arrival times for A
and B within a round (a new draw each round). That compares tails at a given load,
where a closed loop compares throughput:

    tritonstack compare --b-repository /tmp/candidate --rate 65 --seconds 12 --out reports/tail.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from tritonstack import cli
from tritonstack.measure.figures import COMPARE, SIDES, Median, report
from tritonstack.measure.load_loops import Phase, closed_loop, open_loop, weighted_images
from tritonstack.measure.measured_models import DALI_ENSEMBLE, INT8_ENSEMBLE
from tritonstack.measure.rounds import ratios
from tritonstack.measure.server_usage import server_rss_mb_by_process
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.layout import REPOSITORY_LAYOUT
from tritonstack.serve.server_config import ServerConfig
from tritonstack.serve.supervision import RecyclePolicy, Supervision


def environment_assignment(text: str) -> tuple[str, str]:
    """NAME=VALUE, as on a shell's command line."""
    name, equals, value = text.partition("=")
    if not equals or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, not {text!r}")
    return name, value


@dataclass(frozen=True)
class Side:
    """What one side of the comparison serves and how: serve's options, mirrored
    (--a-layout, --b-layout, ...)."""

    repository: Path | None = cli.option(None, "--repository", type=Path, help="the model repository served")
    env: tuple[tuple[str, str], ...] = cli.option(
        (),
        "--env",
        type=environment_assignment,
        action="append",
        command_default=[],
        convert=tuple,
        metavar="NAME=VALUE",
        help="added to the server's environment",
    )
    recycle_above_mib: float | None = cli.mirror(
        RecyclePolicy,
        "above_mib",
        default=None,
        metavar="MIB",
        help=f"the stub recycling bound (0: off; default: the launcher's, {RecyclePolicy.above_mib:g})",
    )
    front_nice: int = cli.mirror(
        Supervision, "front_nice", help="nice value for ensembles' first steps (0: as any other stub)"
    )
    server_args: tuple[str, ...] = cli.option(
        (),
        "--server-arg",
        action="append",
        command_default=[],
        convert=tuple,
        metavar="FLAG",
        help="a tritonserver flag, after the launcher's (the last of a flag wins), e.g. "
        "--b-server-arg=--metrics-config=summary_latencies=false",
    )
    layout: str = cli.mirror(
        ServerConfig,
        "layout",
        default=REPOSITORY_LAYOUT,
        help="the repository's own, or sized from the CPUs this process may use (`tritonstack serve --layout`)",
    )
    response_cache_bytes: int = cli.mirror(
        ServerConfig, "response_cache_bytes", help="the response cache (for repositories built with --response-cache)"
    )

    def same_as(self, other: Side) -> bool:
        """Whether the two sides would serve alike: nothing given to tell them apart."""
        return other.repository is None and not self.env and not other.env and replace(self, repository=None) == other


@dataclass(frozen=True)
class CompareSettings:
    a: Side = cli.nested(Side, default_factory=lambda: Side(repository=cli.DEFAULT_REPOSITORY), prefix="a")
    b: Side = cli.nested(Side, default_factory=Side, prefix="b")
    models: tuple[str, ...] = cli.option(  # (): the default pair, model_names
        (),
        "--model",
        action="append",
        command_default=None,
        convert=lambda names: tuple(names or ()),
        help=f"default: {DALI_ENSEMBLE} and {INT8_ENSEMBLE}",
    )
    rounds: int = cli.option(
        5,
        "--rounds",
        type=cli.positive_int,
        help="at least 5 for a verdict: the interval of 5 or fewer is their [min, max], and with no change "
        "every one of n rounds lands on the same side of 1 once in 2^n, under 1 in 20 from 5 on",
    )
    seconds: float = cli.option(8.0, "--seconds", type=float, help="measured per side, model and round")
    warmup_s: float = cli.option(1.0, "--warmup-s", type=float)
    concurrency: int = cli.option(24, "--concurrency", type=cli.positive_int, help="single-image requests in flight")
    rate: float | None = cli.option(
        None, "--rate", type=cli.positive_float, help="an open loop instead: Poisson arrivals, requests/s"
    )
    out: Path = cli.out_option(cli.REQUIRED, help="JSON file to write")

    @property
    def model_names(self) -> tuple[str, ...]:
        return self.models or (DALI_ENSEMBLE, INT8_ENSEMBLE)

    def repositories(self) -> dict[str, Path]:
        """Each side's repository as given (B's defaults to A's): what the report names."""
        return {"a": self.a.repository, "b": self.b.repository or self.a.repository}


def interleaved_sides(measure, models: list[str], rounds: int, log=print) -> dict[tuple[str, str], list[Phase]]:
    """measure(side, model, round) for every model, A then B on even rounds, B then A on odd ones."""
    phases: dict[tuple[str, str], list[Phase]] = {(side, model): [] for side in SIDES for model in models}
    for index in range(rounds):
        order = SIDES if index % 2 == 0 else SIDES[::-1]
        for model in models:
            for side in order:
                phases[(side, model)].append(measure(side, model, index))
        log(
            f"  round {index + 1}/{rounds}: "
            + ", ".join(
                f"{model} A {phases[('a', model)][-1].images_per_s:.1f} B {phases[('b', model)][-1].images_per_s:.1f}"
                for model in models
            )
        )
    return phases


@dataclass(frozen=True)
class ModelComparison:
    """One model's figures (tritonstack/measure/figures.py, COMPARE)."""

    a_images_per_s: Median
    a_ms_p50: Median
    a_ms_p99: Median
    a_errors: int
    b_images_per_s: Median
    b_ms_p50: Median
    b_ms_p99: Median
    b_errors: int
    b_over_a: Median
    b_over_a_verdict: str
    b_over_a_ms_p99: Median
    b_over_a_ms_p99_verdict: str


def change_verdict(ratio: Median, lower_is_faster: bool = False) -> str:
    """B "faster" or "slower" than A where the 95 % interval of the median B/A lies
    wholly on one side of 1, "inconclusive" where it holds 1 or there is none (under
    2 rounds). A ratio of rates is faster above 1, one of latencies below."""
    if ratio.interval is None:
        return "inconclusive"
    low, high = ratio.interval
    above, below = ("slower", "faster") if lower_is_faster else ("faster", "slower")
    return above if low > 1 else below if high < 1 else "inconclusive"


def model_comparison(phases: dict[tuple[str, str], list[Phase]], model: str) -> ModelComparison:
    """Each side's median rate and latencies, B/A median with its interval and verdict."""
    sides = {}
    for side in SIDES:
        measured = [phase for phase in phases[(side, model)] if phase.latencies_s]
        sides[f"{side}_images_per_s"] = Median.of([phase.images_per_s for phase in measured])
        sides[f"{side}_ms_p50"] = Median.of([phase.percentile_ms(50) for phase in measured])
        sides[f"{side}_ms_p99"] = Median.of([phase.percentile_ms(99) for phase in measured])
        sides[f"{side}_errors"] = sum(phase.errors for phase in phases[(side, model)])

    def b_over_a(measure) -> Median:
        return Median.of(
            ratios(
                [measure(phase) for phase in phases[("b", model)]], [measure(phase) for phase in phases[("a", model)]]
            )
        )

    rate = b_over_a(lambda phase: phase.images_per_s)
    p99 = b_over_a(lambda phase: phase.percentile_ms(99))
    return ModelComparison(
        **sides,
        b_over_a=rate,
        b_over_a_verdict=change_verdict(rate),
        b_over_a_ms_p99=p99,
        b_over_a_ms_p99_verdict=change_verdict(p99, lower_is_faster=True),
    )


def summary(phases: dict[tuple[str, str], list[Phase]], models: list[str]) -> dict:
    """Per model: its figures."""
    return {model: report(COMPARE, model_comparison(phases, model)) for model in models}


def recycle_policy(above_mib: float | None) -> RecyclePolicy | None:
    """The launcher's stub recycling: its default, another bound, or off (0)."""
    if above_mib is None:
        return RecyclePolicy()
    return RecyclePolicy(above_mib=above_mib) if above_mib > 0 else None


def _server_config(side: Side, repository: Path) -> ServerConfig:
    return ServerConfig(
        repository,
        extra_args=side.server_args,
        response_cache_bytes=side.response_cache_bytes,
        layout=side.layout,
    )


def _measure(args: CompareSettings, servers: dict[str, TritonServer], images: list[bytes]):
    """measure(side, model, round): one phase, an open loop at --rate or a closed loop."""

    def measure(side: str, model: str, round_index: int) -> Phase:
        url = servers[side].grpc_url
        if args.rate:
            return asyncio.run(
                open_loop(url, model, images, args.rate, args.seconds, args.warmup_s, poisson_seed=round_index)
            )
        return asyncio.run(closed_loop(url, "grpc", model, images, args.concurrency, args.seconds, args.warmup_s))

    return measure


def compare(args: CompareSettings, log=print) -> dict:
    images = weighted_images(400)
    sides = {"a": args.a, "b": args.b}
    repositories = args.repositories()
    environments = {side: dict(sides[side].env) for side in SIDES}
    recycles = {side: recycle_policy(sides[side].recycle_above_mib) for side in SIDES}
    supervisions = {side: Supervision(recycle=recycles[side], front_nice=sides[side].front_nice) for side in SIDES}
    configs = {side: _server_config(sides[side], repositories[side].resolve()) for side in SIDES}
    with contextlib.ExitStack() as stack:
        servers = {
            side: stack.enter_context(TritonServer(configs[side], supervisions[side], environment=environments[side]))
            for side in SIDES
        }
        load = f"Poisson arrivals at {args.rate:g}/s" if args.rate else f"{args.concurrency} in flight"
        log(f"{args.rounds} rounds of {', '.join(args.model_names)} at {load}, {args.seconds:g} s per side...")
        phases = interleaved_sides(_measure(args, servers, images), list(args.model_names), args.rounds, log)
        memory = {side: server_rss_mb_by_process(servers[side]) for side in SIDES}
    return {
        **{
            side: {
                "repository": str(repositories[side]),
                "layout": sides[side].layout,
                "environment": environments[side],
                "recycle_above_mib": recycles[side].above_mib if recycles[side] else None,
                "front_nice": supervisions[side].front_nice,
                "server_args": list(configs[side].extra_args),
                "response_cache_bytes": configs[side].response_cache_bytes,
            }
            for side in SIDES
        },
        "settings": {
            "rounds": args.rounds,
            "seconds": args.seconds,
            "warmup_s": args.warmup_s,
            "concurrency": None if args.rate else args.concurrency,
            "rate": args.rate,
        },
        "models": summary(phases, list(args.model_names)),
        "server_rss_mb_by_process": memory,
        "server_rss_mb": {side: sum(memory[side].values()) if memory[side] else None for side in SIDES},
    }


def _ratio_text(figures: dict, key: str) -> str:
    """ "1.031 [0.982, 1.064] n=5 inconclusive": the median B/A, its 95 % interval, n, the verdict."""
    if figures[key] is None:
        return "-"
    return f"{Median.read(figures, key).text()} {figures[f'{key}_verdict']}"


def table(results: dict) -> str:
    lines = [
        "| model | A images/s | B images/s | B/A median [95 % interval] n verdict | A p99 ms | B p99 ms "
        "| B/A p99 [95 % interval] n verdict |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for model, figures in results["models"].items():
        lines.append(
            f"| {model} | {figures['a_images_per_s']:.1f} | {figures['b_images_per_s']:.1f} | "
            f"{_ratio_text(figures, 'b_over_a')} | {figures['a_ms_p99']:.0f} | "
            f"{figures['b_ms_p99']:.0f} | {_ratio_text(figures, 'b_over_a_ms_p99')} |"
        )
    memory = results["server_rss_mb"]
    lines.append(f"\nserver RSS after the rounds: A {memory['a']:.0f} MB, B {memory['b']:.0f} MB")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(cli.replaced_by("tritonstack compare"))
