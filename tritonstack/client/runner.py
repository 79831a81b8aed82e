"""Classify many files: batches of images per request, several requests in
flight (threads with one sync client each, or one asyncio client), one result
per file in the files' order, whatever fails. Clips go to the video model and
audio to the audio model, in batches of their own (a batch holds one kind).

    settings = RunSettings(url="127.0.0.1:8001", protocol="grpc", concurrency=4)
    for result in classify_files(files, settings):
        print(result.path, result.top or result.error)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from tritonstack import cli
from tritonstack.client.aio import AsyncClassifierClient
from tritonstack.client.classifier import ClassifierClient
from tritonstack.client.images import media_kind
from tritonstack.client.protocol import SHM_MODES, ClipPredictions, Prediction, Segment, SpeechSegments
from tritonstack.client.retry import RetryPolicy, describe_error
from tritonstack.contract import DEFAULT_AUDIO_MODEL, DEFAULT_MODEL, DEFAULT_VIDEO_MODEL, ENSEMBLE_SEGMENTS


@dataclass(frozen=True)
class RunSettings:
    """Each field with a flag is a `tritonstack classify` option (tritonstack.cli); the
    server's address, protocol and headers are the caller's."""

    url: str
    protocol: str = "http"
    model: str = cli.option(
        DEFAULT_MODEL,
        "--model",
        help=f"the model for photos, or for clips when it is a video model (default: {DEFAULT_MODEL})",
    )
    video_model: str = cli.option(  # for clips
        DEFAULT_VIDEO_MODEL, "--video-model", help="the model for clips, unless --model is a video model"
    )
    audio_model: str = cli.option(  # for audio
        DEFAULT_AUDIO_MODEL, "--audio-model", help="the model for audio, unless --model is an audio model"
    )
    # A clip's frames' rankings; audio: each 32 ms frame's speech probability too.
    frame_probabilities: bool = cli.option(
        False,
        "--per-frame",
        help="a clip's frames' rankings too, a line each; an audio file's frames' speech probabilities (jsonl)",
    )
    top_k: int = cli.option(5, "--top-k", type=cli.positive_int, help="classes shown per image")
    batch_size: int = cli.option(1, "--batch-size", type=cli.positive_int, help="images per request")
    concurrency: int = cli.option(1, "--concurrency", type=cli.positive_int, help="requests in flight")
    shm: str = cli.option("none", "--shm", choices=SHM_MODES, help="send and receive tensors in shared memory")
    use_async: bool = cli.option(False, "--async", help="asyncio client instead of threads")
    timeout_s: float | None = cli.option(
        None,
        "--timeout",
        type=float,
        metavar="S",
        help="per-request deadline in seconds: the client stops waiting then, and the server "
        "refuses the request if it is still queued",
    )
    retry: RetryPolicy = cli.nested(RetryPolicy, default_factory=RetryPolicy)
    headers: dict[str, str] | None = None  # e.g. tritonstack.contract.admin_headers() for shared memory

    def client_options(self) -> dict:
        # A folder run would rather wait than be refused (batch priority).
        return {
            "timeout_s": self.timeout_s,
            "retry": self.retry,
            "shm": self.shm,
            "headers": self.headers,
            "batch": True,
        }

    def model_for(self, kind: str) -> str:
        """The model for a media kind (tritonstack.client.images.media_kind)."""
        return {"clip": self.video_model, "audio": self.audio_model}.get(kind, self.model)

    def models_for(self, files: Sequence[Path]) -> list[str]:
        """The models these files need, each once: clips the video model, audio the
        audio model, images the other."""
        return list(dict.fromkeys(self.model_for(media_kind(path)) for path in files))


@dataclass(frozen=True)
class FileResult:
    path: Path
    top: list[Prediction] | None = None  # a clip's: of its frames' mean probabilities
    error: str | None = None
    frames: list[list[Prediction]] | None = None  # a clip's, each frame's ranking
    segments: list[Segment] | None = None  # an audio file's speech segments
    frame_probabilities: list[float] | None = None  # an audio file's, when asked


def read_image(path: Path) -> bytes:
    data = path.read_bytes()
    if not data:
        raise ValueError("empty file")
    return data


def _batches(files: Sequence[Path], size: int) -> list[list[Path]]:
    """Runs of consecutive files of one kind (images, clips or audio), cut into batches."""
    batches = []
    for _, run in itertools.groupby(files, key=media_kind):
        run = list(run)
        batches += [run[start : start + size] for start in range(0, len(run), size)]
    return batches


class _Batch:
    """The files of one request: unreadable ones fail here, the others go to the
    server together."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.kind = media_kind(paths[0])
        self.results: dict[int, FileResult] = {}
        self.readable: list[tuple[int, bytes]] = []
        for position, path in enumerate(paths):
            try:
                self.readable.append((position, read_image(path)))
            except (OSError, ValueError) as error:
                self.results[position] = FileResult(path, error=f"unreadable: {describe_error(error)}")

    @property
    def images(self) -> list[bytes]:
        return [data for _, data in self.readable]

    def classify(self, client, settings: RunSettings):
        """The outcomes from a client of this batch's model (awaitable from the asyncio one):
        an audio classifier (bring your own) ranks a clip's labels as an image's."""
        if self.kind == "audio" and client.info.output_name == ENSEMBLE_SEGMENTS:  # speech segments
            return client.classify_audio_each(self.images, settings.frame_probabilities)
        if self.kind == "clip":
            return client.classify_clips_each(self.images, settings.top_k)
        return client.classify_each(self.images, settings.top_k)

    def finish(self, outcomes: list, settings: RunSettings) -> list[FileResult]:
        for (position, _), outcome in zip(self.readable, outcomes):
            path = self.paths[position]
            if isinstance(outcome, Exception):
                self.results[position] = FileResult(path, error=describe_error(outcome, settings.timeout_s))
            elif isinstance(outcome, ClipPredictions):
                self.results[position] = FileResult(path, top=outcome.top, frames=outcome.frames)
            elif isinstance(outcome, SpeechSegments):
                probabilities = outcome.frame_probabilities
                self.results[position] = FileResult(
                    path,
                    segments=outcome.segments,
                    frame_probabilities=None if probabilities is None else probabilities.tolist(),
                )
            else:
                self.results[position] = FileResult(path, top=outcome)
        return [self.results[position] for position in range(len(self.paths))]


def classify_files(files: Sequence[Path], settings: RunSettings) -> Iterator[FileResult]:
    """One FileResult per file, in order. Raises ServerUnavailableError before
    the first result when no server answers."""
    if settings.use_async:
        yield from _classify_files_async(files, settings)
    else:
        yield from _classify_files_threads(files, settings)


def _classify_files_threads(files: Sequence[Path], settings: RunSettings) -> Iterator[FileResult]:
    """Worker threads, each with its own sync client (the HTTP one is bound to
    the thread that made it), take batches from a queue; results are handed
    back in the batches' order."""
    for model in settings.models_for(files):
        ClassifierClient(settings.url, settings.protocol, model, **settings.client_options()).close()
    batches = _batches(files, settings.batch_size)
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    for job in enumerate(batches):
        jobs.put(job)
    finished: queue.SimpleQueue = queue.SimpleQueue()

    workers = [
        threading.Thread(target=_work, args=(jobs, finished, settings), name=f"classify-{n}", daemon=True)
        for n in range(settings.concurrency)
    ]
    for worker in workers:
        worker.start()
    arrived: dict[int, list[FileResult]] = {}
    try:
        for index in range(len(batches)):
            while index not in arrived:
                done_index, results = finished.get()
                arrived[done_index] = results
            yield from arrived.pop(index)
    finally:
        _drain(jobs)  # when the caller stops early: no new batch starts
        for _ in workers:
            jobs.put(None)
        for worker in workers:
            worker.join()


def _work(jobs: queue.SimpleQueue, finished: queue.SimpleQueue, settings: RunSettings) -> None:
    """A worker thread: batches from `jobs` until None, results to `finished`."""
    clients: dict[str, ClassifierClient] = {}  # by model
    try:
        while (job := jobs.get()) is not None:
            index, paths = job
            finished.put((index, _classify_batch(paths, clients, settings)))
    finally:
        for client in clients.values():
            client.close()


def _classify_batch(paths: list[Path], clients: dict[str, ClassifierClient], settings: RunSettings) -> list[FileResult]:
    try:
        batch = _Batch(paths)
        model = settings.model_for(batch.kind)
        if model not in clients:
            clients[model] = ClassifierClient(settings.url, settings.protocol, model, **settings.client_options())
        outcomes = batch.classify(clients[model], settings) if batch.readable else []
        return batch.finish(outcomes, settings)
    except Exception as error:  # e.g. no server for this worker: its files fail, explicitly
        return [FileResult(path, error=describe_error(error, settings.timeout_s)) for path in paths]


def _drain(jobs: queue.SimpleQueue) -> None:
    while True:
        try:
            jobs.get_nowait()
        except queue.Empty:
            return


def _classify_files_async(files: Sequence[Path], settings: RunSettings) -> Iterator[FileResult]:
    """The event loop runs in a thread of its own so that results reach the
    caller as they come, in order."""
    results: queue.SimpleQueue = queue.SimpleQueue()
    done = object()

    async def produce() -> None:
        async with contextlib.AsyncExitStack() as stack:
            clients = {
                model: await stack.enter_async_context(
                    AsyncClassifierClient(settings.url, settings.protocol, model, **settings.client_options())
                )
                for model in settings.models_for(files)
            }
            in_flight = asyncio.Semaphore(settings.concurrency)

            async def run(paths: list[Path]) -> list[FileResult]:
                async with in_flight:
                    batch = _Batch(paths)
                    client = clients[settings.model_for(batch.kind)]
                    outcomes = await batch.classify(client, settings) if batch.readable else []
                    return batch.finish(outcomes, settings)

            tasks = [asyncio.ensure_future(run(paths)) for paths in _batches(files, settings.batch_size)]
            try:
                for task in tasks:
                    results.put(await task)
            finally:
                for task in tasks:
                    task.cancel()

    def loop() -> None:
        try:
            asyncio.run(produce())
        except BaseException as error:  # handed to the caller's thread
            results.put(error)
        results.put(done)

    thread = threading.Thread(target=loop, name="classify-asyncio", daemon=True)
    thread.start()
    while (item := results.get()) is not done:
        if isinstance(item, BaseException):
            raise item
        yield from item
    thread.join()


class Progress:
    """Counts results, failures and the rate; a tqdm bar on stderr only when it
    is a terminal and there are more than a handful of files (a log gets no
    redrawn frames). Write stdout results through `above()` so that the bar
    steps aside for them instead of colliding."""

    def __init__(self, total: int, stream: TextIO | None = None, shown_above: int = 8):
        self.total = total
        self.stream = stream or sys.stderr
        self.done = 0
        self.failed = 0
        self.started = time.monotonic()
        visible = total > shown_above and _is_terminal(self.stream)
        self.bar = tqdm(
            total=total,
            unit="file",
            file=self.stream,
            disable=not visible,
            leave=False,
            dynamic_ncols=True,
            mininterval=0.1,
        )

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def rate(self) -> float:
        return self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def above(self):
        """A context in which the bar is cleared, to write a result line."""
        return contextlib.nullcontext() if self.bar.disable else self.bar.external_write_mode(file=self.stream)

    def update(self, result: FileResult) -> None:
        self.done += 1
        if result.error is not None:
            self.failed += 1
            self.bar.set_postfix_str(f"{self.failed} failed", refresh=False)
        self.bar.update()

    def summary(self) -> str:
        return f"{self.done} files, {self.failed} failed, {self.rate:.1f} files/s ({self.elapsed_s:.1f} s)"

    def close(self) -> None:
        self.bar.close()
        self.stream.write(self.summary() + "\n")
        self.stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False
