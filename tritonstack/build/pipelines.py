"""DALI preprocessing pipelines, as the DALI backend serves them.

The pipeline itself is defined in tritonstack/build/dali_model.py (also the `dali.py`
model file). Tensor names are the contract with Triton: the external source's name
is the model's input name; outputs are matched by position.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import nvidia.dali
from nvidia.dali._utils import dali_trace

from tritonstack.build import dali_model
from tritonstack.build.classifiers import Preprocessing
from tritonstack.build.dali_model import (
    classification_pipeline,
    log_mel_features_pipeline,
    regions_classification_pipeline,
    speech_samples_pipeline,
    video_classification_pipeline,
)
from tritonstack.build.presets import FrameSampling
from tritonstack.contract import PREPROCESS_INPUT, pad_batch
from tritonstack.repository_files import DALI_MODEL_FILENAME, DALI_SCRIPT_FILENAME, DALI_VERSION_FILENAME

DALI_VERSION = nvidia.dali.__version__


def serialize_pipeline(
    preprocessing: Preprocessing,
    max_batch_size: int,
    num_threads: int,
    device: str = "cpu",
    clips: FrameSampling | None = None,
    max_boxes: int | None = None,
) -> bytes:
    """Serialize without building: works on a machine with no GPU, for the GPU
    variant too (device_id is left unset; the DALI backend sets each instance's).

    DALI records each operator's definition site (absolute source path and line)
    in the serialized pipeline. That would make model.dali differ per checkout and
    leak the builder's paths, so tracing is off while the graph is defined; errors
    still name the failing operator.

    With `clips`, the pipeline decodes a video per sample into those frames; with
    `max_boxes`, it cuts up to that many boxes per image (a regions preset).
    """
    common = dict(device=device, batch_size=max_batch_size, num_threads=num_threads, device_id=None)
    if clips is not None:
        return _serialized(video_classification_pipeline, **asdict(preprocessing), **asdict(clips), **common)
    if max_boxes is not None:
        return _serialized(regions_classification_pipeline, **asdict(preprocessing), max_boxes=max_boxes, **common)
    return _serialized(classification_pipeline, **asdict(preprocessing), **common)


def serialize_speech_pipeline(sample_rate: int, max_batch_size: int, num_threads: int, device: str = "cpu") -> bytes:
    """The audio presets' pipeline (dali_model.speech_samples), serialized as above."""
    return _serialized(
        speech_samples_pipeline,
        sample_rate=sample_rate,
        device=device,
        batch_size=max_batch_size,
        num_threads=num_threads,
        device_id=None,
    )


def serialize_log_mel_pipeline(features: dict, max_batch_size: int, num_threads: int, device: str = "cpu") -> bytes:
    """An audio classifier's features (dali_model.log_mel_features), serialized as above."""
    return _serialized(
        log_mel_features_pipeline,
        **features,
        device=device,
        batch_size=max_batch_size,
        num_threads=num_threads,
        device_id=None,
    )


def log_mel_dali_py_files(features: dict, max_batch_size: int, num_threads: int, device: str = "cpu") -> dict:
    """The `dali.py` model format of an audio classifier's features."""
    return _dali_py(
        {"max_batch_size": max_batch_size, "num_threads": num_threads, "device": device, "log_mel": features}
    )


def _serialized(pipeline_function, **arguments) -> bytes:
    dali_trace.set_tracing(enabled=False)
    try:
        return pipeline_function(**arguments).serialize()
    finally:
        dali_trace.set_tracing(enabled=True)


def dali_py_files(
    preprocessing: Preprocessing,
    max_batch_size: int,
    num_threads: int,
    device: str = "cpu",
    clips: FrameSampling | None = None,
    max_boxes: int | None = None,
) -> dict[str, bytes]:
    """The `dali.py` model format: the pipeline's source file and its parameters."""
    parameters = {
        "max_batch_size": max_batch_size,
        "num_threads": num_threads,
        "device": device,
        "preprocessing": asdict(preprocessing),
    }
    if clips is not None:
        parameters["clips"] = asdict(clips)
    if max_boxes is not None:
        parameters["max_boxes"] = max_boxes
    return _dali_py(parameters)


def speech_dali_py_files(sample_rate: int, max_batch_size: int, num_threads: int, device: str = "cpu") -> dict:
    """The `dali.py` model format of the audio presets' pipeline."""
    return _dali_py(
        {
            "max_batch_size": max_batch_size,
            "num_threads": num_threads,
            "device": device,
            "audio": {"sample_rate": sample_rate},
        }
    )


def _dali_py(parameters: dict) -> dict[str, bytes]:
    return {
        "dali.py": open(dali_model.__file__, "rb").read(),
        dali_model.PARAMETERS_FILENAME: (json.dumps(parameters, indent=2) + "\n").encode(),
    }


def model_files(fmt: str, serialize, script) -> tuple[dict[str, bytes], tuple[str, ...]]:
    """A DALI model's files in `fmt` (serialize() for model.dali, script() for dali.py's
    files), and the other format's file names, to remove after an earlier build."""
    if fmt == DALI_SCRIPT_FILENAME:
        return script(), (DALI_MODEL_FILENAME, DALI_VERSION_FILENAME)
    return {DALI_MODEL_FILENAME: serialize(), DALI_VERSION_FILENAME: f"{DALI_VERSION}\n".encode()}, tuple(script())


def run_pipeline(serialized: bytes, encoded: list[bytes]) -> np.ndarray:
    """A serialized pipeline run here, in one batch, on encoded images: the tensors
    the DALI backend would give (for parity checks and INT8 calibration)."""
    from nvidia.dali import Pipeline

    pipeline = Pipeline.deserialize(
        serialized_pipeline=serialized, batch_size=len(encoded), num_threads=2, device_id=None, prefetch_queue_depth=1
    )
    pipeline.build()
    pipeline.feed_input(PREPROCESS_INPUT, list(pad_batch(encoded)))
    (output,) = pipeline.run()
    return np.asarray(output.as_tensor())
