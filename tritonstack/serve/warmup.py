"""Warm every loaded ensemble with a real sample before the server is called ready.

Each step of our ensembles warms up alone (`model_warmup` in its config), but Triton
refuses `model_warmup` on an ensemble, and the first request through the chain still
paid the chain's first-run costs (the steps' first batch of a real shape, the ensemble
scheduler's first allocations). The launcher sends each loaded ensemble whose input is
our encoded-bytes tensor the package's sample (a photo, with a one-pixel box for a
regions ensemble; the clip for a video ensemble) a few times, within a time budget, and logs one line of what it did. A
sample refused or a budget spent is logged, not fatal: the server still serves.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from tritonstack.contract import ENSEMBLE_BOXES, ENSEMBLE_INPUT, is_audio_model, is_regions_model, is_video_model
from tritonstack.samples.photos import sample_clip, sample_jpeg
from tritonstack.samples.speech import tone_wav
from tritonstack.serve.warmup_request import WarmupFailed, send_sample

LOGGER = logging.getLogger("tritonstack.serve")

# Requests per ensemble: the first pays the chain's first-run costs, the next confirm
# they are paid.
REQUESTS_PER_ENSEMBLE = 2


@dataclass
class WarmupReport:
    took_s: dict[str, list[float]] = field(default_factory=dict)  # per ensemble, each request's seconds
    skipped: dict[str, str] = field(default_factory=dict)  # ensemble -> why
    elapsed_s: float = 0.0

    def summary(self) -> str:
        warmed = ", ".join(f"{name} {max(times):.2f} s" for name, times in self.took_s.items()) or "none"
        line = (
            f"warmup: {len(self.took_s)} ensemble(s) answered a real sample in {self.elapsed_s:.1f} s "
            f"(slowest request each: {warmed})"
        )
        if self.skipped:
            line += "; not warmed: " + "; ".join(f"{name} ({why})" for name, why in self.skipped.items())
        return line


def takes_encoded_bytes(config: dict) -> bool:
    """An ensemble whose input is our encoded-bytes row (tritonstack.contract), alone or
    with a regions ensemble's boxes."""
    inputs = {tensor.get("name"): tensor for tensor in config.get("input", [])}
    image = inputs.pop(ENSEMBLE_INPUT, {})
    boxes = inputs.pop(ENSEMBLE_BOXES, None) if is_regions_model(config.get("name", "")) else None
    return (
        config.get("platform") == "ensemble"
        and not inputs
        and image.get("data_type") == "TYPE_UINT8"
        and list(map(int, image.get("dims", []))) == [-1]
        and (boxes is None or boxes.get("data_type") == "TYPE_FP32")
    )


def sample_for(model: str) -> bytes:
    if is_audio_model(model):
        return tone_wav()
    return sample_clip() if is_video_model(model) else sample_jpeg()


def warm_ensembles(http_url: str, configs: list[dict], budget_s: float) -> WarmupReport:
    """Send each ensemble of the loaded `configs` its sample REQUESTS_PER_ENSEMBLE times,
    all within `budget_s` (each request's timeout is what is left of it)."""
    report = WarmupReport()
    started = time.monotonic()
    _send_samples(http_url, configs, started + budget_s, budget_s, report)
    report.elapsed_s = time.monotonic() - started
    return report


def _send_samples(http_url: str, configs: list[dict], deadline: float, budget_s: float, report: WarmupReport) -> None:
    for config in configs:
        name = config["name"]
        if config.get("platform") != "ensemble":
            continue
        if not takes_encoded_bytes(config):
            report.skipped[name] = "its input is not encoded image bytes"
            continue
        try:
            for _ in range(REQUESTS_PER_ENSEMBLE):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WarmupFailed(f"the warmup's {budget_s:g} s budget is spent")
                took = send_sample(f"http://{http_url}", name, sample_for(name), left)
                report.took_s.setdefault(name, []).append(took)
        except WarmupFailed as error:
            report.took_s.pop(name, None)
            report.skipped[name] = str(error)
