"""`tritonstack plan`: the command line of tritonstack.benchmark.capacity_plan (see its docstring)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tritonstack import cli
from tritonstack.benchmark import capacity_plan
from tritonstack.benchmark.capacity_plan import InfeasiblePlan, plan


def parser() -> argparse.ArgumentParser:
    parser = cli.parser(capacity_plan.__doc__)
    parser.add_argument("benchmark", type=Path, help="JSON written by tritonstack/benchmark --out")
    parser.add_argument("--target-rps", type=float, required=True, help="requests per second to serve")
    parser.add_argument("--p99-ms", type=float, required=True, help="p99 latency budget, ms")
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        result = plan(json.loads(args.benchmark.read_text()), args.target_rps, args.p99_ms)
    except InfeasiblePlan as error:
        print(f"infeasible: {error}")
        return 1
    print(result.explain())
    return 0


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
