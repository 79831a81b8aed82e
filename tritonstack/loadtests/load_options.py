"""The load test's options, declared once: `tritonstack loadtest` parses them and hands
them on to every Locust process it starts (cli.to_argv); the Locust master and workers,
the Helm chart's pods included, parse the same declarations (locustfile.py). Where the
load goes (the server's addresses) is each side's own: the command finds or starts a
server, Locust takes --host and --grpc-url."""

from __future__ import annotations

from dataclasses import dataclass

from tritonstack import cli
from tritonstack.contract import DEFAULT_AUDIO_MODEL, DEFAULT_MODEL, DEFAULT_REGIONS_MODEL

DEFAULT_STEP_S = 10.0


@dataclass(frozen=True)
class LoadOptions:
    model: str = cli.option(DEFAULT_MODEL, "--model", help="the image classifier to load")
    boxes: int = cli.option(
        0,
        "--boxes",
        type=cli.non_negative_int,
        metavar="N",
        help=f"N random boxes with each image, to a regions model (default then: {DEFAULT_REGIONS_MODEL}); "
        "each answer must have a row per box (0: plain images)",
    )
    audio: bool = cli.option(
        False,
        "--audio",
        help=f"send the sample speech clip (15 s, as a WAV; tritonstack.samples.speech) to an audio model (default "
        f"then: {DEFAULT_AUDIO_MODEL}); each answer must hold its speech segments",
    )
    top_k: int = cli.option(1, "--top-k", type=cli.positive_int, help="classes asked back per image")
    corpus_seed: int = cli.option(0, "--corpus-seed", type=int, help="seed of the weighted image draw")
    deadline_ms: float = cli.option(
        0.0,
        "--deadline-ms",
        type=float,
        help="each request's deadline, sent to the server; the report then counts answered in time, refused, "
        "no answer in time and answered late apart, with the goodput (0: none)",
    )
    max_requests: int = cli.option(
        20000, "--max-requests", type=cli.positive_int, help="stop after this many requests, all workers together"
    )
    step_users: int = cli.option(2, "--step-users", type=cli.positive_int, help="step shape: users added per step")
    # None: fitted to --run-time by `tritonstack loadtest`, else DEFAULT_STEP_S.
    step_seconds: float | None = cli.option(
        None,
        "--step-seconds",
        type=float,
        metavar="S",
        help=f"step shape: duration of a step (default: --run-time / --steps, else {DEFAULT_STEP_S:.0f})",
    )
    steps: int = cli.option(4, "--steps", type=cli.positive_int, help="step shape: number of steps")
    target_rps: float = cli.option(
        20.0, "--target-rps", type=float, help="open shape: requests per second, fixed whatever the answers do"
    )
    open_loop_users: int = cli.option(
        4, "--open-loop-users", type=cli.positive_int, help="open shape: users sharing --target-rps"
    )
    max_in_flight: int = cli.option(
        64,
        "--max-in-flight",
        type=cli.positive_int,
        help="open shape: requests in flight per user; a send beyond it is counted as a failure",
    )
    live_seconds: float = cli.option(
        5.0, "--live-seconds", type=float, help="seconds between two lines of live figures on stderr (0: none)"
    )
