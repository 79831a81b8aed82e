"""`tritonstack soak`: the command line of tritonstack.diagnostics.memory_growth (see its docstring)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from tritonstack import cli
from tritonstack.diagnostics import memory_growth
from tritonstack.diagnostics.memory_growth import run_soak, summary
from tritonstack.rules.unbuilt import unservable_reason
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import as_served


@dataclasses.dataclass(frozen=True)
class SoakOptions(cli.RepositoryOption):
    """The repository is served by a server of the soak's own, on free loopback ports."""

    duration: float = cli.option(1800, "--duration", type=float, help="seconds of load")
    warmup: float | None = cli.option(
        None, "--warmup", type=float, help="seconds left out of the slope (default: a quarter)"
    )
    workers: int = cli.option(2, "--workers", type=cli.positive_int, help="threads per protocol")
    bad_ratio: float = cli.option(0.25, "--bad-ratio", type=float, help="share of broken images sent")
    max_requests: int = cli.option(1_000_000, "--max-requests", type=cli.positive_int, help="stop after this many")
    period: float = cli.option(1.0, "--period", type=float, help="seconds between memory samples")
    out: Path = cli.out_option(Path("reports/soak.json"), help="JSON report")


def parser() -> argparse.ArgumentParser:
    made = cli.parser(memory_growth.__doc__.split("\n\n")[0])
    cli.add_options(made, SoakOptions)
    return made


def run(args: argparse.Namespace) -> int:
    options = cli.from_args(SoakOptions, args)
    reason = unservable_reason(options.model_repository)
    if reason:
        raise cli.UsageError(reason)
    if options.duration <= 0 or not 0 <= options.bad_ratio <= 1:
        raise cli.OptionError("--duration must be above 0 and --bad-ratio between 0 and 1")
    with TritonServer(as_served(options.model_repository)) as server:
        report = run_soak(
            server,
            options.duration,
            options.warmup,
            options.workers,
            options.bad_ratio,
            options.period,
            options.max_requests,
        )
        report["supervisor_reloads"] = [model for _, model in server.supervisor.reloads]
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(report, indent=1))
    print(summary(report))
    print(f"report: {options.out}")
    return 0 if report["passed"] else 1


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
