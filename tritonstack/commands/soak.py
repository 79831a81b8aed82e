"""`tritonstack soak`: the command line of tritonstack.diagnostics.memory_growth (see its docstring)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tritonstack import cli
from tritonstack.diagnostics import memory_growth
from tritonstack.diagnostics.memory_growth import run_soak, summary
from tritonstack.rules.unbuilt import unservable_reason
from tritonstack.serve.launcher import TritonServer


def parser() -> argparse.ArgumentParser:
    parser = cli.parser(memory_growth.__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1800, help="seconds of load")
    parser.add_argument("--warmup", type=float, default=None, help="seconds left out of the slope (default: a quarter)")
    parser.add_argument("--workers", type=cli.positive_int, default=2, help="threads per protocol")
    parser.add_argument("--bad-ratio", type=float, default=0.25, help="share of broken images sent")
    parser.add_argument("--max-requests", type=cli.positive_int, default=1_000_000, help="stop after this many")
    parser.add_argument("--period", type=float, default=1.0, help="seconds between memory samples")
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=Path("model_repository"),
        help="served by a server of the soak's own, on free loopback ports",
    )
    parser.add_argument("--out", type=Path, default=Path("reports/soak.json"), help="JSON report")
    return parser


def run(args: argparse.Namespace) -> int:
    reason = unservable_reason(args.model_repository)
    if reason:
        raise cli.UsageError(reason)
    if args.duration <= 0 or not 0 <= args.bad_ratio <= 1:
        raise cli.OptionError("--duration must be above 0 and --bad-ratio between 0 and 1")
    with TritonServer(args.model_repository) as server:
        report = run_soak(
            server, args.duration, args.warmup, args.workers, args.bad_ratio, args.period, args.max_requests
        )
        report["supervisor_reloads"] = [model for _, model in server.supervisor.reloads]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(summary(report))
    print(f"report: {args.out}")
    return 0 if report["passed"] else 1


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
