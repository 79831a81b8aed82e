"""`tritonstack plan`: the command line of tritonstack.experiments.capacity_plan (see its docstring)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from tritonstack import cli
from tritonstack.experiments import capacity_plan
from tritonstack.experiments.capacity_plan import InfeasiblePlan, plan


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    benchmark: Path = cli.option(None, "benchmark", type=Path, help="JSON written by `tritonstack benchmark --out`")
    target_rps: float = cli.option(None, "--target-rps", type=float, required=True, help="requests per second to serve")
    p99_ms: float = cli.option(None, "--p99-ms", type=float, required=True, help="p99 latency budget, ms")


def parser() -> argparse.ArgumentParser:
    made = cli.parser(capacity_plan.__doc__)
    cli.add_options(made, PlanOptions)
    return made


def run(args: argparse.Namespace) -> int:
    options = cli.from_args(PlanOptions, args)
    try:
        result = plan(json.loads(options.benchmark.read_text()), options.target_rps, options.p99_ms)
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
