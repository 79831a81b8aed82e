"""Real photos that ship inside scikit-image's wheel: test and demo data with no
download. scikit-image is found, not imported (importing it is slow, and the
photos are plain files)."""

from __future__ import annotations

import functools
import importlib.util
import io
import random
from dataclasses import dataclass
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


# A real photo (scikit-image's chelsea, re-encoded by Pillow as JPEG, quality 90) shipped
# with the package: `tritonstack check` runs each DALI pipeline on it and the build
# writes it as the models' warmup sample, on an installed package without scikit-image.
SAMPLE_JPEG = Path(__file__).parent / "data" / "sample.jpg"


@functools.cache
def sample_jpeg() -> bytes:
    return SAMPLE_JPEG.read_bytes()


# A real clip: 2.5 s (30 frames, 12 fps, 240x240) panning over chelsea, VP9 in MP4 (what
# DALI's CPU decoder reads), made once with tests/clips.py. The video preset's warmup
# sample and `make demo`'s clip; classified as chelsea is (PHOTOS).
SAMPLE_CLIP = Path(__file__).parent / "data" / "sample_clip.mp4"
SAMPLE_CLIP_LABELS = PHOTOS["chelsea.png"]


@functools.cache
def sample_clip() -> bytes:
    return SAMPLE_CLIP.read_bytes()


# Labelled inputs for load that checks its answers (the soak, the memory probe):
# each photo with the classes it may get, and inputs every decoder refuses.
@dataclass(frozen=True)
class Sample:
    name: str
    data: bytes
    labels: frozenset[str] = frozenset()  # any of these first; empty: a bad input

    @property
    def valid(self) -> bool:
        return bool(self.labels)


def good_samples() -> list[Sample]:
    return [Sample(name, photo_bytes(name), frozenset(labels)) for name, labels in PHOTOS.items() if labels]


def bad_samples(seed: int = 0) -> list[Sample]:
    jpeg = photo_bytes("rocket.jpg")
    return [
        Sample("random-bytes", random.Random(seed).randbytes(20_000)),
        Sample("text", b"this is not an image\n" * 100),
        Sample("truncated-jpeg", jpeg[: len(jpeg) // 3]),
    ]


# Three labelled photos side by side: one image and a box per panel around its subject,
# as a detector would draw it, for the regions presets (the demo, the tests). Each box's
# subject is its photo's (PHOTOS). Subjects as shares of the photo: x0, y0, x1, y1.
COLLAGE_PHOTOS = ("chelsea.png", "coffee.png", "rocket.jpg")
SUBJECTS = {
    "chelsea.png": (0.0, 0.0, 0.9, 1.0),  # the cat's head
    "coffee.png": (0.1, 0.0, 0.8, 1.0),  # the cup on its saucer
    "rocket.jpg": (0.4, 0.25, 0.62, 0.98),  # the rocket, between its towers
}


@dataclass(frozen=True)
class Collage:
    jpeg: bytes
    boxes: list[tuple[float, float, float, float]]  # x0, y0, x1, y1 of each panel's subject
    photos: tuple[str, ...]


@functools.cache
def collage(photos: tuple[str, ...] = COLLAGE_PHOTOS, height: int = 300) -> Collage:
    """The photos scaled to `height`, pasted left to right, encoded as JPEG (quality 90)."""
    from PIL import Image

    panels = []
    for name in photos:
        with Image.open(photo_path(name)) as photo:
            panels.append(photo.convert("RGB").resize((round(photo.width * height / photo.height), height)))
    canvas = Image.new("RGB", (sum(panel.width for panel in panels), height))
    boxes, left = [], 0
    for name, panel in zip(photos, panels):
        canvas.paste(panel, (left, 0))
        x0, y0, x1, y1 = SUBJECTS[name]
        boxes.append((left + x0 * panel.width, y0 * height, left + x1 * panel.width, y1 * height))
        left += panel.width
    encoded = io.BytesIO()
    canvas.save(encoded, "JPEG", quality=90)
    return Collage(encoded.getvalue(), boxes, photos)
