"""A folder classification run while the server restarts: the server is stopped
mid-run and a new one starts on the same ports. Retries with backoff carry every
request over; every input file ends with exactly one line, a result (or, for the
broken file, its error)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from PIL import Image

from tests.conftest import TEST_STOP_GRACE_S
from tritonstack.contract import DEFAULT_MODEL
from tritonstack.samples.photos import photo_path
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.network import free_port
from tritonstack.serve.server_config import ServerConfig

# Enough that the run is still sending when the first server stops after LINES_BEFORE_STOP
# lines, and that most of it is left for the second server.
IMAGES = 200
LINES_BEFORE_STOP = 20
# Triton keeps serving for its exit timeout while requests keep coming: with any
# grace the first server could finish the whole folder before it exits. With none,
# it exits at once and requests in flight fail over to the new server by retrying.
FIRST_SERVER_GRACE_S = 0


@pytest.fixture(scope="module")
def many_images(tmp_path_factory) -> Path:
    """Small JPEGs of known photos (quick to send, same work for the server) and one broken file."""
    root = tmp_path_factory.mktemp("many")
    encoded = {}
    for name in ("chelsea.png", "coffee.png", "rocket.jpg"):
        image = Image.open(photo_path(name)).convert("RGB")
        image.thumbnail((256, 256))
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=90)
        encoded[name] = buffer.getvalue()
    for n in range(IMAGES):
        name = list(encoded)[n % len(encoded)]
        (root / f"{n:04d}_{Path(name).stem}.jpg").write_bytes(encoded[name])
    (root / "broken.jpg").write_bytes(b"\xff\xd8\xff broken")
    return root


class LineReader:
    """Collects a process's stdout lines as they come."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)

    def wait_for(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.lines) < count and time.monotonic() < deadline:
            time.sleep(0.01)

    def join(self) -> None:
        self._thread.join(timeout=10)


def successful_inferences(server: TritonServer) -> int:
    client = httpclient.InferenceServerClient(server.http_url)
    statistics = client.get_inference_statistics(DEFAULT_MODEL, headers=server.admin_headers("http"))
    return int(statistics["model_stats"][0]["inference_stats"]["success"]["count"])


def start_folder_run(folder: Path, url: str, protocol: str, admin_key: str, options: list[str], stderr_path: Path):
    """`tritonstack classify` on the folder, its results as JSON lines on stdout."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tritonstack",
            "classify",
            str(folder),
            "--url",
            url,
            "--protocol",
            protocol,
            "--format",
            "jsonl",
            "--top-k",
            "1",
            "--retries",
            # About a minute of backoff: the second server's start took longer than
            # the ~30 s of 12 retries on a machine busy with other suites.
            "20",
            f"--admin-key={admin_key}",
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=stderr_path.open("w"),
        text=True,
    )


def answers_per_photo(results: list[dict]) -> dict[str, set[str]]:
    """The top labels each photo's copies got."""
    answers: dict[str, set[str]] = {}
    for result in results:
        if "top" in result:
            photo = Path(result["path"]).stem.split("_", 1)[1]
            answers.setdefault(photo, set()).add(result["top"][0]["label"])
    return answers


# Both folder runs at once, across the same restart: one pair of servers for the two.
RUNS = {
    "http": ["--concurrency", "2", "--batch-size", "2"],
    "grpc": ["--async", "--concurrency", "2", "--shm", "system"],
}


def test_folder_runs_over_http_and_grpc_survive_a_server_restart(lite0_repository, many_images, tmp_path):
    ports = {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port()}
    first = TritonServer(ServerConfig(lite0_repository, stop_grace_s=FIRST_SERVER_GRACE_S, **ports)).start()
    second = None
    urls = {"http": first.http_url, "grpc": first.grpc_url}
    runs = {}
    try:
        for protocol, options in RUNS.items():
            stderr_path = tmp_path / f"stderr-{protocol}.txt"
            process = start_folder_run(many_images, urls[protocol], protocol, first.admin_key, options, stderr_path)
            runs[protocol] = (process, LineReader(process.stdout), stderr_path)
        for _, reader, _ in runs.values():
            reader.wait_for(LINES_BEFORE_STOP, timeout_s=60)
        first.stop()
        second = TritonServer(
            ServerConfig(lite0_repository, stop_grace_s=TEST_STOP_GRACE_S, admin_key=first.admin_key, **ports)
        ).start()
        # The first server is gone: each run still had photos to send, which only the second can answer.
        left = {protocol: IMAGES + 1 - len(reader.lines) for protocol, (_, reader, _) in runs.items()}
        for process, reader, _ in runs.values():
            process.wait(timeout=120)
            reader.join()
        served_by_second = successful_inferences(second)
    finally:
        for process, _, _ in runs.values():
            process.kill()
        first.stop()
        if second is not None:
            second.stop()

    for protocol, (process, reader, stderr_path) in runs.items():
        assert left[protocol] >= 2, (protocol, left)  # two files or more: one a photo, the broken one aside
        check_folder_run(many_images, process, reader, stderr_path.read_text())
    # The runs really crossed the restart: the new server did part of the work.
    assert served_by_second > 0


def check_folder_run(many_images: Path, process, reader: LineReader, stderr: str) -> None:
    """Every file got exactly one line, only the broken one an error, the same answer for every copy."""
    results = [json.loads(line) for line in reader.lines]
    paths = [Path(result["path"]).name for result in results]
    assert len(paths) == len(set(paths)) == IMAGES + 1, f"lost or duplicated files:\n{stderr[-3000:]}"
    assert set(paths) == {path.name for path in many_images.iterdir()}
    failed = [result for result in results if "error" in result]
    assert [Path(result["path"]).name for result in failed] == ["broken.jpg"], failed[:3]
    # Every copy of a photo gets the same answer, before, during and after the restart.
    answers = answers_per_photo(results)
    assert answers["coffee"] == {"espresso"}, answers
    assert [len(labels) for labels in answers.values()] == [1, 1, 1], answers
    assert process.returncode == 1, stderr
    assert f"{IMAGES + 1} files, 1 failed" in stderr
