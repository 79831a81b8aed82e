"""What `tritonstack tune` writes once it has chosen (tritonstack.experiments.layout_search searches):
the winner as a new repository folder, and the report: `tune.json` (every candidate's
figures, every measurement, the winner and its `tritonstack build` flags), `tune.md`
(the table) and `pareto.png` (images/s against p99, the Pareto front marked)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from tritonstack.build.presets import BuildOptions
from tritonstack.experiments.layout_search import Layout, Measured, TuneSettings, pareto_front, summarized
from tritonstack.pacing import CPU_SLOTS, step_slots


def report(start: Layout, results: list[Measured], chosen: Measured, settings: TuneSettings, cores: int) -> dict:
    """`results`: every measurement; the candidates are their medians by layout."""
    candidates = summarized(results)
    front = pareto_front(candidates)
    return {
        "settings": dataclasses.asdict(settings),
        "cores": cores,
        "start": dataclasses.asdict(start),
        "chosen": chosen.figures(),
        "build_flags": " ".join(chosen.layout.build_flags()),
        "candidates": [result.figures() | {"pareto": result in front} for result in candidates],
        "measurements": [result.figures() for result in results],
    }


def markdown(results: list[Measured], chosen: Measured) -> str:
    rows = [
        "| layout | images/s | p99 ms | CPU ms/image | p99 ms at rate | its upper 95 % bound | measured |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in sorted(results, key=lambda result: -result.images_per_s):
        mark = " (chosen)" if result.layout == chosen.layout else ""
        cpu = f"{result.cpu_ms_per_image:.1f}" if result.cpu_ms_per_image else ""
        rate = f"{result.rate_p99_ms:.0f} | {result.rate_p99_bound_ms:.0f}" if result.rate_p99_ms is not None else " | "
        rows.append(
            f"| {result.layout.describe()}{mark} | {result.images_per_s:.1f} | {result.p99_ms:.0f} | {cpu} | {rate} "
            f"| {result.measurements} |"
        )
    return "\n".join(rows) + f"\n\n`tritonstack build {' '.join(chosen.layout.build_flags())}`\n"


def plot(results: list[Measured], chosen: Measured, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    front = sorted(pareto_front(results), key=lambda result: result.latency_ms)
    figure, axes = plt.subplots(figsize=(7, 4.5))
    axes.scatter([r.latency_ms for r in results], [r.images_per_s for r in results], color="0.6", label="candidates")
    front_xy = ([r.latency_ms for r in front], [r.images_per_s for r in front])
    axes.plot(*front_xy, "o-", color="tab:blue", label="Pareto front")
    axes.scatter([chosen.latency_ms], [chosen.images_per_s], s=120, facecolors="none", edgecolors="red", label="chosen")
    axes.set_xlabel("p99 latency, ms" + (" (open loop at --rate)" if chosen.rate_p99_ms is not None else ""))
    axes.set_ylabel("images/s")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_repository(source: Path, out: Path, model: str, layout: Layout) -> None:
    """A copy of `source` with the ensemble's two steps written under `layout`."""
    from tritonstack.build.model_config import write_config
    from tritonstack.repository_files import read_config

    shutil.copytree(source, out, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    dali, classifier = _step_names(read_config(out / model))
    options = BuildOptions(
        max_batch_size=read_config(out / classifier).max_batch_size, classifier_batch=layout.classifier_batch
    )
    for name, instances, parameter, threads, batches in (
        (dali, layout.dali_instances, "num_threads", layout.dali_threads, options.first_step_preferred_batches),
        (
            classifier,
            layout.classifier_instances,
            "intra_op_thread_count",
            layout.classifier_threads,
            options.classifier_preferred_batches,
        ),
    ):
        config = read_config(out / name)
        config.instance_group[0].count = instances
        config.parameters[parameter].string_value = str(threads)
        for resource in config.instance_group[0].rate_limiter.resources:
            if resource.name == CPU_SLOTS:  # a classifier's instances hold a core a thread
                resource.count = step_slots(first_step=name == dali, threads=threads)
        del config.dynamic_batching.preferred_batch_size[:]
        config.dynamic_batching.preferred_batch_size.extend(batches)
        write_config(out / name, config)


def _step_names(ensemble) -> tuple[str, str]:
    """(DALI step, classifier step) of an ensemble config, in order."""
    first, second = (step.model_name for step in ensemble.ensemble_scheduling.step)
    return first, second


def save(out: Path, results: list[Measured], chosen: Measured, summary: dict) -> None:
    """`results`: every measurement; the table and the plot show their medians by layout."""
    candidates = summarized(results)
    (out / "tune.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "tune.md").write_text(markdown(candidates, chosen))
    plot(candidates, chosen, out / "pareto.png")
