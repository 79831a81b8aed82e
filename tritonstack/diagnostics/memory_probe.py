"""Memory probe: rounds of the same requests over photos of several sizes, and the
DALI stub's resident memory after each round, for several server variants side by
side (each variant is a server of its own, with its own environment; the variants'
rounds are interleaved, so a busy machine weighs on them alike).

    python -m tritonstack.diagnostics.memory_probe --variants glibc-default,default --inputs soak --rounds 10
    python -m tritonstack.diagnostics.memory_probe --variants traced --rounds 4      # + tracemalloc, mallinfo2

A round sends `--requests` batch-1 requests (the images in a fixed order, from
`--workers` threads, so that Triton's dynamic batcher merges ragged batches) to the
preprocessing model alone: only the stub under study runs. After each round the
probe records the stub's RSS and, for the `traced` variant, what the stub itself
reports (tracemalloc's live Python bytes, glibc's mallinfo2: bytes in use and free
bytes kept in the arenas). docs/memory.md has the findings.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from tritonstack import cli
from tritonstack.backends.settings import (
    DALI_HOST_POOL_ENV,
    MALLOC_TRIM_ENV,
    POOL_RESIDENCY_ENV,
    BackendSettings,
)
from tritonstack.build.model_config import write_config
from tritonstack.contract import BATCH_PRIORITY, DEFAULT_PRESET, PREPROCESS_INPUT, PREPROCESS_OUTPUT, preprocessing_name
from tritonstack.repository_files import read_config
from tritonstack.samples.photos import PHOTOS, bad_samples, good_samples, photo_path
from tritonstack.serve import process_tree
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.process_tree import rss_parts_mib, server_stubs
from tritonstack.serve.server_config import ServerConfig
from tritonstack.serve.stub_environment import STUB_ENVIRONMENT

MODEL = preprocessing_name(DEFAULT_PRESET)
SIZES = (320, 640, 1280)

# Variant name -> the environment its server gets beyond the launcher's basics
# (libraries, PATH, the repository). "default" is the server as the launcher starts
# it: DALI's host pool for buffers of 128 KiB and more (the dali backend's default),
# glibc's defaults; "compact-memory" is the launcher's --compact-memory on top of it.
# The others pin the settings of docs/memory.md's earlier probes: "glibc-default" is
# the server before the pool (every DALI buffer from malloc, glibc's defaults, no
# malloc_trim), "launcher" the --compact-memory of then, and the rest take one
# measure at a time on that base.
BEFORE_POOL = {DALI_HOST_POOL_ENV: "0", MALLOC_TRIM_ENV: "0"}
MMAP_THRESHOLD = {"MALLOC_MMAP_THRESHOLD_": "131072"}
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "compact-memory": STUB_ENVIRONMENT,
    "no-residency": {POOL_RESIDENCY_ENV: "0"},  # DALI's pool pages counted as batches reach them
    "glibc-default": BEFORE_POOL,
    "launcher": {**BEFORE_POOL, **STUB_ENVIRONMENT},
    "launcher-trim-every-8": {**BEFORE_POOL, **STUB_ENVIRONMENT, MALLOC_TRIM_ENV: "8"},
    "arena-max-2": {**BEFORE_POOL, "MALLOC_ARENA_MAX": "2"},
    "arena-max-1": {**BEFORE_POOL, "MALLOC_ARENA_MAX": "1"},
    "mmap-threshold": {**BEFORE_POOL, **MMAP_THRESHOLD},
    "mmap-threshold-1m": {**BEFORE_POOL, "MALLOC_MMAP_THRESHOLD_": "1048576"},
    "malloc-trim": {**BEFORE_POOL, MALLOC_TRIM_ENV: "1"},
    "jemalloc": {**BEFORE_POOL, "LD_PRELOAD": "libjemalloc.so.2"},  # Debian's libjemalloc2, when installed
    # DALI's pool from other sizes up (DALI_MALLOC_POOL_THRESHOLD: the largest buffer
    # DALI takes from malloc; 0 sends every buffer to malloc).
    "dali-pool-1m": {DALI_HOST_POOL_ENV: "1M"},
    "dali-pool-4m": {DALI_HOST_POOL_ENV: "4M"},
    "dali-pool-1m-mmap": {**MMAP_THRESHOLD, DALI_HOST_POOL_ENV: "1M"},
    "traced": {},  # + MEMORY_TRACE_ENV, set per run
    "traced-glibc-default": BEFORE_POOL,
    "traced-launcher": {**BEFORE_POOL, **STUB_ENVIRONMENT},
    "reserve-128m": {},  # + model parameters (VARIANT_PARAMETERS)
}


# Variant name -> the model config parameters its copy of the model gets.
VARIANT_PARAMETERS: dict[str, dict[str, str]] = {
    "reserve-128m": {"host_pool_reserve_bytes": str(128 << 20)},  # DALI's pool reserved at load
}


def sized_photos(sizes=SIZES, photos=tuple(PHOTOS), image_format: str = "JPEG") -> list[bytes]:
    """Each photo resized so its longer side is each size, as JPEG (quality 90) or PNG."""
    images = []
    for name in photos:
        with Image.open(photo_path(name)) as photo:
            rgb = photo.convert("RGB")
        for size in sizes:
            scale = size / max(rgb.size)
            resized = rgb.resize(
                (max(1, round(rgb.width * scale)), max(1, round(rgb.height * scale))), Image.Resampling.BILINEAR
            )
            encoded = io.BytesIO()
            resized.save(encoded, format=image_format, **({"quality": 90} if image_format == "JPEG" else {}))
            images.append(encoded.getvalue())
    return images


def stub_pid(server_pid: int, model: str = MODEL) -> int:
    """The live backend stub that serves `model` (argv names the model's file)."""
    live, _ = server_stubs(server_pid)
    pids = [pid for pid, name in live.items() if name == model]
    if len(pids) != 1:
        raise RuntimeError(f"expected one stub for {model}, found {live}")
    return pids[0]


def rss_mib(pid: int) -> float:
    return process_tree.rss_mib(psutil.Process(pid))


class RoundSender:
    """Sends a round of batch-1 requests over HTTP from a few threads; one
    tritonclient per thread (the sync HTTP client is not thread-safe)."""

    def __init__(self, url: str, workers: int = 4, model: str = MODEL, bad_images: frozenset[bytes] = frozenset()):
        self.url, self.workers, self.model, self.bad_images = url, workers, model, bad_images
        self._local = threading.local()
        self._clients: list[httpclient.InferenceServerClient] = []
        self._lock = threading.Lock()

    def _client(self) -> httpclient.InferenceServerClient:
        if not hasattr(self._local, "client"):
            self._local.client = httpclient.InferenceServerClient(self.url, network_timeout=120)
            with self._lock:
                self._clients.append(self._local.client)
        return self._local.client

    def _send(self, image: bytes) -> None:
        """At batch priority: a round's full batches wait their turn, none is refused at the
        server's latency objective (tritonstack.objective)."""
        data = np.frombuffer(image, dtype=np.uint8)[np.newaxis]
        tensor = httpclient.InferInput(PREPROCESS_INPUT, list(data.shape), "UINT8")
        tensor.set_data_from_numpy(data, binary_data=True)
        outputs = [httpclient.InferRequestedOutput(PREPROCESS_OUTPUT, binary_data=True)]
        if image in self.bad_images:  # the pipeline fails on it and is rebuilt: a client error is the answer
            try:
                self._client().infer(self.model, [tensor], outputs=outputs, priority=BATCH_PRIORITY)
            except InferenceServerException as error:
                if str(error.status()).startswith("4"):
                    return
                raise
            raise RuntimeError("a bad input was accepted")
        result = self._client().infer(self.model, [tensor], outputs=outputs, priority=BATCH_PRIORITY)
        if result.as_numpy(PREPROCESS_OUTPUT).shape != (1, 3, 224, 224):
            raise RuntimeError(f"unexpected output shape {result.as_numpy(PREPROCESS_OUTPUT).shape}")

    def send_round(self, images: list[bytes], requests: int) -> float:
        """`requests` requests, image i % len(images) for the i-th: every round the
        same. Returns the round's seconds; any failed request raises."""
        started = time.monotonic()
        with ThreadPoolExecutor(self.workers) as pool:
            for future in [pool.submit(self._send, images[i % len(images)]) for i in range(requests)]:
                future.result()
        return time.monotonic() - started

    def close(self) -> None:
        for client in self._clients:
            client.close()


@dataclass
class VariantRun:
    """One server and its figures, round by round."""

    name: str
    server: TritonServer
    sender: RoundSender
    trace_path: Path | None = None
    rounds: list[dict] = field(default_factory=list)

    def record(self, round_index: int, seconds: float) -> dict:
        pid = stub_pid(self.server.pid)
        row = {
            "round": round_index,
            "seconds": round(seconds, 1),
            "stub_rss_mib": round(rss_mib(pid), 2),
            "stub_rss_parts_mib": rss_parts_mib(pid),
            "server_rss_mib": round(rss_mib(self.server.pid), 2),
        }
        if self.trace_path is not None and self.trace_path.exists():
            row["stub_trace"] = json.loads(self.trace_path.read_text())
        self.rounds.append(row)
        return row


def dali_only_server(repository: Path, environment: dict[str, str]) -> TritonServer:
    """A server (not yet started) with only the model under study loaded (of a
    study_repository: one stub), a quicker start, no other process's noise."""
    config = ServerConfig(repository, extra_args=("--model-control-mode=explicit", f"--load-model={MODEL}"))
    return TritonServer(config, environment=environment)


def bad_inputs() -> list[bytes]:
    """The soak's bad inputs: the decoder fails on each, the pipeline is rebuilt."""
    return [sample.data for sample in bad_samples()]


def study_repository(repository: Path, workdir: Path, parameters: dict[str, str] | None = None) -> Path:
    """A repository in workdir (made here) holding a copy of the model under study
    alone, as one instance (one stub to watch; the build gives it two), with
    `parameters` added to its config."""
    copy = workdir / "repository"
    shutil.copytree(repository / MODEL, copy / MODEL)
    config = read_config(copy / MODEL)
    config.instance_group[0].count = 1
    for key, value in (parameters or {}).items():
        config.parameters[key].string_value = value
    write_config(copy / MODEL, config)
    return copy


def start_variant(
    stack: ExitStack,
    name: str,
    repository: Path,
    workdir: Path,
    workers: int,
    bad_images: frozenset[bytes] = frozenset(),
) -> VariantRun:
    environment = dict(VARIANTS[name])
    repository = study_repository(repository, workdir / name, VARIANT_PARAMETERS.get(name))
    trace_path = None
    if name.startswith("traced"):
        trace_path = workdir / f"{name}.json"
        environment.update(BackendSettings(memory_trace=str(trace_path)).to_environ())
    server = stack.enter_context(dali_only_server(repository, environment))
    sender = RoundSender(server.http_url, workers, bad_images=bad_images)
    stack.callback(sender.close)
    return VariantRun(name, server, sender, trace_path)


def run_probe(
    repository: Path,
    variants: list[str],
    rounds: int,
    requests: int,
    sizes=SIZES,
    workers: int = 4,
    inputs: str = "photos",
    image_format: str = "JPEG",
    log=print,
) -> dict:
    """inputs: "photos" (sized_photos), "bad" (the soak's bad inputs), "mixed"
    (the photos, then the bad inputs, in each round), "soak" (the soak's own good
    photos as they ship, PNG and JPEG, three times, then its bad inputs) or
    "soak-good" (the same without the bad inputs)."""
    bad = bad_inputs() if inputs in ("bad", "mixed", "soak") else []
    if inputs in ("soak", "soak-good"):
        images = [sample.data for sample in good_samples()] * 3 + bad
    else:
        images = (sized_photos(sizes, image_format=image_format) if inputs in ("photos", "mixed") else []) + bad
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="memory-probe-") as workdir:
        runs = [start_variant(stack, name, repository, Path(workdir), workers, frozenset(bad)) for name in variants]
        for run in runs:
            run.record(0, 0.0)  # after start-up and warm-up, before any request
        for round_index in range(1, rounds + 1):
            for run in runs:  # interleaved: the machine's load weighs on every variant alike
                row = run.record(round_index, run.sender.send_round(images, requests))
                parts = ", ".join(f"{key[3:]} {value:.1f}" for key, value in row["stub_rss_parts_mib"].items())
                log(
                    f"round {round_index} {run.name:17s} stub RSS {row['stub_rss_mib']:8.2f} MiB ({parts}) "
                    f"{row['seconds']:.1f} s{trace_line(row)}"
                )
        return {
            "model": MODEL,
            "inputs": inputs,
            "sizes": list(sizes),
            "images": len(images),
            "requests_per_round": requests,
            "format": image_format,
            "workers": workers,
            "variants": {run.name: {"environment": VARIANTS[run.name], "rounds": run.rounds} for run in runs},
        }


def trace_line(row: dict) -> str:
    trace = row.get("stub_trace")
    if not trace:
        return ""
    text = f"; traced Python {trace['traced_bytes'] / 2**20:.2f} MiB"
    if "mallinfo2" in trace:
        info = trace["mallinfo2"]
        text += (
            f"; malloc in use {info['uordblks'] / 2**20:.1f} MiB, free in arenas "
            f"{info['fordblks'] / 2**20:.1f} MiB, mmapped {info['hblkhd'] / 2**20:.1f} MiB"
        )
    return text


def summary(report: dict) -> str:
    """One line per variant: RSS after each round, and each round's increase."""
    inputs = (
        "/".join(map(str, report["sizes"])) + " px" if report["inputs"] in ("photos", "mixed") else report["inputs"]
    )
    lines = [
        f"{report['requests_per_round']} requests per round over {report['images']} images "
        f"({inputs}), {report['workers']} clients; stub RSS in MiB after each round (round 0: idle):"
    ]
    for name, variant in report["variants"].items():
        rss = [row["stub_rss_mib"] for row in variant["rounds"]]
        steps = " ".join(f"{b - a:+6.2f}" for a, b in zip(rss[1:], rss[2:]))
        lines.append(
            f"  {name:17s} "
            + " ".join(f"{value:7.1f}" for value in rss)
            + f"   increase per round after the first: {steps}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class MemoryProbeOptions(cli.RepositoryOption):
    variants: tuple[str, ...] = cli.option(
        ("glibc-default", "default"),
        "--variants",
        type=cli.comma_separated(),
        help=f"comma-separated, of: {', '.join(VARIANTS)}",
    )
    rounds: int = cli.option(5, "--rounds", type=cli.positive_int, help="rounds of requests")
    requests: int = cli.option(600, "--requests", type=cli.positive_int, help="requests per round")
    sizes: tuple[int, ...] = cli.option(SIZES, "--sizes", type=cli.comma_separated(int), help="longer sides, px")
    workers: int = cli.option(4, "--workers", type=cli.positive_int, help="client threads")
    image_format: str = cli.option("JPEG", "--format", choices=("JPEG", "PNG"), help="of the sized photos")
    inputs: str = cli.option(
        "photos",
        "--inputs",
        choices=("photos", "bad", "mixed", "soak", "soak-good"),
        help="bad: the soak's bad inputs (pipeline errors and rebuilds); mixed: both",
    )
    out: Path = cli.out_option(Path("reports/memory_probe.json"), help="the report")


def parser() -> argparse.ArgumentParser:
    made = cli.parser(__doc__.split("\n\n")[0])
    cli.add_options(made, MemoryProbeOptions)
    return made


def main(argv: list[str] | None = None) -> int:
    return cli.run(run, argv, parser)


def run(args: argparse.Namespace) -> int:
    options = cli.from_args(MemoryProbeOptions, args)
    unknown = set(options.variants) - set(VARIANTS)
    if unknown:
        raise cli.OptionError(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    report = run_probe(
        options.model_repository,
        list(options.variants),
        options.rounds,
        options.requests,
        options.sizes,
        options.workers,
        options.inputs,
        options.image_format,
    )
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(report, indent=1))
    print(summary(report))
    print(f"report: {options.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
