"""The benchmark's JSON: the machine and versions, the keys every run writes, the targets
and which ones a run missed."""

from __future__ import annotations

import json
import platform
from importlib import metadata
from pathlib import Path

from tritonstack.serve.launcher import TritonServer


def versions(server: TritonServer) -> dict:
    import tritonclient.http as httpclient

    with httpclient.InferenceServerClient(server.http_url) as client:
        server_version = client.get_server_metadata()["version"]
    packages = ("nvidia-dali-cuda120", "onnxruntime", "tritonclient", "nvidia-pytriton", "locust", "numpy", "pillow")
    return {
        "tritonserver": server_version,
        "python": platform.python_version(),
        **{package: metadata.version(package) for package in packages},
    }


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


# The x86 instruction-set extensions that change which kernels ONNX Runtime and DALI
# run (the INT8 ones above all: VNNI or not), as /proc/cpuinfo names them.
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_int8",
    "amx_tile",
)


def cpu_flags() -> list[str]:
    """The ISA_FLAGS this CPU has (empty off Linux/x86)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else ():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            return [flag for flag in ISA_FLAGS if flag in present]
    return []


# Every key the benchmark promises, besides versions and settings (docs/performance.md explains each).
# Each of RATIO_KEYS comes with `<key>_spread`: [min, max] over the rounds.
RATIO_KEYS = (
    "serving_efficiency",
    "dali_vs_pil_preprocess",
    "dali_vs_pil_per_cpu_second",
    "dali_vs_pil_ensemble",
    "http_vs_grpc",
    "int8_vs_fp32_ensemble",
    "ensemble_overhead_ms_p50",
    "ensemble_overhead_share",
    "p99_over_p50",
    "int8_vs_fp32_ensemble_ceiling",
    "dali_vs_pil_ensemble_ceiling",
    # against the peer (tritonstack/benchmark/vs_peer.py): None without the peer extra
    "vs_peer_throughput",
    "vs_peer_cpu",
    "int8_vs_peer_throughput",
    "int8_vs_peer_cpu",
    "vs_peer_open_loop_p99",
)


REQUIRED_KEYS = (
    "inprocess_images_per_s",
    "server_images_per_s",
    "dali_preprocess_images_per_s",
    "pil_preprocess_images_per_s",
    *RATIO_KEYS,
    *(f"{key}_spread" for key in RATIO_KEYS),
    "capacity_at_slo",
    "int8_top1_agreement",
    "int8_top5_overlap",
    "int8_top1_agreement_crops",
    "int8_top5_overlap_crops",
    "int8_top1_agreement_clear_crops",
    # what tritonstack/benchmark/plan.py reads
    "latency_ms_p50_concurrency_1",
    "open_loop_rate",
    "open_loop_ms_p50",
    "open_loop_ms_p99",
    "server_rss_mb",
    "errors",
    "versions",
    "cpu_model",
    "cpu_flags",
    "cpu_count",
    # cost per image against the two libraries, capacity against an ideal queue
    "inprocess_images_per_cpu_s",
    "server_images_per_cpu_s",
    "cpu_efficiency",
    "cpu_efficiency_spread",
    "ideal_queue_capacity",
    "capacity_vs_ideal_queue",
    "open_loop_requests",
    "cpu_ms_per_image",
    "cpu_ms_per_image_spread",  # the ceilings' parts (tritonstack/benchmark/cost.py)
    "peer_images_per_s",
    "peer_cpu_ms_per_image",
    "int8_peer_images_per_s",
    "int8_peer_cpu_ms_per_image",
    "vs_peer_latency",
)


TARGETS = {
    "serving_efficiency": (">=", 0.90),
    "dali_vs_pil_preprocess": (">=", 1.5),
    "ensemble_overhead_ms_p50": ("<=", 1.0),
    "ensemble_overhead_share": ("<=", 0.04),
    "p99_over_p50": ("<=", 2.5),
    "cpu_efficiency": (">=", 0.95),
    "capacity_vs_ideal_queue": (">=", 0.90),
    "dali_vs_pil_ensemble": (">=", 1.5),
    "int8_vs_fp32_ensemble": (">=", 1.5),
    # On the 216 crops: the 13 parity photos move by 7.7 points per near-tie.
    "int8_top1_agreement_crops": (">=", 0.85),
    "int8_top1_agreement_clear_crops": (">=", 0.95),
    "server_rss_mb": ("<=", 2048),
    # Not slower nor costlier than the service a user writes instead, p99 no worse.
    "vs_peer_throughput": (">=", 1.0),
    "vs_peer_cpu": ("<=", 1.0),
    "int8_vs_peer_throughput": (">=", 1.0),
    "int8_vs_peer_cpu": ("<=", 1.0),
    "vs_peer_open_loop_p99": ("<=", 1.0),
    "errors": ("<=", 0),
}


# A served ratio and the most this CPU allows it (tritonstack/benchmark/cost.py).
CEILINGS = {
    "int8_vs_fp32_ensemble": "int8_vs_fp32_ensemble_ceiling",
    "dali_vs_pil_ensemble": "dali_vs_pil_ensemble_ceiling",
}


def missed_targets(results: dict) -> list[str]:
    missed = []
    for key, (sense, target) in TARGETS.items():
        value = results[key]
        if value is None:  # not measurable here (a server on another host)
            continue
        if (sense == ">=" and value < target) or (sense == "<=" and value > target):
            ceiling = results.get(CEILINGS.get(key, ""))
            beyond = f"; this CPU's ceiling {ceiling:.3g}" if ceiling is not None else ""
            missed.append(f"{key} = {value:.4g} (target {sense} {target}{beyond})")
    return missed


def write_results(results: dict, out: Path) -> str:
    """Add the missed targets, write the JSON file, return its text."""
    missing = [key for key in REQUIRED_KEYS if key not in results]
    if missing:
        raise KeyError(f"benchmark results lack {missing}")
    results["missed_targets"] = missed_targets(results)
    text = json.dumps(results, indent=2, default=float) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text
