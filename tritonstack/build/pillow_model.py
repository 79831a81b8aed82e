"""Triton backend "python" model: the DALI preprocessing done with Pillow and NumPy.

This is what a user writes without DALI, and the A/B partner of the DALI model for
benchmarks and accuracy parity. The build copies this file, unchanged, to
`<model>/1/model.py`; it imports nothing from this project, so it serves in the NGC
container too. Its contract is the DALI model's: input `DALI_INPUT_0` (UINT8 rows of
encoded image bytes, zero-padded), output `DALI_OUTPUT_0` (FP32 CHW), so the same
ensemble and the same client work with either.

The transform is `preprocess()` below, the one the parity check compares with DALI:
decode (EXIF orientation applied, as DALI's decoder does by default) -> RGB ->
resize the shorter side (bilinear, antialiased when shrinking, in float) -> center crop ->
(x - mean) / std -> CHW float32. Its parameters come from the model config's
`parameters`, written by build_pipelines.py.
"""

import io
import json
import math

import numpy as np
from PIL import Image, ImageOps

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton, e.g. by the parity check
    pb_utils = None

INPUT_NAME = "DALI_INPUT_0"
OUTPUT_NAME = "DALI_OUTPUT_0"


def preprocess(encoded, resize_shorter, crop, mean, std):
    """Encoded image bytes -> normalized FP32 [3, crop, crop]."""
    with Image.open(io.BytesIO(bytes(encoded))) as image:
        image = ImageOps.exif_transpose(image).convert("RGB")
    width, height = image.size
    scale = resize_shorter / min(width, height)
    resized = (max(round(width * scale), 1), max(round(height * scale), 1))
    # Like DALI's `subpixel_scale`: both axes keep the exact scale, and the source
    # region is centered and as wide as the rounded output size divided by it.
    region_left = (width - resized[0] / scale) / 2
    region_top = (height - resized[1] / scale) / 2
    # The center crop, anchor halves rounded up as DALI does, mapped back to the
    # source: resizing only that box gives the same pixels, faster.
    left = region_left + math.floor((resized[0] - crop) / 2 + 0.5) / scale
    top = region_top + math.floor((resized[1] - crop) / 2 + 0.5) / scale
    left, top = max(left, 0.0), max(top, 0.0)  # a rounding hair below zero: Pillow refuses it
    box = (left, top, left + crop / scale, top + crop / scale)
    # Each channel resampled in float ("F") and rounded once, as DALI's resize does:
    # Pillow's 8-bit resize rounds inside its fixed-point filter, a level off on
    # ~15% of values, enough to flip a near-tie between two classes.
    channels = [channel.convert("F").resize((crop, crop), Image.Resampling.BILINEAR, box=box)
                for channel in image.split()]
    pixels = np.clip(np.rint(np.stack([np.asarray(c) for c in channels], axis=-1)), 0, 255)
    normalized = (pixels - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(normalized.transpose(2, 0, 1))


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})

        def value(key):
            return parameters[key]["string_value"]

        self._transform = {
            "resize_shorter": int(value("resize_shorter")),
            "crop": int(value("crop")),
            "mean": [float(v) for v in value("mean").split(",")],
            "std": [float(v) for v in value("std").split(",")],
        }

    def execute(self, requests):
        return [self._execute_one(request) for request in requests]

    def _execute_one(self, request):
        rows = pb_utils.get_input_tensor_by_name(request, INPUT_NAME).as_numpy()
        images = []
        for index, row in enumerate(rows):
            try:
                images.append(preprocess(row, **self._transform))
            except Image.UnidentifiedImageError:
                return _error(f"image {index} of the request is not in an image format Pillow can decode")
            except Exception as error:  # Pillow raises many types for damaged images
                return _error(f"cannot preprocess image {index} of the request: {type(error).__name__}: {error}")
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(OUTPUT_NAME, np.stack(images))])


def _error(message):
    # UNKNOWN, as the DALI model answers bad images: HTTP 400, gRPC UNKNOWN.
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.UNKNOWN))
