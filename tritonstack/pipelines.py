"""DALI preprocessing pipelines, as the DALI backend serves them.

The pipeline reads top to bottom as the data flows: encoded bytes in, a normalized
CHW float tensor out. Tensor names are the contract with Triton: the external
source's name is the model's input name; outputs are matched by position.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvidia.dali import fn, pipeline_def, types
from nvidia.dali._utils import dali_trace

INPUT_NAME = "DALI_INPUT_0"
OUTPUT_NAME = "DALI_OUTPUT_0"


@dataclass(frozen=True)
class Preprocessing:
    """The transform a classifier was trained with, in 0..255 RGB pixel units."""

    resize_shorter: int
    crop: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


@pipeline_def
def classification_pipeline(preprocessing: Preprocessing, device: str = "cpu"):
    """decode -> resize shorter side -> center crop -> normalize -> FP32 CHW.

    `device="gpu"` decodes with nvJPEG ("mixed") and runs the rest on the GPU.
    """
    encoded = fn.external_source(name=INPUT_NAME, dtype=types.UINT8, ndim=1)
    images = fn.decoders.image(
        encoded, device="mixed" if device == "gpu" else "cpu", output_type=types.RGB
    )
    images = fn.resize(images, resize_shorter=preprocessing.resize_shorter, antialias=True)
    return fn.crop_mirror_normalize(
        images,
        crop=(preprocessing.crop, preprocessing.crop),
        mean=list(preprocessing.mean),
        std=list(preprocessing.std),
        dtype=types.FLOAT,
        output_layout="CHW",
    )


def serialize_pipeline(preprocessing: Preprocessing, max_batch_size: int, num_threads: int) -> bytes:
    """Serialize without building: works on a machine with no GPU.

    DALI records each operator's definition site (absolute source path and line)
    in the serialized pipeline. That would make model.dali differ per checkout and
    leak the builder's paths, so tracing is off while the graph is defined; errors
    still name the failing operator.
    """
    dali_trace.set_tracing(enabled=False)
    try:
        pipe = classification_pipeline(
            preprocessing, batch_size=max_batch_size, num_threads=num_threads, device_id=None
        )
        return pipe.serialize()
    finally:
        dali_trace.set_tracing(enabled=True)
