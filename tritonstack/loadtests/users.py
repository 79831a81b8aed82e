"""Locust users for a Triton image classifier: gRPC and HTTP, closed or open loop.
Each user owns one client; timing and reporting happen in one place
(`TritonUser.report`, or Locust's own request hooks for HTTP).

- `GrpcUser`: tritonclient.grpc (through tritonstack's ClassifierClient), with
  gRPC set up for gevent.
- `HttpUser`: Locust's FastHttpUser posting KServe v2 binary-tensor bodies (a JSON
  header, its length in `Inference-Header-Content-Length`, then the raw bytes), built
  and parsed by tritonclient.http's own encoder.
Each request is one image drawn from a weighted corpus of real photos
(tritonstack/samples/corpus.py) and is reported to Locust with its real outcome: a non-2xx
answer or a response without the expected output is a failure. With `--boxes N`, the
image goes with N random boxes of it to a regions model, and the answer must have a
row per box. With `--audio`, each request is the sample speech clip to an audio model,
and the answer must hold the clip's speech segments (tritonstack.samples.speech).

Closed loop (default): each user sends its next request when the previous answer
arrives. Open loop (the shape of loadtests/shape_constant_rate.py, at `--target-rps`): each
user sends on a fixed schedule whatever the answers do, and latency is measured
from the scheduled send time, so a stalled server shows as latency instead of
silently lowering the offered load (coordinated omission).

With `--deadline-ms`, every request carries that deadline to the server (its
`timeout`), and an outcome other than an answer in time is reported as a failure of
its own kind, so that Locust's failure table counts them apart: `Refused` (the
server's queue was full, or the deadline passed while queued: an answer at once
that says "not now"), `DeadlineExceeded` (no answer before the deadline) and
`AnsweredLate` (an answer after it); anything else is a real failure. Goodput is
then the successes per second (the report's summary says it).

The options they read (`--model`, `--target-rps`, ...) are declared in
loadtests/load_options.py (`--grpc-url` in loadtests/locustfile.py).
"""

from __future__ import annotations

import os
import time

import gevent
import gevent.pool
import grpc.experimental.gevent
import numpy as np
import tritonclient.http as httpclient
from locust import User, task
from locust.contrib.fasthttp import FastHttpUser
from locust.exception import StopUser
from locust.user.task import LOCUST_STATE_STOPPING
from tritonclient.utils import InferenceServerException

from tritonstack.address import parse_address
from tritonstack.client.classifier import ClassifierClient
from tritonstack.client.protocol import request_deadline_options
from tritonstack.client.retry import NO_RETRY, describe_error, is_expired, is_refusal, is_timeout
from tritonstack.contract import (
    DEFAULT_AUDIO_MODEL,
    DEFAULT_MODEL,
    DEFAULT_REGIONS_MODEL,
    ENSEMBLE_BOXES,
    ENSEMBLE_SEGMENTS,
    SEGMENT_WIDTH,
    boxes_array,
    pad_batch,
)
from tritonstack.media.regions import oriented_size, random_boxes
from tritonstack.samples.corpus import WeightedSampler, build_corpus

# gRPC's C core must cooperate with gevent's loop (Locust monkey-patched the
# standard library on import); this must run before any channel exists.
grpc.experimental.gevent.init_gevent()

REQUEST_TYPE_GRPC = "grpc"
REQUEST_TYPE_HTTP = "http"
REQUEST_TIMEOUT_S = 30.0


class Refused(Exception):
    """The server said "not now" (HTTP 503 / gRPC UNAVAILABLE from its queue policy)."""


class DeadlineExceeded(Exception):
    """No answer before the request's deadline: the client gave up."""


class AnsweredLate(Exception):
    """An answer, after the request's deadline: nobody waited for it any more."""


def deadline_outcome(error: BaseException | None, latency_s: float, deadline_s: float | None):
    """The exception to report for a request's outcome (None: answered in time)."""
    if error is None:
        return AnsweredLate(f"answered after {latency_s:.2f} s") if deadline_s and latency_s > deadline_s else None
    if is_refusal(error) or is_expired(error):
        return Refused(describe_error(error))
    if deadline_s and is_timeout(error):
        return DeadlineExceeded(f"no answer within {deadline_s:g} s")
    return error


class TritonUser(User):
    """What both protocols share: the image draw, closed or open loop, reporting."""

    abstract = True
    request_type = ""

    def on_start(self):
        options = self.environment.parsed_options
        self.boxes = getattr(options, "boxes", 0)
        self.audio = getattr(options, "audio", False)
        self.model = options.model
        if options.model == DEFAULT_MODEL and (self.boxes or self.audio):
            self.model = DEFAULT_AUDIO_MODEL if self.audio else DEFAULT_REGIONS_MODEL
        self.top_k = options.top_k
        # Each user its own seed: users draw different sequences of the same mix.
        self.sampler = WeightedSampler(build_corpus(), seed=options.corpus_seed * 7919 + id(self))
        self.box_rng = np.random.default_rng(options.corpus_seed * 7919 + id(self))
        self.deadline_s = options.deadline_ms / 1000 if options.deadline_ms > 0 else None
        self.pool = gevent.pool.Pool(options.max_in_flight)
        self.connect()

    def on_stop(self):
        self.pool.join(timeout=5)
        self.pool.kill()
        self.close()

    @task
    def infer(self):
        options = self.environment.parsed_options
        if getattr(self.environment.shape_class, "open_loop", False):
            self.open_loop(options.target_rps / options.open_loop_users)
        else:
            self.send(time.perf_counter())

    def open_loop(self, user_rps: float):
        """Send at fixed intervals until the user is stopped; never wait for answers.
        Requests in flight at the stop get `--stop-timeout` to finish (on_stop)."""
        interval = 1.0 / user_rps
        scheduled = time.perf_counter() + interval * (os.getpid() % 97 + id(self) % 89) / 186
        while self._state != LOCUST_STATE_STOPPING:  # a graceful stop ends the schedule
            delay = scheduled - time.perf_counter()
            if delay > 0:
                gevent.sleep(delay)
            if self.pool.full():
                self.report(
                    scheduled,
                    0,
                    RuntimeError(
                        f"open loop: {self.pool.size} requests already in flight; the server is not keeping up"
                    ),
                )
            else:
                self.pool.spawn(self.send, scheduled)
            scheduled += interval

    def send(self, started: float):
        raise NotImplementedError

    def draw_boxes(self, image: bytes) -> np.ndarray:
        """`--boxes` random boxes of the image (none without the option)."""
        return boxes_array(random_boxes(oriented_size(image), self.boxes, self.box_rng) if self.boxes else [])

    @property
    def rows_per_answer(self) -> int:
        return self.boxes or 1

    def speech(self) -> tuple[bytes, int]:
        """The sample clip and the speech segments its answer must hold."""
        from tritonstack.samples.speech import sample_track, wav_bytes

        # A WAV written here: ffmpeg, which the other encodings need, aborts under gevent.
        if not hasattr(self, "_speech"):
            track = sample_track()
            self._speech = wav_bytes(track.samples), len(track.speech_spans)
        return self._speech

    def report(self, started: float, length: int, exception: Exception | None, name: str | None = None):
        self.environment.events.request.fire(
            request_type=self.request_type,
            name=name or self.model,
            response_time=(time.perf_counter() - started) * 1000,
            response_length=length,
            exception=exception,
            context={},
        )

    def connect(self):
        raise NotImplementedError

    def close(self):
        raise NotImplementedError


class GrpcUser(TritonUser):
    request_type = REQUEST_TYPE_GRPC

    def connect(self):
        try:
            self.client = ClassifierClient(
                self.environment.parsed_options.grpc_url,
                "grpc",
                self.model,
                retry=NO_RETRY,
                timeout_s=self.deadline_s or REQUEST_TIMEOUT_S,
                throttle_ratio=0,  # a load test offers the load it is told, refused or not
            )
        except (InferenceServerException, ConnectionError) as error:
            self.report(time.perf_counter(), 0, error, name="connect")
            raise StopUser() from error

    def send(self, started: float):
        if self.audio:
            self.send_speech(started)
            return
        image = self.sampler.draw()
        try:
            if self.boxes:
                top = self.client.classify_regions(image.data, self.draw_boxes(image.data), top_k=self.top_k)
            else:
                top = self.client.classify([image.data], top_k=self.top_k)
        except InferenceServerException as error:
            self.report(started, 0, deadline_outcome(error, time.perf_counter() - started, self.deadline_s))
            return
        expected = self.rows_per_answer
        wrong = None if len(top) == expected else ValueError(f"{len(top)} answers for {expected} rows")
        late = deadline_outcome(None, time.perf_counter() - started, self.deadline_s)
        self.report(started, len(image.data), wrong or late)

    def send_speech(self, started: float):
        clip, segments = self.speech()
        try:
            (answer,) = self.client.classify_audio([clip])
        except InferenceServerException as error:
            self.report(started, 0, deadline_outcome(error, time.perf_counter() - started, self.deadline_s))
            return
        found = len(answer.segments)
        wrong = None if found == segments else ValueError(f"{found} speech segments, the clip has {segments}")
        self.report(started, len(clip), wrong or deadline_outcome(None, time.perf_counter() - started, self.deadline_s))

    def close(self):
        client = getattr(self, "client", None)
        if client is not None:
            # An open channel keeps gRPC's threads alive: the process would not exit.
            client.close()


class HttpUser(TritonUser, FastHttpUser):
    request_type = REQUEST_TYPE_HTTP
    abstract = False
    network_timeout = REQUEST_TIMEOUT_S

    def __init__(self, environment):
        # Read by FastHttpUser when it makes its client: with a deadline, stop waiting then.
        deadline_ms = getattr(environment.parsed_options, "deadline_ms", 0) if environment.parsed_options else 0
        if deadline_ms > 0:
            self.network_timeout = deadline_ms / 1000
        super().__init__(environment)

    def connect(self):
        # Asked outside Locust's client: a metadata GET is not a request under
        # test, and would skew the aggregate figures.
        try:
            with httpclient.InferenceServerClient(parse_address(self.host).hostport) as client:
                metadata = client.get_model_metadata(self.model)
        except (InferenceServerException, ConnectionError) as error:
            self.report(time.perf_counter(), 0, error, name="connect")
            raise StopUser() from error
        self.input_name = next(t["name"] for t in metadata["inputs"] if t["name"] != ENSEMBLE_BOXES)
        self.output_name = metadata["outputs"][0]["name"]

    def send(self, started: float):
        payload = self.speech()[0] if self.audio else self.sampler.draw().data
        body, header_length = self.binary_request(payload)
        with self.client.post(
            f"/v2/models/{self.model}/infer",
            data=body,
            headers={
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(header_length),
            },
            name=self.model,
            catch_response=True,
        ) as response:
            # Latency from the scheduled send (open loop) or the call (closed loop).
            latency_s = time.perf_counter() - started
            response.request_meta["response_time"] = latency_s * 1000
            response.request_meta["request_type"] = self.request_type
            if response.status_code == 200:
                self.check(response, latency_s)
            elif response.status_code == 503 and self.deadline_s:
                response.failure(Refused(f"503: {response.text[:200]}"))
            elif response.status_code == 0 and self.deadline_s:  # no answer: the client's timeout
                response.failure(DeadlineExceeded(f"no answer within {self.deadline_s:g} s"))
            # Any other status is already a failure (4xx included).

    def binary_request(self, image: bytes) -> tuple[bytes, int]:
        """One image (its boxes with --boxes) or, with --audio, one clip."""
        batch = pad_batch([image])
        tensor = httpclient.InferInput(self.input_name, list(batch.shape), "UINT8")
        tensor.set_data_from_numpy(batch, binary_data=True)
        tensors = [tensor]
        if self.boxes:
            boxes = self.draw_boxes(image)[None]
            tensors.append(httpclient.InferInput(ENSEMBLE_BOXES, list(boxes.shape), "FP32"))
            tensors[-1].set_data_from_numpy(boxes, binary_data=True)
        if self.audio:
            output = httpclient.InferRequestedOutput(ENSEMBLE_SEGMENTS, binary_data=True)
        else:
            output = httpclient.InferRequestedOutput(self.output_name, binary_data=True, class_count=self.top_k)
        timeout = request_deadline_options("http", self.deadline_s).get("timeout")
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            tensors, outputs=[output], timeout=timeout
        )
        return body, json_size

    def check(self, response, latency_s: float):
        header = response.headers.get("Inference-Header-Content-Length")
        try:
            result = httpclient.InferenceServerClient.parse_response_body(
                response.content, header_length=int(header) if header else None
            )
            top = result.as_numpy(ENSEMBLE_SEGMENTS if self.audio else self.output_name)
        except Exception as error:  # a malformed answer is the server's failure
            response.failure(f"unreadable response: {error}")
            return
        if self.audio:
            expected = (1, self.speech()[1], SEGMENT_WIDTH)
            if top is None or top.shape != expected:
                response.failure(f"expected {ENSEMBLE_SEGMENTS} of shape {expected}")
            elif late := deadline_outcome(None, latency_s, self.deadline_s):
                response.failure(late)
            return
        if top is None or top.shape != (self.rows_per_answer, self.top_k):
            response.failure(f"expected {self.output_name} of shape ({self.rows_per_answer}, {self.top_k})")
        elif late := deadline_outcome(None, latency_s, self.deadline_s):
            response.failure(late)

    def close(self):
        pass
