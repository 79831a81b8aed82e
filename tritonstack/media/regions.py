"""What a regions model accepts as an image's boxes, in one place: our dali backend
refuses a request by these rules before its pipeline runs, and the clients say the
same words before sending.

A box is x0, y0, x1, y1 in the pixels of the image as the decoder returns it: after its
EXIF orientation (DALI's image decoder applies it by default, so a portrait photo taken
sideways is H x W there, not as its header says). Imports NumPy and Pillow only (Pillow
reads the header and the EXIF tag; nothing is decoded).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from tritonstack.contract import BOX_WIDTH

# EXIF orientations that turn the image a quarter: width and height swap (TIFF tag 274).
_TRANSPOSED = {5, 6, 7, 8}
_ORIENTATION_TAG = 0x0112


class BoxError(ValueError):
    """An image's boxes a regions model refuses; the message names the box and the image size."""


def oriented_size(encoded) -> tuple[int, int] | None:
    """(width, height) of the decoded image, EXIF orientation applied; None when Pillow
    does not know the format (the decoder then gives its own error)."""
    try:
        with Image.open(io.BytesIO(encoded)) as header:
            width, height = header.size
            orientation = header.getexif().get(_ORIENTATION_TAG, 1)
    except (UnidentifiedImageError, OSError, ValueError):
        return None
    return (height, width) if orientation in _TRANSPOSED else (width, height)


def check_boxes(boxes: np.ndarray, size: tuple[int, int] | None, max_boxes: int | None, image: int = 0) -> None:
    """Raise BoxError unless `boxes` is [N, 4] with 1 <= N <= max_boxes (None: no bound
    known here), every value finite, x0 < x1 and y0 < y1, inside the image of `size`
    (width, height; None: not known here, only the shape and order are checked).
    `image`: the sample's index in its request, named in the message."""
    where = f"image {image}" + (f" ({size[0]}x{size[1]} after EXIF orientation)" if size else "")
    if boxes.ndim != 2 or boxes.shape[1] != BOX_WIDTH:
        raise BoxError(f"{where}: boxes must be [N, 4] (x0, y0, x1, y1), got shape {list(boxes.shape)}")
    if len(boxes) == 0:
        raise BoxError(
            f"{where}: no boxes. Triton cannot hand a batch of zero crops to the classifier: send at least "
            "one box (tritonstack's clients answer an image without boxes with an empty list, sending nothing)"
        )
    if max_boxes is not None and len(boxes) > max_boxes:
        raise BoxError(f"{where}: {len(boxes)} boxes, above this model's max_boxes {max_boxes}")
    for index, box in enumerate(boxes):
        problem = _box_problem(box, size)
        if problem:
            shown = ", ".join(f"{value:g}" for value in box)
            raise BoxError(f"{where}: box {index} [{shown}] {problem}")


def _box_problem(box: np.ndarray, size: tuple[int, int] | None) -> str | None:
    x0, y0, x1, y1 = (float(value) for value in box)
    if not np.isfinite(box).all():
        return "is not finite (NaN or infinity)"
    if x1 <= x0 or y1 <= y0:
        return "is empty: need x0 < x1 and y0 < y1"
    if size and (x0 < 0 or y0 < 0 or x1 > size[0] or y1 > size[1]):
        return f"reaches outside the image: need 0 <= x0 < x1 <= {size[0]} and 0 <= y0 < y1 <= {size[1]}"
    return None


def random_boxes(size: tuple[int, int], count: int, rng, min_side: int = 32) -> list[tuple[float, float, float, float]]:
    """`count` boxes inside an image of `size` (width, height), each side at least
    `min_side` pixels (or the image's side) and at most the image's: detector-like load."""
    width, height = size
    boxes = []
    for _ in range(count):
        box_width = rng.uniform(min(min_side, width), width)
        box_height = rng.uniform(min(min_side, height), height)
        x0, y0 = rng.uniform(0, width - box_width), rng.uniform(0, height - box_height)
        boxes.append((x0, y0, x0 + box_width, y0 + box_height))
    return boxes
