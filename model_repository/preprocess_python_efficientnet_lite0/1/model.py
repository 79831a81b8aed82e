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

Requests are held to the decode budget of `decode_budget.py` (pixels per image and
per request, read from the headers before decoding), the module our `dali` backend
uses; the build ships a copy beside this file.
"""

import importlib.util
import io
import json
import math
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton, e.g. by the parity check
    pb_utils = None

INPUT_NAME = "DALI_INPUT_0"
OUTPUT_NAME = "DALI_OUTPUT_0"


def _load_beside(name: str):
    """A module the build ships beside this file (served models only: the parity
    check imports preprocess() alone)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def preprocess(
    encoded, resize_shorter, crop, mean, std, layout="NCHW", channel_order="rgb", resize="crop", input_type="fp32"
):
    """Encoded image bytes -> normalized FP32 [3, crop, crop] (or the classifier's layout,
    channel order, resize and input type, as the DALI pipeline does)."""
    with Image.open(io.BytesIO(bytes(encoded))) as image:
        image = ImageOps.exif_transpose(image).convert("RGB")
    if resize == "squash":
        pixels = _resampled(image, (crop, crop), (0, 0, *image.size))
    elif resize == "letterbox":
        pixels = _letterboxed(image, crop, mean)
    else:
        pixels = _center_cropped(image, resize_shorter, crop)
    if channel_order == "bgr":
        pixels = pixels[..., ::-1]
    if input_type == "uint8":
        normalized = pixels.astype(np.uint8)
    else:
        normalized = (pixels - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(normalized.transpose(2, 0, 1) if layout == "NCHW" else normalized)


def _center_cropped(image, resize_shorter, crop):
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
    return _resampled(image, (crop, crop), (left, top, left + crop / scale, top + crop / scale))


def _letterboxed(image, crop, fill):
    """The longer side to `crop`, centered on a crop x crop canvas of `fill`."""
    width, height = image.size
    scale = crop / max(width, height)
    size = (max(round(width * scale), 1), max(round(height * scale), 1))
    canvas = np.empty((crop, crop, 3), np.float64)
    canvas[...] = np.rint(np.asarray(fill))
    left, top = (math.floor((crop - side) / 2) for side in size)
    canvas[top : top + size[1], left : left + size[0]] = _resampled(image, size, (0, 0, width, height))
    return canvas


def _resampled(image, size, box):
    """Each channel resampled in float ("F") and rounded once, as DALI's resize does:
    Pillow's 8-bit resize rounds inside its fixed-point filter, often enough to flip a
    near-tie between two classes (docs/building.md). HWC, 0..255."""
    channels = [channel.convert("F").resize(size, Image.Resampling.BILINEAR, box=box) for channel in image.split()]
    return np.clip(np.rint(np.stack([np.asarray(c) for c in channels], axis=-1)), 0, 255)


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})

        def value(key):
            return parameters[key]["string_value"]

        self._decode_budget = _load_beside("decode_budget")
        self._budget = self._decode_budget.DecodeBudget.from_parameters(parameters)
        if self._budget.problems():
            raise ValueError("decode budget: " + "; ".join(self._budget.problems()))
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
        try:  # Pillow decodes one image at a time: the per-request budget bounds it
            self._budget.request_pixels((row.data for row in rows), INPUT_NAME)
        except self._decode_budget.BudgetError as error:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG))
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
