"""`tritonstack tune`: the command line of tritonstack.benchmark.layout_search (see its docstring)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tritonstack import cli
from tritonstack.benchmark import layout_search, tune_output
from tritonstack.benchmark.phases import weighted_images
from tritonstack.contract import DEFAULT_MODEL
from tritonstack.rules.unbuilt import unservable_reason
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.layout import read_cores
from tritonstack.serve.server_config import ServerConfig


def parser() -> argparse.ArgumentParser:
    made = cli.parser(layout_search.__doc__)
    made.add_argument("--model-repository", type=Path, default=Path("model_repository"), help="the one tuned")
    made.add_argument("--model", default=DEFAULT_MODEL, help="the ensemble whose steps are sized")
    made.add_argument("--out", type=Path, required=True, help="the new repository folder (must not exist)")
    made.add_argument("--report", type=Path, default=Path("reports/tune"), help="tune.json, tune.md, pareto.png")
    cli.add_options(made, layout_search.TuneSettings)
    return made


def run(args: argparse.Namespace) -> int:
    settings = cli.from_args(layout_search.TuneSettings, args)
    _check_paths(args.model_repository, args.out)
    cores = read_cores()
    print(f"tuning {args.model} on {cores.describe()}, objective {settings.objective}, budget {settings.budget_s:g} s")
    with TritonServer(ServerConfig(args.model_repository)) as server:
        start, results = layout_search.search(server, args.model, weighted_images(200), cores.usable, settings, print)
    chosen = layout_search.best(results, settings)
    args.report.mkdir(parents=True, exist_ok=True)
    tune_output.save(args.report, results, chosen, tune_output.report(start, results, chosen, settings, cores.usable))
    unmet = layout_search.unmet_bound(results, settings)
    if unmet:  # the report says what each candidate reached; no folder claims what none did
        print(f"report: {args.report / 'tune.md'}, {args.report / 'pareto.png'}")
        print(f"error: {unmet}", file=sys.stderr)
        return 1
    tune_output.write_repository(args.model_repository, args.out, args.model, chosen.layout)
    print(f"chosen: {chosen.layout.describe()} ({chosen.images_per_s:.1f} images/s)")
    print(f"wrote {args.out}; tritonstack build {' '.join(chosen.layout.build_flags())}")
    print(f"report: {args.report / 'tune.md'}, {args.report / 'pareto.png'}")
    return 0


def _check_paths(repository: Path, out: Path) -> None:
    reason = unservable_reason(repository)
    if reason:
        raise cli.UsageError(reason)
    if out.exists():
        raise cli.UsageError(f"{out}: exists; tune writes a new folder, never over one")
    if out.resolve().is_relative_to(repository.resolve()):
        raise cli.UsageError(f"{out}: inside the tuned repository; write the new one elsewhere")


def main(argv: list[str] | None = None) -> int:
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
