"""The peer service (tritonstack.benchmark.peer_service) started beside our server,
on loopback, serving the very classifier files of the repository (the load loops
drive it with tritonstack.measure.peer_client).

    with peer_server(repository, ["efficientnet_lite0"]) as peer:
        phase = asyncio.run(closed_loop(peer.url, PEER_PROTOCOL, "efficientnet_lite0", ...))

The peer runs a uvicorn worker a usable core (the cores our layout reads: affinity and
the cgroup's quota), as its author would; it is stopped, its workers with it, when the
block ends or the benchmark dies.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tritonstack.build.model_files import VERSION
from tritonstack.build.presets import preset_named
from tritonstack.repository_files import LABELS_FILENAME, ONNX_MODEL_FILENAME
from tritonstack.serve import process
from tritonstack.serve.layout import read_cores
from tritonstack.serve.network import LOOPBACK, free_port

READY_TIMEOUT_S = 120.0


def available() -> bool:
    """The peer extra is installed (`pip install tritonstack[peer]`)."""
    return all(importlib.util.find_spec(name) for name in ("fastapi", "uvicorn"))


def model_specs(repository: Path, presets: list[str]) -> dict[str, dict]:
    """What the peer serves for each preset: its classifier's files in `repository`
    and the preprocessing the preset's DALI model does."""
    specs = {}
    for name in presets:
        classifier = preset_named(name).classifier
        folder = repository / classifier.name
        specs[classifier.name] = {
            "onnx": str(folder / VERSION / ONNX_MODEL_FILENAME),
            "labels": str(folder / LABELS_FILENAME),
            "input_name": classifier.input_name,
            "resize_shorter": classifier.preprocessing.resize_shorter,
            "crop": classifier.preprocessing.crop,
            "mean": list(classifier.preprocessing.mean),
            "std": list(classifier.preprocessing.std),
        }
    return specs


def peer_workers() -> int:
    """A worker a usable core, as uvicorn's docs size them and as our layout sizes ours."""
    return max(1, read_cores().usable)


@dataclass(frozen=True)
class PeerServer:
    url: str  # host:port
    pid: int  # uvicorn's parent process: its workers are its children (CPU and memory figures)


@contextlib.contextmanager
def peer_server(repository: Path, presets: list[str], workers: int | None = None) -> Iterator[PeerServer]:
    from tritonstack.benchmark.peer_service import MODELS_ENV  # needs the peer extra

    workers = workers or peer_workers()
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "tritonstack.benchmark.peer_service:app"]
    command += ["--host", LOOPBACK, "--port", str(port), "--workers", str(workers), "--no-access-log"]
    environment = os.environ | {MODELS_ENV: json.dumps(model_specs(repository, presets))}
    with tempfile.NamedTemporaryFile(prefix="peer-", suffix=".log") as log:
        peer = process.spawn(command, environment, Path(log.name))
        try:
            url = f"{LOOPBACK}:{port}"
            try:
                process.wait_ready(peer, lambda: answers(url), READY_TIMEOUT_S, lambda: False)
            except process.NotReady as error:
                raise RuntimeError(f"the peer service did not start: {Path(log.name).read_text()[-2000:]}") from error
            yield PeerServer(url, peer.pid)
        finally:
            process.interrupt(peer, grace_s=10.0)
            process.kill_group(peer)  # what is left: the workers, whatever their parent did


def answers(url: str) -> bool:
    """A worker has loaded its models (it answers /ready only then); the others
    finish within the warm-up every measure starts with."""
    try:
        with urllib.request.urlopen(f"http://{url}/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
