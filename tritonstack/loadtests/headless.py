"""Run a bounded, headless Locust load test and write a report folder.

    tritonstack loadtest                                  # starts its own server
    tritonstack loadtest --url 127.0.0.1:8000 --grpc-url 127.0.0.1:8001 \
        --metrics-url 127.0.0.1:8002 --shape open --target-rps 40
    tritonstack loadtest --workers 2                      # one master, 2 workers

The report folder gets Locust's CSV and HTML, `over_time.png`, `against_users.png`
and `summary.md` (requests, server-side breakdown per model, load generator CPU).
Every run is bounded in users, duration (--run-time, whatever the shape) and
request count, and talks to loopback unless told otherwise. Before any user
starts, the server and the model must answer (else exit 2, no report); during the
run a line of live figures goes to stderr every few seconds.

Exit codes: 0 no request failed, 1 some failed, 2 nothing ran (bad options, no
server, unknown model), 3 Locust had to be killed.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tritonstack import cli
from tritonstack.client.preflight import ModelError, check_model
from tritonstack.client.retry import RetryPolicy
from tritonstack.contract import admin_headers
from tritonstack.loadtests.load_options import DEFAULT_STEP_S, LoadOptions
from tritonstack.loadtests.report import GeneratorCpu
from tritonstack.serve.network import LOOPBACK, free_port

LOADTESTS = Path(__file__).resolve().parent
SHAPE_FILES = {
    "closed": [],
    "step": [LOADTESTS / "shape_step_ramp.py"],
    "open": [LOADTESTS / "shape_constant_rate.py"],
}
USER_CLASSES = {"grpc": ["GrpcUser"], "http": ["HttpUser"], "both": ["GrpcUser", "HttpUser"]}
# Beyond the planned duration, how long Locust gets to stop by itself before it is killed.
STOP_GRACE_S = 30.0
WORKER_CONNECT_S = 60
DEFAULT_RUN_TIME_S = 40.0
MIN_STEP_S = 1.0  # Locust's history has one row a second


@dataclasses.dataclass(frozen=True)
class LoadtestOptions(cli.ServerEndpoints, cli.RepositoryOption):
    """The repository is served when no --url is given; the metrics endpoint gives the
    server-side breakdown. `load` is what every Locust process parses too."""

    load: LoadOptions = cli.nested(LoadOptions, default_factory=LoadOptions)
    user: str = cli.option("grpc", "--user", choices=sorted(USER_CLASSES), help="protocol of the users")
    shape: str = cli.option(
        "step",
        "--shape",
        choices=sorted(SHAPE_FILES),
        help="closed: --users at once; step: a ramp of --steps; open: --target-rps fixed",
    )
    users: int = cli.option(4, "--users", type=cli.positive_int, help="closed shape: users")
    # None: DEFAULT_RUN_TIME_S, or the step shape's steps (fit_run_time).
    run_time: float | None = cli.option(
        None,
        "--run-time",
        type=float,
        metavar="S",
        help=f"seconds, every shape (default: {DEFAULT_RUN_TIME_S:.0f}; step shape: --steps x --step-seconds)",
    )
    workers: int = cli.option(0, "--workers", type=int, help="distributed: Locust worker processes (0: one process)")
    skip_preflight: bool = cli.option(
        False,
        "--skip-preflight",
        help="start the users even when the model does not classify encoded images (to load-test the error path)",
    )
    out: Path | None = cli.out_option(help="report folder (default: reports/loadtest-<time>)")


def fit_run_time(options: LoadtestOptions) -> LoadtestOptions:
    """--run-time bounds every shape: the step shape fits its steps into it (or
    refuses); without it, the steps set the duration."""
    run_time, step_seconds, steps = options.run_time, options.load.step_seconds, options.load.steps
    if run_time is not None and run_time <= 0:
        raise ValueError(f"--run-time must be above 0, not {run_time:g}")
    if options.shape != "step":
        return _with_times(options, run_time or DEFAULT_RUN_TIME_S, step_seconds or DEFAULT_STEP_S)
    if step_seconds is None:
        step_seconds = run_time / steps if run_time else DEFAULT_STEP_S
    if step_seconds < MIN_STEP_S:
        raise ValueError(
            f"a step of {step_seconds:.2g} s is shorter than {MIN_STEP_S:g} s (Locust records "
            "one row a second): fewer --steps or a longer --run-time"
        )
    planned = steps * step_seconds
    if run_time is not None and planned > run_time + 1e-6:
        raise ValueError(
            f"{steps} steps of {step_seconds:g} s take {planned:g} s, more than "
            f"--run-time {run_time:g}: drop --step-seconds (the steps then share the run "
            "time), give fewer --steps, or a longer --run-time"
        )
    return _with_times(options, planned if run_time is None else run_time, step_seconds)


def _with_times(options: LoadtestOptions, run_time: float, step_seconds: float) -> LoadtestOptions:
    load = dataclasses.replace(options.load, step_seconds=step_seconds)
    return dataclasses.replace(options, run_time=run_time, load=load)


def protocols(user: str) -> tuple[str, ...]:
    return ("grpc", "http") if user == "both" else (user,)


def preflight(options: LoadtestOptions, http_url: str, grpc_url: str) -> None:
    """The server answers and serves the model, for each protocol the users
    speak: else exit 2 before any user starts and before any report is written
    (--skip-preflight: the server must answer, whatever the model)."""
    load = options.load
    for protocol in protocols(options.user):
        url = grpc_url if protocol == "grpc" else http_url
        try:
            check_model(url, protocol, load.model, admin_headers(protocol), RetryPolicy(retries=1), bool(load.boxes))
        except ModelError:
            if not options.skip_preflight:
                raise


def host_option(options: LoadtestOptions, http_url: str, grpc_url: str) -> str:
    """What Locust's report shows as the host: the endpoint the users really talk to."""
    return f"grpc://{grpc_url}" if options.user == "grpc" else f"http://{http_url}"


def shared_options(options: LoadtestOptions, grpc_url: str) -> list[str]:
    """Options every Locust process needs (workers parse their own command line)."""
    return [*(["--grpc-url", grpc_url] if grpc_url else []), *cli.to_argv(options.load)]


def locust_command(options: LoadtestOptions, *role: str) -> list[str]:
    files = ",".join(str(path) for path in [LOADTESTS / "locustfile.py", *SHAPE_FILES[options.shape]])
    return [sys.executable, "-m", "locust", "-f", files, *role]


def master_command(
    options: LoadtestOptions, http_url: str, grpc_url: str, prefix: Path, master_port: int | None
) -> list[str]:
    role = (
        [
            "--master",
            "--master-bind-host",
            LOOPBACK,
            "--master-bind-port",
            str(master_port),
            "--expect-workers",
            str(options.workers),
            "--expect-workers-max-wait",
            str(WORKER_CONNECT_S),
        ]
        if master_port
        else []
    )
    users = ["-u", str(options.users), "-r", str(options.users)] if options.shape == "closed" else []
    return [
        *locust_command(options, *role),
        "--headless",
        "--only-summary",  # the live line (locustfile) instead of Locust's tables
        "--host",
        host_option(options, http_url, grpc_url),
        *users,
        "-t",
        f"{math.ceil(options.run_time)}s",  # bounds every shape (whole seconds; the shapes stop on time)
        "--stop-timeout",
        "5",
        "--csv",
        str(prefix),
        "--csv-full-history",
        "--html",
        str(prefix.parent / "report.html"),
        *shared_options(options, grpc_url),
        *USER_CLASSES[options.user],
    ]


def worker_command(options: LoadtestOptions, grpc_url: str, master_port: int) -> list[str]:
    return [
        *locust_command(options, "--worker", "--master-host", LOOPBACK, "--master-port", str(master_port)),
        *shared_options(options, grpc_url),
        *USER_CLASSES[options.user],
    ]


class CpuMeter:
    """Follows each Locust process's CPU time while it runs (psutil cannot read it
    after the process is reaped)."""

    def __init__(self, processes: dict[str, subprocess.Popen]):
        self._started = time.monotonic()
        self._handles = {role: psutil.Process(p.pid) for role, p in processes.items()}
        self._cpu = dict.fromkeys(processes, 0.0)
        self._ended: dict[str, float] = {}

    def sample(self) -> None:
        for role, handle in self._handles.items():
            if role in self._ended:
                continue
            try:
                times = handle.cpu_times()
                self._cpu[role] = times.user + times.system
            except psutil.NoSuchProcess:
                self._ended[role] = time.monotonic()

    def result(self) -> list[GeneratorCpu]:
        now = time.monotonic()
        return [
            GeneratorCpu(role, self._cpu[role], self._ended.get(role, now) - self._started) for role in self._handles
        ]


def run_locust(options: LoadtestOptions, http_url: str, grpc_url: str, prefix: Path) -> tuple[int, list[GeneratorCpu]]:
    """Master (or single process) plus workers; all end by themselves or are killed."""
    master_port = free_port() if options.workers else None
    processes = {
        "master" if master_port else "local": subprocess.Popen(
            master_command(options, http_url, grpc_url, prefix, master_port)
        )
    }
    for index in range(options.workers):
        processes[f"worker {index + 1}"] = subprocess.Popen(worker_command(options, grpc_url, master_port))
    meter = CpuMeter(processes)
    deadline = time.monotonic() + options.run_time + STOP_GRACE_S + (WORKER_CONNECT_S if options.workers else 0)
    try:
        while any(p.poll() is None for p in processes.values()) and time.monotonic() < deadline:
            meter.sample()
            time.sleep(0.25)
        meter.sample()
        hung = [role for role, p in processes.items() if p.poll() is None]
        if hung:
            print(f"error: Locust did not stop by itself: {', '.join(hung)}; killed", file=sys.stderr)
            return 3, meter.result()
        leader = next(iter(processes.values()))
        return leader.returncode, meter.result()
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()


if __name__ == "__main__":
    sys.exit(cli.replaced_by("tritonstack loadtest"))
