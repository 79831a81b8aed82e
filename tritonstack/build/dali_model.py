"""The DALI classification pipeline, and the `dali.py` model file the DALI backend
serializes at load time (`build_pipelines.py build --format dali.py`).

This file is the one definition of the pipeline: tritonstack.pipelines serializes it
to `model.dali`, and the build copies it unchanged to `<model>/1/dali.py` with its
parameters in `preprocessing.json` next to it. It imports only DALI, so it loads in
the NGC container's DALI backend too, which imports the file and serializes the
function marked `@autoserialize`.
"""

import json
from pathlib import Path

from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.plugin.triton import autoserialize

INPUT_NAME = "DALI_INPUT_0"
OUTPUT_NAME = "DALI_OUTPUT_0"
PARAMETERS_FILENAME = "preprocessing.json"
# Share of JPEG decoding given to the GPU's hardware decoder (A100/H100), the
# rest to CUDA: NVIDIA's recommended starting point.
HW_DECODER_LOAD = 0.65


def classification(resize_shorter, crop, mean, std, device="cpu"):
    """decode -> resize shorter side -> center crop -> normalize -> FP32 CHW.

    `device="gpu"` decodes with nvJPEG ("mixed": hardware decoder where there is
    one), and resize and normalize then run on the GPU since their input is there.
    """
    encoded = fn.external_source(name=INPUT_NAME, dtype=types.UINT8, ndim=1)
    if device == "gpu":
        images = fn.decoders.image(encoded, device="mixed", output_type=types.RGB, hw_decoder_load=HW_DECODER_LOAD)
    else:
        images = fn.decoders.image(encoded, device="cpu", output_type=types.RGB)
    return _resize_crop_normalize(images, resize_shorter, crop, mean, std, "CHW")


def _resize_crop_normalize(images, resize_shorter, crop, mean, std, layout):
    """Resize the shorter side, center-crop, normalize to FP32 in `layout` (frames too: FCHW)."""
    images = fn.resize(images, resize_shorter=resize_shorter, antialias=True)
    return fn.crop_mirror_normalize(
        images, crop=(crop, crop), mean=list(mean), std=list(std), dtype=types.FLOAT, output_layout=layout
    )


classification_pipeline = pipeline_def(classification)


def video_classification(resize_shorter, crop, mean, std, frames, stride, device="cpu"):
    """decode a clip -> `frames` frames, `stride` apart (the last one repeated when
    the clip is shorter) -> the image transform on each -> FP32 FCHW. Served with
    `split_along_outer_axis` on its output, each frame leaves as one sample for the
    classifier. DALI's CPU decoder reads VP8, VP9 and MJPEG; `device="gpu"` decodes
    with NVDEC (H.264, H.265, AV1 too)."""
    encoded = fn.external_source(name=INPUT_NAME, dtype=types.UINT8, ndim=1)
    sequence = fn.decoders.video(
        encoded, device="mixed" if device == "gpu" else "cpu", sequence_length=frames, stride=stride, pad_mode="edge"
    )
    return _resize_crop_normalize(sequence, resize_shorter, crop, mean, std, "FCHW")


video_classification_pipeline = pipeline_def(video_classification, output_dtype=types.FLOAT, output_ndim=4)

_PARAMETERS_FILE = Path(__file__).with_name(PARAMETERS_FILENAME)
if _PARAMETERS_FILE.exists():  # only as a model's dali.py, never as tritonstack's module
    _parameters = json.loads(_PARAMETERS_FILE.read_text())

    @autoserialize
    @pipeline_def(
        batch_size=_parameters["max_batch_size"],
        num_threads=_parameters["num_threads"],
        device_id=None if _parameters["device"] == "cpu" else 0,
    )
    def preprocessing_pipeline():
        if "clips" in _parameters:  # a video preset's: {"frames": ..., "stride": ...}
            return video_classification(
                **_parameters["preprocessing"], **_parameters["clips"], device=_parameters["device"]
            )
        return classification(**_parameters["preprocessing"], device=_parameters["device"])
