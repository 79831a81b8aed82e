"""The GPU variant served: tritonserver with our Python-based backends on a repository
built with `tritonstack build --device gpu`, beside the CPU variant served the same way
on the same machine.

    python3 -m tritonstack.gpu.gpu_serve --gpu-repository GPU_REPO \\
        --cpu-repository CPU_REPO --inputs .gpu/inputs --out serve.json   # there

gpu_check runs the GPU variant's pipelines through DALI alone; this runs the variant as
users deploy it: the nvidia-pytriton `tritonserver`, its KIND_GPU instances, the DALI
step on the card and the classifier behind it (ONNX Runtime on the CPU here: our
onnxruntime backend has no GPU provider). Per variant it writes the seconds to ready,
each photo's top-1 and margin from the DALI ensemble over gRPC, and the images per
second and server CPU per image of the ensemble and of its DALI step alone, in closed
loops. Without a CUDA device the GPU variant is recorded as absent and the CPU variant
is measured: the path `make test` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tritonstack import cli
from tritonstack.build.classifiers import CLEAR_MARGIN
from tritonstack.gpu import gpu_check
from tritonstack.measure.load_loops import load_client, measured_phase
from tritonstack.measure.load_settings import Settings
from tritonstack.measure.measured_models import DALI_ENSEMBLE, DALI_PREPROCESS
from tritonstack.serve.launcher import ServerStartError, TritonServer

CONCURRENCY = 64  # in flight: enough to fill the batches of 16 cores or a card
WARMUP_S = 2.0
SUMMARY = ("ready_s", "ensemble", "dali_step_alone", "error")


async def _ranked(url: str, photos: list[bytes]) -> tuple[list[int], list[float]]:
    """Each photo's top-1 class and its lead over the second, from the ensemble."""
    async with load_client(url, "grpc", DALI_ENSEMBLE) as client:
        rows = [(await client.probabilities([photo]))[0] for photo in photos]
    return gpu_check.top1_and_margin(np.stack(rows))


def _loop(server, model: str, photos: list[bytes], seconds: float, concurrency: int) -> dict:
    """A closed loop on `model`: images per second, server CPU ms per image, failures."""
    timing = Settings(seconds, WARMUP_S, (concurrency,), inprocess_grid=(), open_loop_s=0)
    phase = measured_phase(server, "grpc", model, photos, concurrency, timing)
    per_cpu_s = phase.images_per_cpu_s
    return {
        "images_per_s": round(phase.images_per_s, 1),
        "server_cpu_ms_per_image": round(1000 / per_cpu_s, 2) if per_cpu_s else None,
        "ms_p50": round(phase.percentile_ms(50), 1),
        "errors": phase.errors,
    }


def measure(server, photos: list[bytes], seconds: float, concurrency: int = CONCURRENCY) -> dict:
    """What one running server gives: top-1s, then the ensemble and its DALI step alone."""
    top1, margins = asyncio.run(_ranked(server.grpc_url, photos))
    return {
        "top1": top1,
        "top1_margin": [round(margin, 4) for margin in margins],
        "ensemble": _loop(server, DALI_ENSEMBLE, photos, seconds, concurrency),
        "dali_step_alone": _loop(server, DALI_PREPROCESS, photos, seconds, concurrency),
    }


def serve_variant(repository: Path, photos: list[bytes], seconds: float, concurrency: int) -> dict:
    """Starts the repository's server on loopback, measures it, stops it."""
    started = time.monotonic()
    server = TritonServer(repository)
    try:
        with server:
            ready_s = round(time.monotonic() - started, 1)
            try:
                return {"ready_s": ready_s} | measure(server, photos, seconds, concurrency)
            except Exception as error:  # a request failed: what it said, and what the server logged
                return {"ready_s": ready_s, "error": str(error)[:4000], "server_log": server.log_errors()[-4000:]}
    except ServerStartError as error:
        return {"error": str(error).strip()[-4000:]}


def agreement(cpu: dict, gpu: dict) -> dict:
    """Top-1s of the two variants: equal everywhere, and where the CPU's leads by CLEAR_MARGIN."""
    if "top1" not in cpu or "top1" not in gpu:
        return {"top1_equal": None, "top1_equal_where_clear": None}
    pairs = list(zip(cpu["top1"], gpu["top1"], cpu["top1_margin"]))
    return {
        "top1_equal": sum(a == b for a, b, _ in pairs),
        "top1_equal_where_clear": all(a == b for a, b, margin in pairs if margin >= CLEAR_MARGIN),
        "photos": len(pairs),
        "clear": sum(margin >= CLEAR_MARGIN for _, _, margin in pairs),
    }


def run(gpu_repo: Path, cpu_repo: Path, inputs: Path, seconds: float, concurrency: int) -> dict:
    gpu = gpu_check.cuda_devices() > 0
    photos = [(inputs / name).read_bytes() for name in gpu_check.image_inputs(inputs)]
    cpu_side = serve_variant(cpu_repo, photos, seconds, concurrency)
    if gpu:
        gpu_side = serve_variant(gpu_repo, photos, seconds, concurrency)
    else:
        gpu_side = {"error": "no CUDA device: the GPU variant was not served"}
    return {
        "machine": gpu_check.machine(gpu),
        "concurrency": concurrency,
        "seconds": seconds,
        "photos": gpu_check.image_inputs(inputs),
        "cpu_variant": cpu_side,
        "gpu_variant": gpu_side,
        "agreement": agreement(cpu_side, gpu_side),
    }


@dataclass(frozen=True)
class GpuServeOptions(gpu_check.Variants):
    seconds: float = cli.option(10.0, "--seconds", type=cli.positive_float, help="each closed loop")
    concurrency: int = cli.option(CONCURRENCY, "--concurrency", type=cli.positive_int, help="requests in flight")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tritonstack.gpu.gpu_serve", description=__doc__, formatter_class=cli.HelpFormatter
    )
    cli.add_options(parser, GpuServeOptions)
    options = cli.from_args(GpuServeOptions, parser.parse_args(argv))
    report = run(options.gpu_repository, options.cpu_repository, options.inputs, options.seconds, options.concurrency)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(report, indent=2) + "\n")
    for variant in ("cpu_variant", "gpu_variant"):
        summary = {key: report[variant][key] for key in SUMMARY if key in report[variant]}
        print(variant, json.dumps(summary))
    print("agreement", json.dumps(report["agreement"]))


if __name__ == "__main__":
    main()
