"""The locustfile: the load test's options (loadtests/load_options.py) and the run's
hooks; the users themselves are in loadtests/users.py (GrpcUser, HttpUser).

    python -m locust -f loadtests/locustfile.py --headless -u 4 -t 30s \
        --host http://127.0.0.1:8000 --grpc-url 127.0.0.1:8001 --model ensemble_dali_efficientnet_lite0

(`tritonstack loadtest` / `make loadtest` start a server, run this and write a report.)

Hooks: `--max-requests` bounds the run across workers; a line of live figures goes
to stderr every `--live-seconds`; the final stats table is written at quit; the
process exits before gRPC's teardown can hang under gevent.
"""

from __future__ import annotations

import atexit
import csv
import logging
import os
import sys
import time

import gevent
from locust import events
from locust.runners import STATE_STOPPED, STATE_STOPPING, WorkerRunner
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from tritonstack import cli
from tritonstack.loadtests.load_options import LoadOptions

# The users Locust runs: found here because they are imported here.
from tritonstack.loadtests.users import GrpcUser, HttpUser  # noqa: F401
from tritonstack.samples.corpus import build_corpus

# How often the request-count bound is checked: a run overshoots --max-requests by
# about this many seconds of requests.
CHECK_INTERVAL_S = 0.05


@events.init_command_line_parser.add_listener
def _options(parser):
    group = parser.add_argument_group("Triton")
    group.add_argument("--grpc-url", default="127.0.0.1:8001", help="host:port of Triton's gRPC endpoint")
    cli.add_options(group, LoadOptions)


@events.init.add_listener
def _build_corpus_before_the_run(**_):
    """The corpus takes seconds of re-encoding, and blocks gevent's loop meanwhile:
    built when the process starts, it no longer eats the first seconds of the run
    time (a 2 s run could end before its user's first request). Then the loop's
    cached clock is brought up to date: Locust's run-time timer counts from it."""
    build_corpus()
    gevent.get_hub().loop.update_now()


@events.test_start.add_listener
def _bound_request_count(environment, **_):
    """Stop the whole run (all workers) once --max-requests requests were made."""
    limit = environment.parsed_options.max_requests if environment.parsed_options else 0
    if not limit or environment.runner is None or _is_worker(environment):
        return

    def watch():
        while environment.runner.state not in (STATE_STOPPED, STATE_STOPPING):
            if environment.runner.stats.total.num_requests >= limit:
                environment.runner.quit()
                return
            gevent.sleep(CHECK_INTERVAL_S)

    gevent.spawn(watch)


@events.test_start.add_listener
def _print_live_figures(environment, **_):
    """One plain line every few seconds (no redrawn frames: it may go to a log)."""
    options = environment.parsed_options
    if not options or options.live_seconds <= 0 or environment.runner is None or _is_worker(environment):
        return
    started = time.monotonic()

    def report():
        counted = 0
        while environment.runner.state not in (STATE_STOPPED, STATE_STOPPING):
            gevent.sleep(options.live_seconds)
            line = live_line(environment.runner, time.monotonic() - started, counted, options.live_seconds)
            print(line, file=sys.stderr, flush=True)
            counted = environment.runner.stats.total.num_requests

    gevent.spawn(report)


def live_line(runner, elapsed_s: float, counted_before: int, interval_s: float) -> str:
    total = runner.stats.total
    rate = (total.num_requests - counted_before) / interval_s
    p50, p95 = (total.get_current_response_time_percentile(q) for q in (0.5, 0.95))
    latency = (
        "no answer yet"
        if p50 is None or p95 is None or not total.num_requests
        else f"p50 {p50:.0f} ms, p95 {p95:.0f} ms over the last 10 s"
    )
    return (
        f"[{elapsed_s:4.0f} s] {runner.user_count} users, {total.num_requests} requests "
        f"({rate:.1f}/s over the last {interval_s:g} s), {total.num_failures} failed, {latency}"
    )


@events.init.add_listener
def _write_final_stats_at_quit(environment, **_):
    """Locust's `_stats.csv` is rewritten every few seconds and not after the last
    answers arrive: write the final table as `<csv prefix>_final_stats.csv`."""
    options = environment.parsed_options
    if not options or not options.csv_prefix or _is_worker(environment):
        return

    def write(**_):  # the quit event tells only the exit code
        table = StatsCSV(environment, PERCENTILES_TO_REPORT)
        with open(f"{options.csv_prefix}_final_stats.csv", "w", newline="") as handle:
            table.requests_csv(csv.writer(handle))
        # The same for the failures: a run shorter than Locust's write interval (a
        # --max-requests bound reached early) would leave its failures file empty.
        with open(f"{options.csv_prefix}_failures.csv", "w", newline="") as handle:
            table.failures_csv(csv.writer(handle))

    environment.events.quit.add_listener(write)


@events.quit.add_listener
def _exit_before_grpc_teardown(exit_code, **_):
    """With gRPC driven by gevent, interpreter teardown sometimes blocks forever
    (gRPC's exit hooks wait on a loop nobody drives any more), after the run is
    over and every file is written. Registered last, this exit hook runs first:
    flush and leave with Locust's exit code."""
    atexit.register(_exit_now, exit_code)


def _exit_now(exit_code: int) -> None:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def _is_worker(environment) -> bool:
    return isinstance(environment.runner, WorkerRunner)
