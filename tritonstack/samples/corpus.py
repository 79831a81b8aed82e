"""A weighted corpus of real encoded photos of several sizes, for load tests.

scikit-image's bundled photos (tritonstack.samples.photos), re-encoded with Pillow as JPEG
at a few sizes and qualities: small phone thumbnails are common, large uploads rare,
as in real traffic. Decode cost grows with pixels, so the mix matters as much as the
rate. Built in memory, deterministic, no download.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from functools import lru_cache

from PIL import Image

from tritonstack.samples.photos import PHOTOS, photo_path


@dataclass(frozen=True)
class Variant:
    longer_side: int  # pixels
    quality: int  # JPEG quality
    weight: float  # share of the traffic, before normalization


# (longer side, JPEG quality, weight): mostly small and medium images.
VARIANTS = (
    Variant(320, 75, 0.35),
    Variant(640, 85, 0.45),
    Variant(1280, 90, 0.20),
)


@dataclass(frozen=True)
class EncodedImage:
    name: str  # e.g. "chelsea@640q85.jpg"
    data: bytes
    weight: float


def reencode(image: Image.Image, variant: Variant) -> bytes:
    scale = variant.longer_side / max(image.size)
    size = (round(image.width * scale), round(image.height * scale))
    buffer = io.BytesIO()
    image.resize(size, Image.Resampling.LANCZOS).save(buffer, format="JPEG", quality=variant.quality)
    return buffer.getvalue()


@lru_cache(maxsize=None)
def build_corpus(variants: tuple[Variant, ...] = VARIANTS) -> tuple[EncodedImage, ...]:
    """Every photo at every variant; weights spread evenly over the photos."""
    corpus = []
    for photo in PHOTOS:
        with Image.open(photo_path(photo)) as opened:
            rgb = opened.convert("RGB")
        stem = photo.rsplit(".", 1)[0]
        for variant in variants:
            corpus.append(
                EncodedImage(
                    name=f"{stem}@{variant.longer_side}q{variant.quality}.jpg",
                    data=reencode(rgb, variant),
                    weight=variant.weight / len(PHOTOS),
                )
            )
    return tuple(corpus)


class WeightedSampler:
    """Draws images with their weights; seeded, so two runs send the same mix."""

    def __init__(self, corpus: tuple[EncodedImage, ...], seed: int = 0):
        self._corpus = corpus
        self._weights = [image.weight for image in corpus]
        self._random = random.Random(seed)

    def draw(self) -> EncodedImage:
        return self._random.choices(self._corpus, weights=self._weights)[0]
