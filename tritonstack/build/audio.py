"""The audio presets: an ensemble that takes an encoded clip and answers its speech
segments.

    client ──INPUT (encoded clip, [1, bytes])──▶ ensemble_audio_silero_vad
        ├─ preprocess_audio_silero_vad   (dali: decode, downmix, resample to 16 kHz)
        │     DALI_OUTPUT_0 [1, T] FP32
        ├─ silero_vad                    (onnxruntime: framing + Silero VAD, build/vad_graph.py)
        │     frame_probabilities [1, n], sample_count [1, 1]
        └─ segments_silero_vad           (python: get_speech_timestamps, build/segments_model.py)
    ◀── SEGMENTS [1, k, 3] (start_s, end_s, probability), FRAME_PROBABILITIES [1, n]

One clip per request (max_batch_size 1: clips differ in length, and Triton's tensors are
rectangular); the DALI step decodes the clips of concurrent requests in one batch. The
VAD model takes one clip a run: its LSTM's state runs along the clip's frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tritonstack.build import pipelines, segments_model, vad_graph
from tritonstack.build.model_config import EnsembleStep, InstanceGroup, ModelConfig, Tensor, Warmup, WarmupInput
from tritonstack.build.model_files import VERSION, write_if_changed, write_model_folder
from tritonstack.build.presets import BuildOptions
from tritonstack.build.scheduling import ensemble_parameters, step_batching, step_instances
from tritonstack.build.segments_model import SegmentSettings
from tritonstack.contract import (
    AUDIO_PREPROCESSOR,
    ENSEMBLE_FRAME_PROBABILITIES,
    ENSEMBLE_INPUT,
    ENSEMBLE_SEGMENTS,
    MAX_AUDIO_SECONDS_PARAMETER,
    PREPROCESS_INPUT,
    PREPROCESS_OUTPUT,
    SEGMENT_WIDTH,
    ensemble_name,
    preprocessing_name,
)
from tritonstack.repository_files import (
    ONNX_MODEL_FILENAME,
    PYTHON_MODEL_FILENAME,
    WARMUP_DIR,
)
from tritonstack.samples.speech import tone_wav

WARMUP_CLIP = "sample_tone.wav"
WARMUP_SECONDS = 1.0


@dataclass(frozen=True)
class SpeechPreset:
    """Speech segments from Silero VAD (silero-vad's 16 kHz sequence model)."""

    name: str = f"{AUDIO_PREPROCESSOR}_silero_vad"
    vad_name: str = "silero_vad"
    segments_name: str = "segments_silero_vad"

    @property
    def ensemble_name(self) -> str:
        return ensemble_name(self.name)

    @property
    def preprocessing_name(self) -> str:
        return preprocessing_name(self.name)

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.preprocessing_name, self.vad_name, self.segments_name, self.ensemble_name)


SILERO_VAD = SpeechPreset()
AUDIO_PRESETS = (SILERO_VAD,)


def segment_settings(options: BuildOptions) -> SegmentSettings:
    return SegmentSettings(
        threshold=options.vad_threshold,
        min_speech_duration_ms=options.min_speech_ms,
        max_speech_duration_s=options.max_speech_s or math.inf,
        min_silence_duration_ms=options.min_silence_ms,
        speech_pad_ms=options.speech_pad_ms,
    )


def decoding_config(
    name: str, options: BuildOptions, output: Tensor, parameters: dict[str, str], clip_bytes: int
) -> ModelConfig:
    """An audio preset's DALI step: a clip per sample in, `output` out."""
    return ModelConfig(
        name=name,
        backend="dali",
        max_batch_size=options.max_batch_size,
        inputs=(Tensor(PREPROCESS_INPUT, "UINT8", (-1,), allow_ragged_batch=True),),
        outputs=(output,),
        dynamic_batching=step_batching(options, first_step=True),
        instance_groups=(step_instances(options.instances, options.instance_kind, first_step=True),),
        # max_audio_seconds: our dali backend's, read from each clip's header (the C++ backend ignores it).
        parameters={
            "num_threads": str(options.num_threads),
            MAX_AUDIO_SECONDS_PARAMETER: str(options.max_audio_seconds),
            **parameters,
        },
        warmup=(
            Warmup(
                name="sample_tone",
                batch_size=1,
                inputs=(WarmupInput(PREPROCESS_INPUT, "UINT8", (clip_bytes,), data_file=WARMUP_CLIP),),
            ),
        ),
    )


def write_decoding_step(repository: Path, config: ModelConfig, options: BuildOptions, serialize, script, clip: bytes):
    """The DALI step's folder: its warmup clip, its pipeline in the build's format
    (pipelines.model_files), its config; the files that changed."""
    model_dir = Path(repository) / config.name
    changed = write_if_changed(model_dir / WARMUP_DIR / WARMUP_CLIP, clip)
    files, stale = pipelines.model_files(options.format, serialize, script)
    for name in stale:  # the other format's files, from an earlier build
        (model_dir / VERSION / name).unlink(missing_ok=True)
    return changed + write_model_folder(repository, config, files)


def vad_config(preset: SpeechPreset, options: BuildOptions) -> ModelConfig:
    return ModelConfig(
        name=preset.vad_name,
        backend="onnxruntime",
        max_batch_size=1,
        inputs=(Tensor(vad_graph.SAMPLES_INPUT, "FP32", (-1,)),),
        outputs=(
            Tensor(vad_graph.PROBABILITIES_OUTPUT, "FP32", (-1,)),
            Tensor(vad_graph.SAMPLE_COUNT_OUTPUT, "INT64", (1,)),
        ),
        dynamic_batching=step_batching(options),
        instance_groups=(
            step_instances(options.classifier_instance_count, options.instance_kind, threads=options.intra_op_threads),
        ),
        parameters={"intra_op_thread_count": str(options.intra_op_threads)},
        warmup=(
            Warmup(
                name="silence",
                batch_size=1,
                inputs=(WarmupInput(vad_graph.SAMPLES_INPUT, "FP32", (vad_graph.SAMPLE_RATE,), zero_data=True),),
            ),
        ),
    )


def segments_config(preset: SpeechPreset, options: BuildOptions) -> ModelConfig:
    # A few microseconds a clip, on the CPU whatever the device of the rest; as many
    # instances as a preprocessing step (the launcher's layout sizes both python steps alike).
    return ModelConfig(
        name=preset.segments_name,
        backend="python",
        max_batch_size=1,
        inputs=(
            Tensor(segments_model.PROBABILITIES_INPUT, "FP32", (-1,)),
            Tensor(segments_model.SAMPLE_COUNT_INPUT, "INT64", (1,)),
        ),
        outputs=(Tensor(segments_model.SEGMENTS_OUTPUT, "FP32", (-1, SEGMENT_WIDTH)),),
        instance_groups=(InstanceGroup(count=options.instances, kind="KIND_CPU"),),
        parameters=segment_settings(options).parameters(),
    )


def clip_ensemble_config(
    name: str, decoding: str, decoded: str, outputs: tuple[Tensor, ...], steps: tuple[EnsembleStep, ...], options
) -> ModelConfig:
    """An audio preset's ensemble: one encoded clip a request into the DALI step
    `decoding`, whose output the later `steps` take as `decoded`."""
    return ModelConfig(
        name=name,
        platform="ensemble",
        max_batch_size=1,
        inputs=(Tensor(ENSEMBLE_INPUT, "UINT8", (-1,)),),
        outputs=outputs,
        parameters=ensemble_parameters(options),
        steps=(
            EnsembleStep(
                model_name=decoding,
                input_map={PREPROCESS_INPUT: ENSEMBLE_INPUT},
                output_map={PREPROCESS_OUTPUT: decoded},
            ),
            *steps,
        ),
    )


def ensemble_config(preset: SpeechPreset, options: BuildOptions) -> ModelConfig:
    samples, count = "samples", "sample_count"
    outputs = (
        Tensor(ENSEMBLE_SEGMENTS, "FP32", (-1, SEGMENT_WIDTH)),
        Tensor(ENSEMBLE_FRAME_PROBABILITIES, "FP32", (-1,)),
    )
    steps = (
        EnsembleStep(
            model_name=preset.vad_name,
            input_map={vad_graph.SAMPLES_INPUT: samples},
            output_map={
                vad_graph.PROBABILITIES_OUTPUT: ENSEMBLE_FRAME_PROBABILITIES,
                vad_graph.SAMPLE_COUNT_OUTPUT: count,
            },
        ),
        EnsembleStep(
            model_name=preset.segments_name,
            input_map={
                segments_model.PROBABILITIES_INPUT: ENSEMBLE_FRAME_PROBABILITIES,
                segments_model.SAMPLE_COUNT_INPUT: count,
            },
            output_map={segments_model.SEGMENTS_OUTPUT: ENSEMBLE_SEGMENTS},
        ),
    )
    return clip_ensemble_config(preset.ensemble_name, preset.preprocessing_name, samples, outputs, steps, options)


def write_speech_preset(repository: Path, preset: SpeechPreset, options: BuildOptions) -> list[Path]:
    """Every model of the preset; the files that changed."""
    clip = tone_wav(WARMUP_SECONDS, vad_graph.SAMPLE_RATE)
    arguments = (vad_graph.SAMPLE_RATE, options.max_batch_size, options.num_threads, options.device)
    decoding = decoding_config(
        preset.preprocessing_name, options, Tensor(PREPROCESS_OUTPUT, "FP32", (-1,)), {}, len(clip)
    )
    changed = write_decoding_step(
        repository,
        decoding,
        options,
        lambda: pipelines.serialize_speech_pipeline(*arguments),
        lambda: pipelines.speech_dali_py_files(*arguments),
        clip,
    )
    models = (
        (vad_config(preset, options), {ONNX_MODEL_FILENAME: vad_graph.served_vad_onnx()}),
        (segments_config(preset, options), {PYTHON_MODEL_FILENAME: Path(segments_model.__file__).read_bytes()}),
        (ensemble_config(preset, options), {}),
    )
    for config, files in models:
        changed += write_model_folder(repository, config, files)
    return changed
