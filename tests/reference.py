"""An independent preprocessing reference for the tests: plain Pillow + NumPy,
written here and not imported from tritonstack, so loosening the project's code
cannot loosen a test. Resize the shorter side (Pillow's antialiased bilinear),
center crop, (pixel - mean) / std per RGB channel, CHW FP32."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps


def preprocess(encoded: bytes, resize_shorter: int, crop: int, mean, std) -> np.ndarray:
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(encoded))).convert("RGB")
    scale = resize_shorter / min(image.size)
    size = (max(round(image.width * scale), 1), max(round(image.height * scale), 1))
    resized = np.asarray(image.resize(size, Image.Resampling.BILINEAR), np.float32)
    top, left = (resized.shape[0] - crop + 1) // 2, (resized.shape[1] - crop + 1) // 2
    cropped = resized[top : top + crop, left : left + crop]
    normalized = (cropped - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return normalized.transpose(2, 0, 1)


def levels(normalized: np.ndarray, std) -> np.ndarray:
    """Normalized CHW values back to 0..255 pixel levels (differences in levels)."""
    return normalized * np.asarray(std, np.float32)[:, None, None]


def read_labels(path) -> list[str]:
    return [line.strip() for line in open(path, encoding="utf-8") if line.strip()]


def letterbox(encoded: bytes, box, crop: int, mean, std) -> np.ndarray:
    """A regions model's transform of one box: the box (x0, y0, x1, y1, in the pixels
    after EXIF orientation) resized, aspect kept, so its longer side is `crop`, centered
    on a crop x crop canvas of the mean (zero once normalized), CHW FP32. The source
    window keeps the exact scale around the box's center (as DALI's subpixel scaling
    does); each channel is resampled in float and rounded once."""
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(encoded))).convert("RGB")
    x0, y0, x1, y1 = (float(value) for value in box)
    scale = crop / max(x1 - x0, y1 - y0)
    size = (max(round((x1 - x0) * scale), 1), max(round((y1 - y0) * scale), 1))
    center = ((x0 + x1) / 2, (y0 + y1) / 2)
    window = tuple(
        center[axis % 2] + sign * size[axis % 2] / scale / 2 for sign, axis in ((-1, 0), (-1, 1), (1, 2), (1, 3))
    )
    # The window may reach a rounding hair outside the image, where DALI repeats the
    # border pixels: so does the reference, on an image padded by its edges.
    margin = 8
    padded = np.pad(np.asarray(image, np.float32), ((margin, margin), (margin, margin), (0, 0)), mode="edge")
    window = tuple(value + margin for value in window)
    channels = [
        Image.fromarray(np.ascontiguousarray(padded[..., c]), "F").resize(size, Image.Resampling.BILINEAR, box=window)
        for c in range(3)
    ]
    pixels = np.clip(np.rint(np.stack([np.asarray(c) for c in channels], axis=-1)), 0, 255)
    canvas = np.empty((crop, crop, 3), np.float32)
    canvas[:] = np.asarray(mean, np.float32).astype(np.uint8)
    left, top = -((size[0] - crop) // 2), -((size[1] - crop) // 2)  # DALI's crop anchor rounds down
    canvas[top : top + size[1], left : left + size[0]] = pixels
    normalized = (canvas - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return normalized.transpose(2, 0, 1)
