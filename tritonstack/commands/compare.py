"""`tritonstack compare`: the command line of tritonstack.experiments.interleaved (see its docstring)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from tritonstack import cli
from tritonstack.experiments import interleaved
from tritonstack.experiments.interleaved import SIDES, CompareSettings, compare, table
from tritonstack.rules.unbuilt import unservable_reason


def parser() -> argparse.ArgumentParser:
    made = cli.parser(interleaved.__doc__)
    cli.add_options(made, CompareSettings)
    return made


def run(args: argparse.Namespace) -> int:
    settings = cli.from_args(CompareSettings, args)
    if settings.a.same_as(settings.b):
        raise cli.UsageError(
            "A and B would be the same: give --b-repository, an --a-env/--b-env or different "
            "--a/--b-recycle-above-mib, --a/--b-front-nice, --a/--b-server-arg, --a/--b-response-cache-mb or "
            "--a/--b-layout"
        )
    for repository in filter(None, (settings.a.repository, settings.b.repository)):
        reason = unservable_reason(repository)
        if reason:
            raise cli.UsageError(reason)
    started = time.monotonic()
    results = compare(settings, log=lambda text: print(text, flush=True))
    results["seconds"] = time.monotonic() - started
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    settings.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    errors = sum(figures[f"{side}_errors"] for figures in results["models"].values() for side in SIDES)
    return 0 if errors == 0 else 1


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
