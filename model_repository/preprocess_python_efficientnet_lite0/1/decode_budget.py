"""How many pixels a request, and a merged batch, may make an image decoder allocate.

An encoded image is small and its decoded pixels are not, and a per-image limit is
not enough: a request, or a batch the dynamic batcher merged, of several such images
multiplies it (docs/decisions.md#the-decode-budget-has-three-levels). So the budget
has three levels, all read from the images' headers before anything is decoded
(Pillow's open reads the header only):

- `max_pixels`: one image;
- `max_request_pixels`: all images of one request; above it the request is refused
  with a client error naming the numbers;
- `max_batch_pixels`: one decoder run; a merged batch above it is run in parts
  (`plan_parts`), so that no run holds more decoded pixels than this.

And `release_above_pixels`: after a run above it, the backend returns the decoder's
buffers to the system, so one burst of large images does not stay as the stub's
high-water mark (the Pillow model; the dali backend only with DALI's host pool off,
DALI_MALLOC_POOL_THRESHOLD=0: with it on, DALI keeps the largest run's buffers for
reuse, which `max_batch_pixels` bounds; docs/memory.md).

Each is a model config parameter (`parameters { key: "max_batch_pixels" value {
string_value: "..." } }`); absent ones default from the instance's memory share:
the stub's memory ceiling from the launcher ($TRITONSTACK_STUB_MEMORY_BYTES), else a
quarter of the machine's memory. Shared by our `dali` backend, the Pillow model (the
build ships a copy next to its model.py) and `build_pipelines.py check`; imports
only the standard library and Pillow.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

# The name of the copy the build ships beside the Pillow model's model.py.
MODULE_FILENAME = "decode_budget.py"
# The memory ceiling the launcher gives each backend stub, in bytes.
STUB_MEMORY_ENV = "TRITONSTACK_STUB_MEMORY_BYTES"
# Peak bytes per declared pixel while DALI's CPU decoder runs: RGB output plus the
# decoder's buffers (docs/decisions.md#the-decode-budget-has-three-levels).
BYTES_PER_PIXEL = 5
# The share of the stub's memory that decoded pixels may take; the rest is the
# interpreter, DALI, the request copies and the outputs.
DECODE_SHARE = 0.5
DEFAULT_MAX_PIXELS = 100_000_000  # one image: a 10000x10000 photo passes
# One decoder run at most, whatever the memory share: two 10000x10000 photos, so that
# on a large machine a burst of huge images does not run many at a time (docs/memory.md).
# Ordinary photos (up to ~12 MP) still fill a batch of 16 in one run.
MAX_RUN_PIXELS = 2 * DEFAULT_MAX_PIXELS
PARAMETERS = ("max_pixels", "max_request_pixels", "max_batch_pixels", "release_above_pixels")

# Pillow's own bomb check would raise before we read the size; our budget applies.
Image.MAX_IMAGE_PIXELS = None


class BudgetError(ValueError):
    """A request declares more pixels than the model decodes for one request."""


def memory_share_bytes() -> int:
    """The memory one backend stub may use: its ceiling from the launcher, else a
    quarter of the machine's physical memory."""
    ceiling = os.environ.get(STUB_MEMORY_ENV)
    if ceiling:
        return int(ceiling)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


@dataclass(frozen=True)
class DecodeBudget:
    max_pixels: int
    max_request_pixels: int
    max_batch_pixels: int
    release_above_pixels: int

    @classmethod
    def from_memory(cls, share_bytes: int) -> "DecodeBudget":
        batch = min(int(share_bytes * DECODE_SHARE) // BYTES_PER_PIXEL, MAX_RUN_PIXELS)
        return cls(
            max_pixels=min(DEFAULT_MAX_PIXELS, batch),
            max_request_pixels=batch,
            max_batch_pixels=batch,
            release_above_pixels=batch // 4,
        )

    @classmethod
    def from_parameters(cls, parameters: dict, share_bytes: int | None = None) -> "DecodeBudget":
        """From a model config's `parameters` ({key: {"string_value": ...}});
        absent keys from the memory share."""
        default = cls.from_memory(share_bytes if share_bytes is not None else memory_share_bytes())
        values = {key: int_parameter(parameters, key) for key in PARAMETERS}
        return cls(**{key: value if value is not None else getattr(default, key) for key, value in values.items()})

    def problems(self) -> list[str]:
        """What makes this budget refuse every request, or nothing."""
        problems = [f"{key} is {getattr(self, key)}: must be positive" for key in PARAMETERS if getattr(self, key) <= 0]
        if self.max_request_pixels > self.max_batch_pixels:
            problems.append(
                f"max_request_pixels {self.max_request_pixels} is above max_batch_pixels "
                f"{self.max_batch_pixels}: a request that passes could not be decoded in one run"
            )
        return problems

    def request_pixels(self, images: Iterable, input_name: str) -> int:
        """The pixels a request's encoded images declare, in total; raises
        BudgetError above max_pixels (one image) or max_request_pixels (all)."""
        return self.sizes_pixels([declared_size(image) for image in images], input_name)

    def sizes_pixels(self, sizes: Sequence[tuple[int, int] | None], input_name: str) -> int:
        """The same from the images' declared (width, height), read by the caller (None:
        not an image Pillow knows, left to the decoder's own error)."""
        total, described = 0, []
        for row, size in enumerate(sizes):
            if size is None:
                continue
            width, height = size
            if width * height > self.max_pixels:
                raise BudgetError(
                    f"input '{input_name}' sample {row}: image declares {width}x{height} = "
                    f"{width * height} pixels, above this model's max_pixels {self.max_pixels}"
                )
            total += width * height
            described.append(f"{width}x{height}")
        if total > self.max_request_pixels:
            raise BudgetError(
                f"input '{input_name}': the request's {len(described)} images declare {total} pixels "
                f"in total ({', '.join(described[:8])}{', ...' if len(described) > 8 else ''}), above "
                f"this model's max_request_pixels {self.max_request_pixels}: send fewer or "
                "smaller images per request"
            )
        return total


def declared_size(encoded) -> tuple[int, int] | None:
    """(width, height) from an encoded image's header, None when Pillow does not
    know the format. Nothing is decoded."""
    try:
        with Image.open(io.BytesIO(encoded)) as header:
            return header.size
    except (UnidentifiedImageError, OSError, ValueError):
        return None


def plan_parts(request_pixels: Sequence[int], max_batch_pixels: int) -> list[list[int]]:
    """Split a merged batch (each request's declared pixels, in order) into runs of
    consecutive requests whose pixels add up to at most max_batch_pixels; a request
    above it on its own runs alone (request_pixels already capped it)."""
    parts: list[list[int]] = []
    current: list[int] = []
    current_pixels = 0
    for index, pixels in enumerate(request_pixels):
        if current and current_pixels + pixels > max_batch_pixels:
            parts.append(current)
            current, current_pixels = [], 0
        current.append(index)
        current_pixels += pixels
    if current:
        parts.append(current)
    return parts


def int_parameter(parameters: dict, key: str) -> int | None:
    """A model config parameter's integer (its string_value), None when it is absent."""
    value = parameters.get(key, {}).get("string_value")
    return int(value) if value else None
