"""Bring your own audio classifier: an ONNX tagger that scores log-mel patches, served
as an ensemble that takes an encoded clip and ranks its labels.

    client ──INPUT (encoded clip, [1, bytes])──▶ ensemble_audio_<name>
        ├─ preprocess_audio_<name>   (dali: decode, resample, log-mel; build/audio_features.py)
        │     DALI_OUTPUT_0 [1, frames, mel_bins]
        └─ <name>                    (onnxruntime: patches, your graph, softmax, mean;
                                      build/audio_classifier_graph.py)
    ◀── OUTPUT [1, C] (the clip's probabilities, labels.txt: Triton's classification
        extension ranks them), PATCH_PROBABILITIES [1, P, C] when asked

    tritonstack build --audio-classifier-onnx tagger.onnx --labels labels.csv --out /tmp/audio
    tritonstack parity /tmp/audio --preset audio_tagger     # DALI's features vs NumPy's

The graph tells its patch size, mel bins, layout and class count; the features'
parameters are options (audio_features.LogMelFeatures, YAMNet's by default) and are
recorded in the features model's config, where `parity` reads them back.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from tritonstack import cli
from tritonstack.build import pipelines
from tritonstack.build.audio import clip_ensemble_config, decoding_config, write_decoding_step
from tritonstack.build.audio_classifier_graph import (
    CLIP_OUTPUT,
    FEATURES_INPUT,
    PATCHES_OUTPUT,
    AudioClassifierGraph,
    read_audio_classifier,
    servable_audio_classifier,
)
from tritonstack.build.audio_features import FEATURES, LogMelFeatures, reference_log_mel
from tritonstack.build.labels import read_labels
from tritonstack.build.model_config import EnsembleStep, ModelConfig, Tensor, Warmup, WarmupInput
from tritonstack.build.model_files import VERSION, write_if_changed, write_model_folder
from tritonstack.build.presets import BuildOptions
from tritonstack.build.scheduling import step_batching, step_instances
from tritonstack.contract import (
    AUDIO_PREPROCESSOR,
    ENSEMBLE_OUTPUT,
    ENSEMBLE_PATCH_PROBABILITIES,
    PREPROCESS_INPUT,
    PREPROCESS_OUTPUT,
    ensemble_name,
    preprocessing_name,
)
from tritonstack.repository_files import (
    DALI_MODEL_FILENAME,
    LABELS_FILENAME,
    ONNX_MODEL_FILENAME,
)
from tritonstack.samples.speech import FORMATS, sample_speech, tone_wav

# Where the features model's config records its parameters (our extension, as max_boxes).
LOG_MEL_PARAMETER = "log_mel"
WARMUP_CLIP = "sample_tone.wav"
# DALI's features against NumPy's: float32 FFT rounding (about 2e-6 on a bin) is
# magnified by the log where a bin is near silence (docs/audio.md).
PARITY_RTOL = PARITY_ATOL = 1e-3


@dataclass(frozen=True)
class AudioClassifierOptions:
    onnx: Path | None = cli.option(
        None,
        "--audio-classifier-onnx",
        type=Path,
        metavar="FILE",
        group=FEATURES,
        help="an ONNX classifier of log-mel patches ([N, frames, mels], [N, 1, frames, mels] or [N, frames, mels, "
        "1]); --labels, --name and --softmax apply to it too",
    )
    patch_hop: int | None = cli.option(
        None,
        "--patch-hop",
        type=cli.positive_int,
        metavar="FRAMES",
        group=FEATURES,
        help="frames between patches (default: half a patch, as YAMNet's 0.96 s patches 0.48 s apart)",
    )


@dataclass(frozen=True)
class AudioClassifierPreset:
    name: str
    onnx_file: Path
    labels: tuple[str, ...]
    graph: AudioClassifierGraph
    features: LogMelFeatures
    patch_hop: int
    softmax: bool

    @property
    def ensemble_name(self) -> str:
        return ensemble_name(f"{AUDIO_PREPROCESSOR}_{self.name}")

    @property
    def preprocessing_name(self) -> str:
        return preprocessing_name(f"{AUDIO_PREPROCESSOR}_{self.name}")

    def served_onnx(self) -> bytes:
        silence = math.log(self.features.log_offset)
        return servable_audio_classifier(
            self.onnx_file, self.graph, len(self.labels), self.patch_hop, silence, self.softmax
        )


def own_audio_classifier(
    options: AudioClassifierOptions, features: LogMelFeatures, labels_file: Path, name: str | None, softmax: str
) -> tuple[AudioClassifierPreset, list[str]]:
    """The preset, its softmax decided on the sample speech, and what was read, a line each."""
    graph = read_audio_classifier(options.onnx)
    labels = read_labels(labels_file)
    if graph.classes and graph.classes != len(labels):
        raise ValueError(f"{labels_file} has {len(labels)} names but the graph has {graph.classes} classes")
    if graph.mel_bins != features.mel_bins:
        raise ValueError(f"the graph takes {graph.mel_bins} mel bins: give --mel-bins {graph.mel_bins}")
    preset = AudioClassifierPreset(
        name=name or options.onnx.stem,
        onnx_file=options.onnx.resolve(),
        labels=tuple(labels),
        graph=graph,
        features=features,
        patch_hop=options.patch_hop or max(graph.patch_frames // 2, 1),
        softmax=softmax == "yes",
    )
    notes = [
        f"input {graph.input_name!r}: patches of {graph.patch_frames} frames x {graph.mel_bins} mel bins "
        f"({graph.layout}), {preset.patch_hop} frames apart; {len(labels)} labels"
    ]
    if softmax == "auto":
        sums = _patch_probabilities(preset).sum(axis=-1)
        logits = not np.allclose(sums, 1, atol=1e-3)
        preset = replace(preset, softmax=logits)
        notes.append(
            "its patch scores do not sum to 1 on speech: a softmax head added"
            if logits
            else "its patch scores sum to 1 on speech: served as they are"
        )
    return preset, notes


def _patch_probabilities(preset: AudioClassifierPreset) -> np.ndarray:
    import onnxruntime as ort

    features = _dali_features(preset.features, [sample_speech("flac")])[0]
    session = ort.InferenceSession(preset.served_onnx(), providers=["CPUExecutionProvider"])
    return session.run([PATCHES_OUTPUT], {FEATURES_INPUT: features[None]})[0][0]


def _dali_features(features: LogMelFeatures, clips: list[bytes]) -> list[np.ndarray]:
    return _run(pipelines.serialize_log_mel_pipeline(asdict(features), len(clips), 1), clips)


def _run(serialized: bytes, clips: list[bytes]) -> list[np.ndarray]:
    from nvidia.dali import Pipeline

    pipeline = Pipeline.deserialize(
        serialized_pipeline=serialized, batch_size=len(clips), num_threads=1, device_id=None
    )
    pipeline.build()
    pipeline.feed_input(PREPROCESS_INPUT, [np.frombuffer(clip, np.uint8) for clip in clips])
    (output,) = pipeline.run()
    return [np.asarray(output[index]) for index in range(len(clips))]


# --- the models -------------------------------------------------------------------------


def classifier_config(preset: AudioClassifierPreset, options: BuildOptions) -> ModelConfig:
    classes, graph = len(preset.labels), preset.graph
    return ModelConfig(
        name=preset.name,
        backend="onnxruntime",
        max_batch_size=1,  # a clip's patches are the graph's batch
        inputs=(Tensor(FEATURES_INPUT, "FP32", (-1, graph.mel_bins)),),
        outputs=(
            Tensor(CLIP_OUTPUT, "FP32", (classes,), label_filename=LABELS_FILENAME),
            Tensor(PATCHES_OUTPUT, "FP32", (-1, classes)),
        ),
        dynamic_batching=step_batching(options),
        instance_groups=(
            step_instances(options.classifier_instance_count, options.instance_kind, threads=options.intra_op_threads),
        ),
        parameters={"intra_op_thread_count": str(options.intra_op_threads)},
        warmup=(
            Warmup(
                name="zeros",
                batch_size=1,
                inputs=(WarmupInput(FEATURES_INPUT, "FP32", (graph.patch_frames, graph.mel_bins), zero_data=True),),
            ),
        ),
    )


def ensemble_config(preset: AudioClassifierPreset, options: BuildOptions) -> ModelConfig:
    classes, features = len(preset.labels), "log_mel_features"
    outputs = (
        Tensor(ENSEMBLE_OUTPUT, "FP32", (classes,), label_filename=LABELS_FILENAME),
        Tensor(ENSEMBLE_PATCH_PROBABILITIES, "FP32", (-1, classes)),
    )
    classify = EnsembleStep(
        model_name=preset.name,
        input_map={FEATURES_INPUT: features},
        output_map={CLIP_OUTPUT: ENSEMBLE_OUTPUT, PATCHES_OUTPUT: ENSEMBLE_PATCH_PROBABILITIES},
    )
    return clip_ensemble_config(
        preset.ensemble_name, preset.preprocessing_name, features, outputs, (classify,), options
    )


def write_audio_classifier(repository: Path, preset: AudioClassifierPreset, options: BuildOptions) -> list[Path]:
    """Every model of the preset; the files that changed."""
    clip, features = tone_wav(1.0, preset.features.sample_rate), asdict(preset.features)
    arguments = (features, options.max_batch_size, options.num_threads, options.device)
    decoding = decoding_config(
        preset.preprocessing_name,
        options,
        Tensor(PREPROCESS_OUTPUT, "FP32", (-1, preset.features.mel_bins)),
        {LOG_MEL_PARAMETER: json.dumps(features, sort_keys=True)},
        len(clip),
    )
    changed = write_decoding_step(
        repository,
        decoding,
        options,
        lambda: pipelines.serialize_log_mel_pipeline(*arguments),
        lambda: pipelines.log_mel_dali_py_files(*arguments),
        clip,
    )
    changed += write_model_folder(
        repository, classifier_config(preset, options), {ONNX_MODEL_FILENAME: preset.served_onnx()}
    )
    changed += write_model_folder(repository, ensemble_config(preset, options), {})
    labels = ("\n".join(preset.labels) + "\n").encode()
    for model in (preset.name, preset.ensemble_name):
        changed += write_if_changed(Path(repository) / model / LABELS_FILENAME, labels)
    return changed


# --- parity -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FeaturesParity:
    model: str
    clips: dict[str, float]  # encoding -> largest |DALI - NumPy| of a log-mel value
    within_tolerance: bool  # every value within PARITY_ATOL + PARITY_RTOL * |NumPy's|

    def format(self) -> str:
        lines = [f"{self.model}: log-mel features, DALI against the NumPy reference (build/audio_features.py)"]
        lines += [f"  {name:<16} max |difference| {difference:.6f}" for name, difference in self.clips.items()]
        verdict = "within" if self.within_tolerance else "NOT within"
        lines.append(f"  {verdict} {PARITY_ATOL:g} + {PARITY_RTOL:g} x |value| everywhere")
        return "\n".join(lines)


def features_parity(repository: Path, preset_name: str) -> FeaturesParity:
    """The served features model's pipeline on the sample speech in every encoding,
    against reference_log_mel on the same decoded samples."""
    model = preprocessing_name(preset_name)
    from tritonstack.repository_files import config_dict, read_config

    parameters = config_dict(read_config(Path(repository) / model)).get("parameters", {})
    if LOG_MEL_PARAMETER not in parameters:
        raise ValueError(f"{model} records no {LOG_MEL_PARAMETER} parameters: not an audio classifier's features")
    features = LogMelFeatures(**json.loads(parameters[LOG_MEL_PARAMETER]["string_value"]))
    serialized = (Path(repository) / model / VERSION / DALI_MODEL_FILENAME).read_bytes()
    clips = {name: sample_speech(name) for name in FORMATS}
    served = _run(serialized, list(clips.values()))
    samples = _run(pipelines.serialize_speech_pipeline(features.sample_rate, len(clips), 1), list(clips.values()))
    differences, within = {}, True
    for name, dali, decoded in zip(clips, served, samples):
        reference = reference_log_mel(decoded, features)
        differences[name] = float(np.abs(dali - reference).max())
        within = within and np.allclose(dali, reference, rtol=PARITY_RTOL, atol=PARITY_ATOL)
    return FeaturesParity(model, differences, bool(within))
