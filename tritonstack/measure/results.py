"""The benchmark's JSON: the machine and versions, the keys every run writes, the targets
and which ones a run missed."""

from __future__ import annotations

import json
import platform
from importlib import metadata
from pathlib import Path

from tritonstack.measure.figures import BENCHMARK, Median, written_keys
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


# Read from the registry (tritonstack/measure/figures.py): a key, target or ceiling is declared there.
REQUIRED_KEYS = written_keys(tuple(figure for figure in BENCHMARK if figure.promised))

# The promised medians of rounds: each with `<key>_spread` ([min, max] over the rounds),
# `<key>_interval` (a 95 % bootstrap interval of the median) and `<key>_n`.
RATIO_KEYS = tuple(figure.key for figure in BENCHMARK if figure.promised and figure.spread)

TARGETS = {figure.key: figure.target for figure in BENCHMARK if figure.target}

# A served ratio and the key of the most this CPU allows it (tritonstack/benchmark/cost.py).
CEILINGS = {figure.key: figure.ceiling for figure in BENCHMARK if figure.ceiling}


def target_verdict(value: float, interval: list | None, sense: str, target: float) -> str:
    """ "met", "missed", or "inconclusive" where the interval straddles the target: a
    median of a few rounds on the right side is not yet a met target. Without an
    interval (a single measure), the value alone decides."""
    low, high = interval if interval is not None else (value, value)
    if sense == ">=":
        return "met" if low >= target else "missed" if high < target else "inconclusive"
    return "met" if high <= target else "missed" if low > target else "inconclusive"


def target_text(results: dict, key: str) -> str:
    """ "vs_peer_throughput = 1.031 [0.98, 1.06] n=5 (target >= 1.0" """
    sense, target = TARGETS[key]
    return f"{key} = {Median.read(results, key).text('.4g')} (target {sense} {target}"


def targets_with_verdict(results: dict, verdict: str) -> list[str]:
    """The targets whose verdict is `verdict`, each as a line: the value, its interval
    and n, the target, and for a missed one this CPU's ceiling where it has one."""
    lines = []
    for key, (sense, target) in TARGETS.items():
        value = results[key]
        if value is None:  # not measurable here (a server on another host)
            continue
        if target_verdict(value, results.get(f"{key}_interval"), sense, target) != verdict:
            continue
        ceiling = results.get(CEILINGS.get(key, ""))
        beyond = f"; this CPU's ceiling {ceiling:.3g}" if ceiling is not None and verdict == "missed" else ""
        lines.append(f"{target_text(results, key)}{beyond})")
    return lines


def write_results(results: dict, out: Path) -> str:
    """Add the missed and inconclusive targets, write the JSON file, return its text."""
    missing = [key for key in REQUIRED_KEYS if key not in results]
    if missing:
        raise KeyError(f"benchmark results lack {missing}")
    results["missed_targets"] = targets_with_verdict(results, "missed")
    results["inconclusive_targets"] = targets_with_verdict(results, "inconclusive")
    text = json.dumps(results, indent=2, default=float) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text
