"""`tritonstack compare`: the command line of tritonstack.benchmark.interleaved (see its docstring)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tritonstack import cli
from tritonstack.benchmark import interleaved
from tritonstack.benchmark.interleaved import SIDES, compare, environment_assignment, table
from tritonstack.benchmark.phase_settings import DALI_ENSEMBLE, INT8_ENSEMBLE
from tritonstack.rules.unbuilt import unservable_reason
from tritonstack.serve.layout import LAYOUTS, REPOSITORY_LAYOUT
from tritonstack.serve.supervision import RecyclePolicy, Supervision


def parser() -> argparse.ArgumentParser:
    parser = cli.parser(interleaved.__doc__)
    parser.add_argument("--a-repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--b-repository", type=Path, help="default: A's")
    parser.add_argument("--a-env", type=environment_assignment, action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--b-env", type=environment_assignment, action="append", default=[], metavar="NAME=VALUE")
    for side in SIDES:
        parser.add_argument(
            f"--{side}-recycle-above-mib",
            type=float,
            metavar="MIB",
            help=f"{side.upper()}'s stub recycling bound (0: off; default: the launcher's, "
            f"{RecyclePolicy.above_mib:g})",
        )
        parser.add_argument(
            f"--{side}-front-nice",
            type=int,
            default=Supervision.front_nice,
            metavar="N",
            help=f"{side.upper()}'s nice value for ensembles' first steps (0: as any other stub)",
        )
        parser.add_argument(
            f"--{side}-server-arg",
            action="append",
            default=[],
            metavar="FLAG",
            help=f"a tritonserver flag for {side.upper()}, after the launcher's (the last of a flag wins), e.g. "
            f"--{side}-server-arg=--metrics-config=summary_latencies=false",
        )
        parser.add_argument(
            f"--{side}-layout",
            choices=LAYOUTS,
            default=REPOSITORY_LAYOUT,
            help=f"{side.upper()}'s layout: the repository's own, or sized from the CPUs this process may use "
            "(`tritonstack serve --layout`)",
        )
        parser.add_argument(
            f"--{side}-response-cache-mb",
            type=cli.non_negative_int,
            default=0,
            metavar="N",
            help=f"{side.upper()}'s response cache (for repositories built with --response-cache)",
        )
    parser.add_argument("--model", action="append", help=f"default: {DALI_ENSEMBLE} and {INT8_ENSEMBLE}")
    parser.add_argument("--rounds", type=cli.positive_int, default=5, help="at least 3: a median and a spread")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured per side, model and round")
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--concurrency", type=cli.positive_int, default=24, help="single-image requests in flight")
    parser.add_argument("--rate", type=cli.positive_float, help="an open loop instead: Poisson arrivals, requests/s")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    return parser


def run(args: argparse.Namespace) -> int:
    args.model = args.model or [DALI_ENSEMBLE, INT8_ENSEMBLE]
    if (
        args.b_repository is None
        and not args.a_env
        and not args.b_env
        and args.a_recycle_above_mib == args.b_recycle_above_mib
        and args.a_front_nice == args.b_front_nice
        and args.a_server_arg == args.b_server_arg
        and args.a_response_cache_mb == args.b_response_cache_mb
        and args.a_layout == args.b_layout
    ):
        raise cli.UsageError(
            "A and B would be the same: give --b-repository, an --a-env/--b-env or different "
            "--a/--b-recycle-above-mib, --a/--b-front-nice, --a/--b-server-arg, --a/--b-response-cache-mb or "
            "--a/--b-layout"
        )
    for repository in filter(None, (args.a_repository, args.b_repository)):
        reason = unservable_reason(repository)
        if reason:
            raise cli.UsageError(reason)
    started = time.monotonic()
    results = compare(args, log=lambda text: print(text, flush=True))
    results["seconds"] = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    errors = sum(figures[f"{side}_errors"] for figures in results["models"].values() for side in SIDES)
    return 0 if errors == 0 else 1


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
