"""Regions: an image and its boxes in one request against each box sent as an image
of its own, side by side on one server.

    tritonstack benchmark --regions 8 --out reports/regions.json

Both sides classify the same crops of the same photo (a 640-pixel JPEG of the load
tests' corpus) with Lite0, CONCURRENCY photos in flight from one asyncio client:
- regions: the photo and its `boxes` boxes in one request to ensemble_regions_efficientnet_lite0
  (decoded once on the server, each box letterboxed there);
- per crop: each box cut by Pillow here and JPEG-encoded (once, before measuring: the
  client's cutting is not counted), then the photo's crops sent at once, each alone, to
  ensemble_dali_efficientnet_lite0, as a user without the regions preset does.

Written (declared in tritonstack/measure/figures.py, REGIONS): regions_crops_per_s,
per_crop_crops_per_s and regions_speedup (their ratio), and the same per second of the
server's CPU (`_per_cpu_s`, `regions_speedup_per_cpu_s`: on a machine shared with other
work, the steadier figure), each the median of `repeats` interleaved rounds with
`<key>_spread` [min, max]; the box count.
"""

from __future__ import annotations

import asyncio
import io
import os
from dataclasses import dataclass

import numpy as np
from PIL import Image

from tritonstack.benchmark.scenario import Asked, on_server, write_json
from tritonstack.contract import DEFAULT_REGIONS_MODEL
from tritonstack.measure.figures import REGIONS, Median, report
from tritonstack.measure.load_loops import Phase, closed_loop
from tritonstack.measure.load_settings import Settings
from tritonstack.measure.measured_models import DALI_ENSEMBLE
from tritonstack.measure.results import cpu_model
from tritonstack.measure.rounds import interleaved, ratios
from tritonstack.measure.server_usage import server_cpu_seconds
from tritonstack.media.regions import oriented_size, random_boxes
from tritonstack.samples.corpus import build_corpus

CONCURRENCY = 4
PHOTO = "coffee@640q85.jpg"
CROP_QUALITY = 90


def regions_workload(boxes: int, seed: int = 0) -> tuple[bytes, list[tuple[float, ...]], list[bytes]]:
    """The photo, `boxes` random boxes of it, and each box cut and encoded as a JPEG."""
    photo = next(image.data for image in build_corpus() if image.name == PHOTO)
    regions = random_boxes(oriented_size(photo), boxes, np.random.default_rng(seed))
    crops = []
    with Image.open(io.BytesIO(photo)) as image:
        for box in regions:
            encoded = io.BytesIO()
            image.convert("RGB").crop(tuple(round(value) for value in box)).save(encoded, "JPEG", quality=CROP_QUALITY)
            crops.append(encoded.getvalue())
    return photo, regions, crops


@dataclass(frozen=True)
class RegionFigures:
    boxes: int
    concurrency: int
    photo: str
    cpu_model: str
    cpu_count: int | None
    settings: dict
    errors: int
    regions_crops_per_s: Median
    per_crop_crops_per_s: Median
    regions_speedup: Median
    regions_crops_per_cpu_s: Median
    per_crop_crops_per_cpu_s: Median
    regions_speedup_per_cpu_s: Median


def run_regions(server, boxes: int, settings: Settings, log=print) -> dict:
    """The figures above, on `server` (which serves both ensembles)."""
    photo, regions, crops = regions_workload(boxes)

    measures = {
        "regions": lambda: _phase(server, DEFAULT_REGIONS_MODEL, (photo, regions), boxes, settings, _classify_regions),
        "per_crop": lambda: _phase(server, DALI_ENSEMBLE, crops, boxes, settings, _classify_each),
    }
    rounds = interleaved(measures, settings.repeats, log)
    # A round in which no photo's answer came back within the window measured nothing (None),
    # not a rate of zero: it gives no ratio.
    medians = {}
    for suffix, rate in (("_per_s", _per_s), ("_per_cpu_s", _per_cpu_s)):
        rates = {name: [rate(phase) for phase in phases] for name, phases in rounds.items()}
        medians[f"regions_crops{suffix}"] = Median.of([r for r in rates["regions"] if r is not None])
        medians[f"per_crop_crops{suffix}"] = Median.of([r for r in rates["per_crop"] if r is not None])
        medians[f"regions_speedup{suffix.removeprefix('_per_s')}"] = Median.of(
            ratios(rates["regions"], rates["per_crop"])
        )
    figures = RegionFigures(
        boxes=boxes,
        concurrency=CONCURRENCY,
        photo=PHOTO,
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count(),
        settings={"seconds": settings.seconds, "warmup_s": settings.warmup_s, "repeats": settings.repeats},
        errors=sum(phase.errors for phases in rounds.values() for phase in phases),
        **medians,
    )
    return report(REGIONS, figures)


@dataclass(frozen=True)
class RegionSpeedup:
    """`--regions N`: an image and N boxes a request against each crop sent alone."""

    name: str = "regions"

    def wanted(self, asked: Asked) -> bool:
        return bool(asked.regions)

    def run(self, asked: Asked, server, log) -> dict:
        return on_server(lambda on: run_regions(on, asked.regions, asked.settings, log), asked.repository, server)

    def write(self, results: dict, asked: Asked) -> str:
        write_json(results, asked.out)
        return (
            f"{asked.out}: {results['regions_crops_per_s']:.1f} crops/s in regions requests of "
            f"{asked.regions} boxes, "
            f"{results['per_crop_crops_per_s']:.1f} crops/s one per request: x{results['regions_speedup']:.2f} "
            f"(rounds {results['regions_speedup_spread']})"
        )


SCENARIO = RegionSpeedup()


def _per_s(phase: Phase) -> float | None:
    return phase.images_per_s or None


def _per_cpu_s(phase: Phase) -> float | None:
    return phase.images_per_cpu_s or None


def _phase(server, model: str, item, boxes: int, settings: Settings, send) -> Phase:
    """A closed loop of one photo's worth of work per request slot; counts its crops."""
    cpu = server_cpu_seconds(server)
    phase = asyncio.run(
        closed_loop(server.grpc_url, "grpc", model, [item], CONCURRENCY, settings.seconds, settings.warmup_s, send)
    )
    phase.server_cpu_s, phase.warmup_s = server_cpu_seconds(server) - cpu, settings.warmup_s
    phase.images = len(phase.latencies_s) * boxes
    return phase


def _classify_regions(client, item):
    image, boxes = item
    return client.classify_regions(image, boxes, top_k=1)


def _classify_each(client, crops: list[bytes]):
    return asyncio.gather(*(client.classify([crop], top_k=1) for crop in crops))
