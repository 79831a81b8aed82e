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
from dataclasses import asdict
from pathlib import Path

from tritonstack import cli, contract
from tritonstack.build import presets
from tritonstack.build.audio import AUDIO_PRESETS, SpeechPreset
from tritonstack.build.audio_classifier import (
    AudioClassifierOptions,
    features_parity,
    own_audio_classifier,
    write_audio_classifier,
)
from tritonstack.build.audio_features import LogMelFeatures
from tritonstack.build.own_classifier import OwnClassifierOptions, own_classifier
from tritonstack.build.presets import PRESETS, BuildOptions, Preset, preset_named
from tritonstack.build.repository import write_repository

# The folder the command runs in, as for `make build` from a checkout.
DEFAULT_REPOSITORY = Path("model_repository")


def build(args: argparse.Namespace) -> int:
    own = cli.from_args(OwnClassifierOptions, args)
    own_audio = cli.from_args(AudioClassifierOptions, args)
    if own.onnx and own_audio.onnx:
        raise cli.OptionError("--classifier-onnx and --audio-classifier-onnx: one classifier a build")
    if bool(own.onnx or own_audio.onnx) != bool(own.labels):
        raise cli.OptionError("--classifier-onnx (or --audio-classifier-onnx) and --labels go together")
    options = cli.from_args(BuildOptions, args)
    if own_audio.onnx:
        changed = _build_audio_classifier(args, own, own_audio, options)
    else:
        images, audio = _presets(args, own)
        changed = write_repository(args.out, presets=images, options=options, audio_presets=audio)
    for path in changed:
        print(f"wrote {path.relative_to(args.out)}")
    print(f"{args.out}: {len(changed)} file(s) changed")
    return 0


def _build_audio_classifier(
    args: argparse.Namespace, own: OwnClassifierOptions, own_audio: AudioClassifierOptions, options: BuildOptions
) -> list[Path]:
    features = cli.from_args(LogMelFeatures, args)
    preset, notes = own_audio_classifier(own_audio, features, own.labels, own.name, own.softmax)
    for note in notes:
        print(f"{preset.name}: {note}")
    return write_audio_classifier(args.out, preset, options)


def _presets(
    args: argparse.Namespace, own: OwnClassifierOptions
) -> tuple[tuple[Preset, ...], tuple[SpeechPreset, ...]]:
    """The image presets and the audio presets to build: all of both when none is named."""
    if own.onnx:
        classifier, notes = own_classifier(own)
        for note in notes:
            print(f"{classifier.name}: {note}")
        return tuple(Preset(classifier, preprocessor) for preprocessor in args.preprocessors), ()
    if not args.presets:
        return PRESETS, AUDIO_PRESETS
    audio = {preset.name: preset for preset in AUDIO_PRESETS}
    return (
        tuple(preset_named(name) for name in args.presets if name not in audio),
        tuple(audio[name] for name in args.presets if name in audio),
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

    _built_repository(args.repository)
    problems = check_repository(args.repository)
    for problem in problems:
        print(f"error: {problem}")
    print(f"{args.repository}: {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


def parity(args: argparse.Namespace) -> int:
    from tritonstack.build.parity import compare, format_report

    _existing_repository(args.repository)
    if args.preset.startswith(f"{contract.AUDIO_PREPROCESSOR}_"):
        features = features_parity(args.repository, args.preset)
        print(features.format())
        if args.json:
            args.json.write_text(json.dumps(asdict(features), indent=2) + "\n")
        return 0 if features.within_tolerance else 1
    own = cli.from_args(OwnClassifierOptions, args)
    classifier = None
    if own.onnx:  # a user's classifier: the options it was built with describe its preprocessing
        if not own.labels:
            raise cli.OptionError("--classifier-onnx and --labels go together")
        classifier, _ = own_classifier(own)
    report = compare(args.repository, args.preset, classifier=classifier)
    print(format_report(report))
    if args.json:
        args.json.write_text(report.to_json())
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


def _add_build_parser(commands) -> None:
    parser = cli.subcommand(
        commands,
        "build",
        help="write the model repository",
        description="Write the presets' models (all when none is named) into --out.",
    )
    parser.add_argument(
        "presets",
        nargs="*",
        metavar="PRESET",
        help=f"presets to build (default: all): {', '.join(p.name for p in (*PRESETS, *AUDIO_PRESETS))}",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_REPOSITORY, help="repository folder")
    cli.add_options(parser, BuildOptions)
    _add_own_classifier_options(parser)
    parser.set_defaults(run=build)


def _add_own_classifier_options(parser: argparse.ArgumentParser) -> None:
    cli.add_options(parser, OwnClassifierOptions)
    cli.add_options(parser, AudioClassifierOptions)
    cli.add_options(parser, LogMelFeatures)
    parser.add_argument(
        "--preprocessors",
        nargs="+",
        choices=presets.PREPROCESSORS,
        default=("dali",),
        help="which preprocessing models to build for your own classifier",
    )


def parser() -> argparse.ArgumentParser:
    made = cli.parser(__doc__)
    commands = made.add_subparsers(dest="command", required=True)
    _add_build_parser(commands)
    cli.subcommand(commands, "list", help="list the presets").set_defaults(run=list_presets)
    check_parser = cli.subcommand(
        commands,
        "check",
        help="validate a repository offline, as the backends will at load time",
        description="One line per problem (model: field 'tensor': what is wrong; what to do). "
        "Exit 1 when there is any, 0 when the repository is clean.",
    )
    check_parser.add_argument("repository", nargs="?", type=Path, default=DEFAULT_REPOSITORY)
    check_parser.set_defaults(run=check)
    parity_parser = cli.subcommand(
        commands,
        "parity",
        help="compare DALI and Pillow preprocessing on real photos",
        description="Tensor differences and classifier top-1/top-5 agreement, DALI vs the Pillow baseline, "
        "on scikit-image's photos and generated variants. Exit 1 unless top-1 agrees on all.",
    )
    parity_parser.add_argument("repository", nargs="?", type=Path, default=DEFAULT_REPOSITORY)
    parity_parser.add_argument(
        "--preset",
        default="dali_efficientnet_lite0",
        help="the DALI preset to compare; audio_<name>: an audio classifier's log-mel features against NumPy's",
    )
    parity_parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures as JSON")
    cli.add_options(parity_parser, OwnClassifierOptions)
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
