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
