"""Run a bounded, headless Locust load test and write a report folder.

    python -m loadtests.run                                  # starts its own server
    python -m loadtests.run --url 127.0.0.1:8000 --grpc-url 127.0.0.1:8001 \
        --metrics-url http://127.0.0.1:8002/metrics --shape open --target-rps 40
    python -m loadtests.run --workers 2                      # one master, 2 workers

The report folder gets Locust's CSV and HTML, `over_time.png`, `against_users.png`
and `summary.md` (requests, server-side breakdown per model, load generator CPU).
Every run is bounded in users, duration and request count, and talks to loopback
unless told otherwise.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import psutil

from loadtests.report import GeneratorCpu, RunSummary, write_report
from loadtests.target import target_server
from loadtests import metrics
from tritonstack.contract import DEFAULT_MODEL
from tritonstack.serve.network import free_port, LOOPBACK

LOADTESTS = Path(__file__).resolve().parent
PROJECT_ROOT = LOADTESTS.parent
SHAPE_FILES = {
    "closed": [],
    "step": [LOADTESTS / "shape_step_ramp.py"],
    "open": [LOADTESTS / "shape_constant_rate.py"],
}
USER_CLASSES = {"grpc": ["GrpcUser"], "http": ["HttpUser"], "both": ["GrpcUser", "HttpUser"]}
# Beyond the planned duration, how long Locust gets to stop by itself before it is killed.
STOP_GRACE_S = 30.0
WORKER_CONNECT_S = 60


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="HTTP host:port of a running Triton (default: start one)")
    parser.add_argument("--grpc-url", help="gRPC host:port of that Triton")
    parser.add_argument("--metrics-url", help="its Prometheus endpoint, for the server-side breakdown")
    parser.add_argument("--model-repository", default=str(PROJECT_ROOT / "model_repository"))
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--user", choices=sorted(USER_CLASSES), default="grpc")
    parser.add_argument("--shape", choices=sorted(SHAPE_FILES), default="step")
    parser.add_argument("--users", type=int, default=4, help="closed shape: users")
    parser.add_argument("--run-time", type=float, default=40.0, help="seconds (closed and open shapes)")
    parser.add_argument("--max-requests", type=int, default=20000, help="stop after this many requests")
    parser.add_argument("--step-users", type=int, default=2)
    parser.add_argument("--step-seconds", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--target-rps", type=float, default=20.0, help="open shape: requests per second")
    parser.add_argument("--open-loop-users", type=int, default=4)
    parser.add_argument("--workers", type=int, default=0, help="distributed: Locust worker processes (0: one process)")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default: reports/<time>)")
    args = parser.parse_args(argv)
    if args.url and not args.grpc_url and args.user != "http":
        parser.error("--url names a running server: give its --grpc-url too (gRPC users)")
    return args


def planned_seconds(args: argparse.Namespace) -> float:
    return args.steps * args.step_seconds if args.shape == "step" else args.run_time


def shared_options(args: argparse.Namespace, grpc_url: str) -> list[str]:
    """Options every Locust process needs (workers parse their own command line)."""
    return [
        "--model", args.model,
        *(["--grpc-url", grpc_url] if grpc_url else []),
        "--max-requests", str(args.max_requests),
        "--step-users", str(args.step_users),
        "--step-seconds", str(args.step_seconds),
        "--steps", str(args.steps),
        "--target-rps", str(args.target_rps if args.shape == "open" else 0),
        "--open-loop-users", str(args.open_loop_users),
    ]


def locust_command(args: argparse.Namespace, *role: str) -> list[str]:
    files = ",".join(str(path) for path in [LOADTESTS / "locustfile.py", *SHAPE_FILES[args.shape]])
    return [sys.executable, "-m", "locust", "-f", files, *role]


def master_command(args, http_url: str, grpc_url: str, prefix: Path, master_port: int | None) -> list[str]:
    role = ["--master", "--master-bind-host", LOOPBACK, "--master-bind-port", str(master_port),
            "--expect-workers", str(args.workers), "--expect-workers-max-wait", str(WORKER_CONNECT_S)] \
        if master_port else []
    run = ["-u", str(args.users), "-r", str(args.users), "-t", f"{args.run_time:.0f}s"] \
        if args.shape != "step" else []
    return [
        *locust_command(args, *role),
        "--headless", "--only-summary",
        "--host", f"http://{http_url}",
        *run,
        "--stop-timeout", "5",
        "--csv", str(prefix), "--csv-full-history",
        "--html", str(prefix.parent / "report.html"),
        *shared_options(args, grpc_url),
        *USER_CLASSES[args.user],
    ]


def worker_command(args, grpc_url: str, master_port: int) -> list[str]:
    return [
        *locust_command(args, "--worker", "--master-host", LOOPBACK, "--master-port", str(master_port)),
        *shared_options(args, grpc_url),
        *USER_CLASSES[args.user],
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
            GeneratorCpu(role, self._cpu[role], self._ended.get(role, now) - self._started)
            for role in self._handles
        ]


def run_locust(args, http_url: str, grpc_url: str, prefix: Path) -> tuple[int, list[GeneratorCpu]]:
    """Master (or single process) plus workers; all end by themselves or are killed."""
    master_port = free_port() if args.workers else None
    processes = {"master" if master_port else "local":
                 subprocess.Popen(master_command(args, http_url, grpc_url, prefix, master_port), cwd=PROJECT_ROOT)}
    for index in range(args.workers):
        processes[f"worker {index + 1}"] = subprocess.Popen(
            worker_command(args, grpc_url, master_port), cwd=PROJECT_ROOT
        )
    meter = CpuMeter(processes)
    deadline = time.monotonic() + planned_seconds(args) + STOP_GRACE_S + (WORKER_CONNECT_S if args.workers else 0)
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out or PROJECT_ROOT / "reports" / time.strftime("loadtest-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / "locust"
    with target_server(args.model_repository, args.url, args.grpc_url, args.metrics_url) as target:
        metrics_url = target.metrics_url
        before = metrics.scrape(metrics_url) if metrics_url else None
        exit_code, generator_cpu = run_locust(args, target.http_url, target.grpc_url, prefix)
        server = metrics.breakdown(before, metrics.scrape(metrics_url)) if metrics_url else []
    settings = {
        "model": args.model, "protocol": args.user, "shape": args.shape,
        "workers": str(args.workers or "none (one process)"),
        "bounds": f"{planned_seconds(args):.0f} s, at most {args.max_requests} requests",
        "load": (f"{args.target_rps} requests/s open loop over {args.open_loop_users} users" if args.shape == "open"
                 else f"{args.step_users} users per {args.step_seconds:.0f} s step, {args.steps} steps"
                 if args.shape == "step" else f"{args.users} users closed loop"),
        "Locust exit code": str(exit_code),
    }
    summary = write_report(prefix, RunSummary(f"Load test of {args.model}", settings, generator_cpu, server))
    print(summary.read_text())
    print(f"report: {out}")
    return exit_code


if __name__ == "__main__":
    raise SystemExit(main())
