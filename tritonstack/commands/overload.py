"""`tritonstack overload`: the command line of tritonstack.experiments.goodput, and with
--soak of tritonstack.experiments.overload_soak (see their docstrings)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from tritonstack import cli
from tritonstack.client.preflight import check_model
from tritonstack.client.retry import RetryPolicy
from tritonstack.contract import DEFAULT_MODEL, admin_headers
from tritonstack.experiments import goodput, overload_soak
from tritonstack.measure.load_loops import weighted_images
from tritonstack.serve.target import given_endpoints, target_server


@dataclasses.dataclass(frozen=True)
class OverloadOptions(cli.ServerAddress, cli.RepositoryOption):
    """The repository is served when no --url is given."""

    out: Path = cli.out_option(cli.REQUIRED, help="JSON file to write")
    model: str = cli.option(DEFAULT_MODEL, "--model", help="the ensemble loaded")
    settings: goodput.OverloadSettings = cli.nested(goodput.OverloadSettings, default_factory=goodput.OverloadSettings)
    within_capacity: bool = cli.option(
        False,
        "--within-capacity",
        help=f"one open loop at {goodput.WITHIN_CAPACITY:g}x the capacity instead of --multiples: "
        "what a busy hour refuses or answers late",
    )
    soak: bool = cli.option(
        False,
        "--soak",
        group=overload_soak.SOAK_OPTIONS,
        help="run the overload soak instead (exit 1 unless it passes)",
    )
    soak_settings: overload_soak.SoakSettings = cli.nested(
        overload_soak.SoakSettings, default_factory=overload_soak.SoakSettings
    )


def parser() -> argparse.ArgumentParser:
    made = cli.parser(goodput.__doc__)
    cli.add_options(made, OverloadOptions)
    return made


# The open loops' options: --soak swings its own loads (--soak-seconds, --period-seconds).
SOAK_IGNORES = ("seconds", "multiples", "protocols", "rounds")


def run(args: argparse.Namespace) -> int:
    options = cli.from_args(OverloadOptions, args)
    settings = options.settings
    if options.soak:
        refuse_what_the_soak_ignores(options)
    if options.within_capacity:
        settings = dataclasses.replace(settings, multiples=(goodput.WITHIN_CAPACITY,))
    http_url, grpc_url, _ = given_endpoints(options.url, options.grpc_url, None)
    with target_server(options.model_repository, http_url, grpc_url, None) as server:
        target = goodput.Target(server.http_url, server.grpc_url, server.admin_headers("http"), server.pid)
        for protocol in goodput.PROTOCOLS if options.soak else settings.protocols:
            check_model(target.url(protocol), protocol, options.model, admin_headers(protocol), RetryPolicy(retries=1))
        if options.soak:
            results = soak(options, settings, target, server.pid)
        else:
            results = goodput.run_overload(target, options.model, weighted_images(400), settings, log=cli_log)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"report: {options.out}")
    if options.soak:
        return 0 if results["passed"] else 1
    return 0 if all(phase["failed"] == 0 for phase in results["phases"]) else 1


def refuse_what_the_soak_ignores(options: OverloadOptions) -> None:
    ignored = cli.changed_flags(options.settings, SOAK_IGNORES) + cli.changed_flags(options, ("within_capacity",))
    if ignored:
        raise cli.OptionError(
            f"{', '.join(ignored)}: not with --soak, which runs its own loads "
            "(--soak-seconds, --period-seconds; --deadline-ms and --capacity-seconds apply)"
        )


def soak(
    options: OverloadOptions, settings: goodput.OverloadSettings, target: goodput.Target, server_pid: int | None
) -> dict:
    soak_settings = dataclasses.replace(
        options.soak_settings, deadline_s=settings.deadline_s, capacity_s=settings.capacity_s
    )
    report = overload_soak.run_overload_soak(
        target, server_pid, options.model, weighted_images(400), soak_settings, log=cli_log
    )
    print(overload_soak.summary(report))
    return report


def cli_log(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
