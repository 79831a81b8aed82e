"""Real photos that ship inside scikit-image's wheel: test and demo data with no
download."""

from __future__ import annotations

from pathlib import Path

import skimage

DATA_DIR = Path(skimage.__file__).resolve().parent / "data"

# File name -> ImageNet classes a good classifier puts first.
PHOTOS = {
    "chelsea.png": {"tabby", "tiger cat", "Egyptian cat"},
    "coffee.png": {"espresso"},
    "rocket.jpg": {"missile", "projectile"},
    "astronaut.png": set(),
    "motorcycle_left.png": set(),
}


def photo_path(name: str) -> Path:
    return DATA_DIR / name


def photo_bytes(name: str) -> bytes:
    return photo_path(name).read_bytes()
