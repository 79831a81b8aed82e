"""Real photos that ship inside scikit-image's wheel: test and demo data with no
download. scikit-image is found, not imported (importing it is slow, and the
photos are plain files)."""

from __future__ import annotations

import functools
import importlib.util
import io
from pathlib import Path

# File name -> ImageNet classes a good classifier puts first.
PHOTOS = {
    "chelsea.png": {"tabby", "tiger cat", "Egyptian cat"},
    "coffee.png": {"espresso"},
    "rocket.jpg": {"missile", "projectile"},
    "astronaut.png": set(),
    "motorcycle_left.png": set(),
}


@functools.cache
def data_dir() -> Path:
    spec = importlib.util.find_spec("skimage")
    if spec is None:
        raise FileNotFoundError("the sample photos come with scikit-image: pip install scikit-image")
    return Path(spec.submodule_search_locations[0]) / "data"


def photo_path(name: str) -> Path:
    return data_dir() / name


def photo_bytes(name: str) -> bytes:
    return photo_path(name).read_bytes()


@functools.cache
def sample_jpeg() -> bytes:
    """A real photo (scikit-image's chelsea) as JPEG: the same bytes on every
    machine with the pinned Pillow, so a committed warmup file does not drift."""
    from PIL import Image

    encoded = io.BytesIO()
    with Image.open(photo_path("chelsea.png")) as photo:
        photo.convert("RGB").save(encoded, format="JPEG", quality=90)
    return encoded.getvalue()
