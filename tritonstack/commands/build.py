"""Build, list and check Triton model repositories of DALI-preprocessed classifiers.

Each preset is an ensemble `ensemble_<preprocessor>_<classifier>`: a preprocessing
model (DALI, or the Pillow baseline; "video": DALI decoding clips) chained to an
ONNX classifier; `ensemble_audio_silero_vad` answers a clip's speech segments.

    tritonstack list                       # the presets
    tritonstack build                      # all presets into ./model_repository
    tritonstack build dali_efficientnet_lite2 --out /tmp/repo
    tritonstack build --device gpu --instances 2 --out /tmp/gpu-repo
    tritonstack build --classifier-onnx my.onnx --labels labels.txt --out /tmp/mine
    tritonstack build --classifier-onnx mobilenet.onnx --labels labels.txt --scale -1,1 --out /tmp/mine
    tritonstack check [REPOSITORY]          # offline load-time validation
    tritonstack parity                     # DALI vs Pillow on real photos
    tritonstack build --audio-classifier-onnx tagger.onnx --labels labels.csv --out /tmp/audio
    tritonstack parity /tmp/audio --preset audio_tagger   # DALI's log-mel vs NumPy's
    tritonstack parity /tmp/mine --classifier-onnx m.onnx --labels l.txt --scale=-1,1   # a user's, as built

Only files whose content changes are rewritten; the ONNX export is skipped while
its inputs (weights, export code, torch version) are unchanged.
Exit codes: 0 success, 1 problems found (check, parity), 2 bad usage (unknown
preset, missing file or folder, bad option). --debug shows an error's traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from tritonstack import cli, contract
from tritonstack.build.audio import AUDIO_PRESETS, SpeechPreset
from tritonstack.build.audio_classifier import (
    AudioClassifierOptions,
    features_parity,
    own_audio_classifier,
    write_audio_classifier,
)
from tritonstack.build.audio_features import LogMelFeatures
from tritonstack.build.own_classifier import OwnClassifierOptions, own_classifier
from tritonstack.build.presets import PREPROCESSORS, PRESETS, BuildOptions, Preset, preset_named
from tritonstack.build.repository import write_repository


@dataclass(frozen=True)
class BuildCommandOptions:
    """`tritonstack build`: which presets, where, built how; or a user's own classifier
    (image or audio), with the preprocessing models to build for it."""

    presets: tuple[str, ...] = cli.option(
        (),
        "presets",
        nargs="*",
        metavar="PRESET",
        convert=tuple,
        command_default=None,
        help=f"presets to build (default: all): {', '.join(p.name for p in (*PRESETS, *AUDIO_PRESETS))}",
    )
    out: Path = cli.out_option(cli.DEFAULT_REPOSITORY, help="repository folder")
    build: BuildOptions = cli.nested(BuildOptions, default_factory=BuildOptions)
    own: OwnClassifierOptions = cli.nested(OwnClassifierOptions, default_factory=OwnClassifierOptions)
    own_audio: AudioClassifierOptions = cli.nested(AudioClassifierOptions, default_factory=AudioClassifierOptions)
    features: LogMelFeatures = cli.nested(LogMelFeatures, default_factory=LogMelFeatures)
    preprocessors: tuple[str, ...] = cli.option(
        ("dali",),
        "--preprocessors",
        nargs="+",
        choices=PREPROCESSORS,
        convert=tuple,
        help="which preprocessing models to build for your own classifier",
    )


@dataclass(frozen=True)
class RepositoryArgument:
    """The repository `check` and `parity` read: the positional argument, not an option."""

    repository: Path = cli.option(cli.DEFAULT_REPOSITORY, "repository", nargs="?", type=Path)


@dataclass(frozen=True)
class ParityOptions(RepositoryArgument):
    preset: str = cli.option(
        "dali_efficientnet_lite0",
        "--preset",
        help="the DALI preset to compare; audio_<name>: an audio classifier's log-mel features against NumPy's",
    )
    json: Path | None = cli.option(None, "--json", type=Path, metavar="FILE", help="also write the figures as JSON")
    own: OwnClassifierOptions = cli.nested(OwnClassifierOptions, default_factory=OwnClassifierOptions)


def build(args: argparse.Namespace) -> int:
    options = cli.from_args(BuildCommandOptions, args)
    own, own_audio = options.own, options.own_audio
    if own.onnx and own_audio.onnx:
        raise cli.OptionError("--classifier-onnx and --audio-classifier-onnx: one classifier a build")
    if bool(own.onnx or own_audio.onnx) != bool(own.labels):
        raise cli.OptionError("--classifier-onnx (or --audio-classifier-onnx) and --labels go together")
    if own_audio.onnx:
        changed = _build_audio_classifier(options)
    else:
        images, audio = _presets(options)
        changed = write_repository(options.out, presets=images, options=options.build, audio_presets=audio)
    for path in changed:
        print(f"wrote {path.relative_to(options.out)}")
    print(f"{options.out}: {len(changed)} file(s) changed")
    return 0


def _build_audio_classifier(options: BuildCommandOptions) -> list[Path]:
    own = options.own
    preset, notes = own_audio_classifier(options.own_audio, options.features, own.labels, own.name, own.softmax)
    for note in notes:
        print(f"{preset.name}: {note}")
    return write_audio_classifier(options.out, preset, options.build)


def _presets(options: BuildCommandOptions) -> tuple[tuple[Preset, ...], tuple[SpeechPreset, ...]]:
    """The image presets and the audio presets to build: all of both when none is named."""
    if options.own.onnx:
        classifier, notes = own_classifier(options.own)
        for note in notes:
            print(f"{classifier.name}: {note}")
        return tuple(Preset(classifier, preprocessor) for preprocessor in options.preprocessors), ()
    if not options.presets:
        return PRESETS, AUDIO_PRESETS
    audio = {preset.name: preset for preset in AUDIO_PRESETS}
    return (
        tuple(preset_named(name) for name in options.presets if name not in audio),
        tuple(audio[name] for name in options.presets if name in audio),
    )


def list_presets(args: argparse.Namespace) -> int:
    print(f"{'preset':28} {'ensemble':36} {'preprocessing':38} classifier (crop, resize shorter)")
    for preset in PRESETS:
        p = preset.classifier.preprocessing
        print(
            f"{preset.name:28} {preset.ensemble_name:36} {preset.preprocessing_name:38} "
            f"{preset.classifier.name} ({p.crop}, {p.resize_shorter})"
        )
    for preset in AUDIO_PRESETS:
        print(f"{preset.name:28} {preset.ensemble_name:36} {preset.preprocessing_name:38} {preset.vad_name} (speech)")
    return 0


def check(args: argparse.Namespace) -> int:
    from tritonstack.build.check import check_repository

    repository = cli.from_args(RepositoryArgument, args).repository
    _built_repository(repository)
    problems = check_repository(repository)
    for problem in problems:
        print(f"error: {problem}")
    print(f"{repository}: {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


def parity(args: argparse.Namespace) -> int:
    from tritonstack.build.parity import compare, format_report

    options = cli.from_args(ParityOptions, args)
    _existing_repository(options.repository)
    if options.preset.startswith(f"{contract.AUDIO_PREPROCESSOR}_"):
        features = features_parity(options.repository, options.preset)
        print(features.format())
        if options.json:
            options.json.write_text(json.dumps(asdict(features), indent=2) + "\n")
        return 0 if features.within_tolerance else 1
    own = options.own
    classifier = None
    if own.onnx:  # a user's classifier: the options it was built with describe its preprocessing
        if not own.labels:
            raise cli.OptionError("--classifier-onnx and --labels go together")
        classifier, _ = own_classifier(own)
    report = compare(options.repository, options.preset, classifier=classifier)
    print(format_report(report))
    if options.json:
        options.json.write_text(report.to_json())
    return 0 if report.top1_agreement == 1.0 else 1


def _existing_repository(path: Path) -> None:
    if not path.is_dir():
        raise cli.UsageError(f"{path}: no such folder (build one with `make build`)")


def _built_repository(path: Path) -> None:
    """Exit 2, as the launcher: a fresh clone has nothing to check yet."""
    from tritonstack.rules.unbuilt import unservable_reason

    reason = unservable_reason(path)
    if reason:
        raise cli.UsageError(reason)


def parser() -> argparse.ArgumentParser:
    made = cli.parser(__doc__)
    commands = made.add_subparsers(dest="command", required=True)
    build_parser = cli.subcommand(
        commands,
        "build",
        help="write the model repository",
        description="Write the presets' models (all when none is named) into --out.",
    )
    cli.add_options(build_parser, BuildCommandOptions)
    build_parser.set_defaults(run=build)
    cli.subcommand(commands, "list", help="list the presets").set_defaults(run=list_presets)
    check_parser = cli.subcommand(
        commands,
        "check",
        help="validate a repository offline, as the backends will at load time",
        description="One line per problem (model: field 'tensor': what is wrong; what to do). "
        "Exit 1 when there is any, 0 when the repository is clean.",
    )
    cli.add_options(check_parser, RepositoryArgument)
    check_parser.set_defaults(run=check)
    parity_parser = cli.subcommand(
        commands,
        "parity",
        help="compare DALI and Pillow preprocessing on real photos",
        description="Tensor differences and classifier top-1/top-5 agreement, DALI vs the Pillow baseline, "
        "on scikit-image's photos and generated variants. Exit 1 unless top-1 agrees on all.",
    )
    cli.add_options(parity_parser, ParityOptions)
    parity_parser.set_defaults(run=parity)
    return made


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        return args.run(args)
    except (ValueError, KeyError) as error:  # an unknown preset, a file that is not what it should be
        raise cli.UsageError(error.args[0] if error.args else str(error)) from error


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
