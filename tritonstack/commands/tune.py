"""`tritonstack tune`: the command line of tritonstack.experiments.layout_search (see its docstring)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from tritonstack import cli
from tritonstack.contract import DEFAULT_MODEL
from tritonstack.experiments import layout_search, tune_output
from tritonstack.measure.load_loops import weighted_images
from tritonstack.rules.unbuilt import unservable_reason
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.layout import read_cores
from tritonstack.serve.server_config import ServerConfig


@dataclasses.dataclass(frozen=True)
class TuneOptions(cli.RepositoryOption):
    """The repository is the one tuned."""

    model: str = cli.option(DEFAULT_MODEL, "--model", help="the ensemble whose steps are sized")
    out: Path = cli.out_option(cli.REQUIRED, help="the new repository folder (must not exist)")
    report: Path = cli.option(Path("reports/tune"), "--report", type=Path, help="tune.json, tune.md, pareto.png")
    settings: layout_search.TuneSettings = cli.nested(
        layout_search.TuneSettings, default_factory=layout_search.TuneSettings
    )


def parser() -> argparse.ArgumentParser:
    made = cli.parser(layout_search.__doc__)
    cli.add_options(made, TuneOptions)
    return made


def run(args: argparse.Namespace) -> int:
    options = cli.from_args(TuneOptions, args)
    settings = options.settings
    _check_paths(options.model_repository, options.out)
    cores = read_cores()
    model, report = options.model, options.report
    print(f"tuning {model} on {cores.describe()}, objective {settings.objective}, budget {settings.budget_s:g} s")
    with TritonServer(ServerConfig(options.model_repository)) as server:
        start, results = layout_search.search(server, model, weighted_images(200), cores.usable, settings, print)
    chosen = layout_search.best(results, settings)
    report.mkdir(parents=True, exist_ok=True)
    tune_output.save(report, results, chosen, tune_output.report(start, results, chosen, settings, cores.usable))
    unmet = layout_search.unmet_bound(results, settings)
    if unmet:  # the report says what each candidate reached; no folder claims what none did
        print(f"report: {options.report / 'tune.md'}, {options.report / 'pareto.png'}")
        print(f"error: {unmet}", file=sys.stderr)
        return 1
    tune_output.write_repository(options.model_repository, options.out, options.model, chosen.layout)
    print(f"chosen: {chosen.layout.describe()} ({chosen.images_per_s:.1f} images/s)")
    print(f"wrote {options.out}; tritonstack build {' '.join(chosen.layout.build_flags())}")
    print(f"report: {options.report / 'tune.md'}, {options.report / 'pareto.png'}")
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
