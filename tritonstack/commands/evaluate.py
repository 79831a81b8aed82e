"""Measure a served classifier on an ImageFolder-style labelled set.

    tritonstack evaluate my_labelled_photos/ --url grpc://127.0.0.1:8001 --batch-size 8

DIR holds one folder per class, named by its ImageNet label ("tiger cat", or
"tiger_cat") or its index ("282"); each holds that class's images (searched
recursively). Prints top-1 and top-5 accuracy, the worst classes with what they
were taken for, and images/s. Images the server could not classify are counted
apart, not as wrong answers. Exit codes: 0 all classified, 1 some failed, 2 nothing
could run (no server, wrong port or protocol, unknown model, a folder that names
no class, bad options).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.utils import InferenceServerException

from tritonstack import cli
from tritonstack.client.classifier import ClassifierClient
from tritonstack.client.images import image_files
from tritonstack.client.options import ServerOptions
from tritonstack.client.preflight import check_model
from tritonstack.client.retry import RetryPolicy
from tritonstack.client.runner import FileResult, Progress, RunSettings, classify_files

TOP_K = 5


@dataclass
class ClassScore:
    name: str
    images: int = 0
    top1: int = 0
    top5: int = 0
    failed: int = 0
    taken_for: Counter = field(default_factory=Counter)  # wrong top-1 labels

    def add(self, result: FileResult, targets: set[int]) -> None:
        if result.error is not None:
            self.failed += 1
            return
        self.images += 1
        ranked = [p.index for p in result.top]
        self.top1 += ranked[0] in targets
        self.top5 += bool(targets.intersection(ranked[:TOP_K]))
        if ranked[0] not in targets:
            self.taken_for[result.top[0].label] += 1

    def as_dict(self) -> dict:
        return {
            "class": self.name,
            "images": self.images,
            "failed": self.failed,
            "top1": _ratio(self.top1, self.images),
            "top5": _ratio(self.top5, self.images),
            "taken_for": dict(self.taken_for.most_common(3)),
        }


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _normalized(name: str) -> str:
    return name.replace("_", " ").strip().lower()


def class_targets(folders: list[Path], labels: list[str]) -> dict[str, set[int]]:
    """Folder name -> the class indices it names (ImageNet repeats a few labels)."""
    by_label: dict[str, set[int]] = defaultdict(set)
    for index, label in enumerate(labels):
        by_label[_normalized(label)].add(index)
    targets = {}
    for folder in folders:
        if folder.name.isdigit() and int(folder.name) < len(labels):
            targets[folder.name] = {int(folder.name)}
        elif _normalized(folder.name) in by_label:
            targets[folder.name] = by_label[_normalized(folder.name)]
        else:
            raise cli.UsageError(f"folder {folder.name!r} is neither a label of the model nor a class index")
    return targets


def model_labels(client: ClassifierClient, paths: list[Path]) -> list[str]:
    """From the first image the server can classify."""
    for path in paths:
        try:
            return client.labels(path.read_bytes())
        except (OSError, InferenceServerException):
            continue
    raise cli.UsageError("no image the server can classify, so no labels to match the folders with")


def labelled_files(root: Path) -> list[tuple[Path, str]]:
    return [
        (path, folder.name)
        for folder in sorted((p for p in root.iterdir() if p.is_dir()), key=cli.natural_key)
        for path in image_files([folder])
    ]


def report(scores: dict[str, ClassScore], progress: Progress, worst: int) -> dict:
    classified = sum(s.images for s in scores.values())
    ranked = sorted(scores.values(), key=lambda s: (_ratio(s.top1, s.images), -s.images, s.name))
    return {
        "images": classified + progress.failed,
        "classes": len(scores),
        "failed": progress.failed,
        "top1": _ratio(sum(s.top1 for s in scores.values()), classified),
        "top5": _ratio(sum(s.top5 for s in scores.values()), classified),
        "images_per_s": round(progress.rate, 2),
        "worst": [score.as_dict() for score in ranked[:worst]],
    }


def print_text(summary: dict, root: Path) -> None:
    print(f"{root}: {summary['images']} images in {summary['classes']} classes, {summary['failed']} failed")
    print(f"top-1 accuracy  {summary['top1']:7.1%}")
    print(f"top-5 accuracy  {summary['top5']:7.1%}")
    print(f"images/s        {summary['images_per_s']:7.1f}")
    print("worst classes (top-1):")
    for score in summary["worst"]:
        taken = ", ".join(f"{label} x{count}" for label, count in score["taken_for"].items()) or "-"
        print(
            f"  {score['class']:<24} {score['images']:4d} images  top-1 {score['top1']:6.1%}"
            f"  top-5 {score['top5']:6.1%}  taken for: {taken}"
        )


@dataclass(frozen=True)
class EvaluateOptions(ServerOptions):
    """The labelled set, and RunSettings' options as evaluate takes them (its own
    defaults: a labelled set is read in batches)."""

    root: Path = cli.option(None, "root", type=Path, metavar="DIR", help="one folder per class")
    model: str = cli.mirror(RunSettings, "model", help="a model that takes encoded images (an ensemble)")
    batch_size: int = cli.mirror(RunSettings, "batch_size", 8)
    concurrency: int = cli.mirror(RunSettings, "concurrency", 2)
    shm: str = cli.mirror(RunSettings, "shm")
    use_async: bool = cli.mirror(RunSettings, "use_async")
    timeout_s: float | None = cli.mirror(RunSettings, "timeout_s")
    retry: RetryPolicy = cli.nested(RetryPolicy, default_factory=RetryPolicy)
    worst: int = cli.option(5, "--worst", type=cli.positive_int, help="how many of the worst classes to show")
    format: str = cli.option("text", "--format", choices=("text", "json"))


def parser() -> argparse.ArgumentParser:
    parser = cli.parser(__doc__)
    cli.add_options(parser, EvaluateOptions)
    return parser


def run(args: argparse.Namespace) -> int:
    options = cli.from_args(EvaluateOptions, args)
    settings = cli.from_args(RunSettings, args, top_k=TOP_K, **options.run_fields())
    if not options.root.is_dir():
        raise cli.UsageError(f"{options.root}: no such folder")
    files = labelled_files(options.root)
    if not files:
        raise cli.UsageError(f"no class folders with images in {options.root}")
    check_model(settings.url, settings.protocol, settings.model, settings.headers, settings.retry)
    scores, progress = score(options.root, files, settings)
    summary = report(scores, progress, options.worst)
    if options.format == "json":
        print(json.dumps(summary, indent=2))
    else:
        print_text(summary, options.root)
    return 1 if progress.failed else 0


def score(root: Path, files: list[tuple[Path, str]], settings: RunSettings) -> tuple[dict[str, ClassScore], Progress]:
    """Each class's score, the folders matched to the model's labels."""
    with ClassifierClient(
        settings.url,
        settings.protocol,
        settings.model,
        timeout_s=settings.timeout_s,
        retry=settings.retry,
        headers=settings.headers,
        batch=True,
    ) as client:
        labels = model_labels(client, [path for path, _ in files])
    try:
        targets = class_targets(sorted({root / name for _, name in files}), labels)
    except cli.UsageError as error:
        raise cli.UsageError(f"{root}: {error}") from None
    scores = {name: ClassScore(name) for name in targets}
    progress = Progress(len(files))
    for result, (_, name) in zip(classify_files([path for path, _ in files], settings), files):
        scores[name].add(result, targets[name])
        progress.update(result)
    progress.close()
    return scores, progress


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
