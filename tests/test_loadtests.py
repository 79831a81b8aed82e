"""The Locust load tests against the session's real server: gRPC and HTTP users,
the step-ramp and open-loop shapes, distributed mode, the report, the bounds.

Each run is a few seconds long, on loopback, and must end by itself (a gevent
gRPC client once kept Locust alive past its run time)."""

import argparse
import csv
import http.server
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

from tests.conftest import PROJECT_ROOT
from tests.processes import wait_for
from tritonstack import cli
from tritonstack.commands import loadtest
from tritonstack.loadtests import headless, metrics
from tritonstack.loadtests.headless import LoadtestOptions
from tritonstack.loadtests.load_options import LoadOptions
from tritonstack.loadtests.report import GeneratorCpu, cpu_section, final_stats
from tritonstack.serve.network import free_port

ENSEMBLE = "ensemble_dali_efficientnet_lite0"
STEPS = ("preprocess_dali_efficientnet_lite0", "efficientnet_lite0")


def load(server, tmp_path, *options):
    """`tritonstack loadtest` against the session server; (exit code, report folder, seconds)."""
    started = time.monotonic()
    code = loadtest.main(
        [
            "--url",
            server.http_url,
            "--grpc-url",
            server.grpc_url,
            "--metrics-url",
            server.metrics_url,
            "--out",
            str(tmp_path),
            *options,
        ]
    )
    return code, tmp_path, time.monotonic() - started


def stats(folder) -> dict[tuple[str, str], dict[str, str]]:
    assert (folder / "locust_final_stats.csv").exists()
    return {(row["Type"], row["Name"]): row for row in final_stats(folder / "locust")}


def test_grpc_step_ramp_writes_the_report_and_ends_by_itself(server, tmp_path):
    code, folder, seconds = load(
        server,
        tmp_path,
        "--user",
        "grpc",
        "--shape",
        "step",
        "--step-users",
        "1",
        "--step-seconds",
        "2",
        "--steps",
        "2",
    )
    assert code == 0
    assert seconds < 4 + headless.STOP_GRACE_S  # not killed at the deadline: it stopped by itself
    row = stats(folder)[("grpc", ENSEMBLE)]
    assert int(row["Request Count"]) > 5 and row["Failure Count"] == "0"
    for name in ("report.html", "locust_stats_history.csv", "over_time.png", "against_users.png"):
        assert (folder / name).stat().st_size > 1000, name
    summary = (folder / "summary.md").read_text()
    for model in (ENSEMBLE, *STEPS):  # the server-side breakdown, ensemble steps included
        assert f"| {model} |" in summary
    assert "the load generator kept up" in summary
    assert f"- protocol: gRPC at {server.grpc_url}" in summary  # the endpoint really used
    # The ramp really raised the users: 1 in the first step, 2 in the second.
    with open(folder / "locust_stats_history.csv", newline="") as history:
        users = {int(row["User Count"]) for row in csv.DictReader(history)}
    assert {1, 2} <= users <= {0, 1, 2}, users


def locust_wall_seconds(folder) -> float:
    """How long the Locust process lived, from the report's CPU table."""
    match = re.search(r"^\| local \| [\d.]+ \| ([\d.]+) \|", (folder / "summary.md").read_text(), re.MULTILINE)
    assert match, "no Locust process in the CPU table"
    return float(match.group(1))


def test_step_shape_stops_within_the_run_time(server, tmp_path, capfd):
    # Four steps that would take 40 s at the default step length: --run-time fits them into 4 s.
    code, folder, _ = load(
        server,
        tmp_path,
        "--user",
        "grpc",
        "--shape",
        "step",
        "--steps",
        "4",
        "--step-users",
        "1",
        "--run-time",
        "4",
        "--live-seconds",
        "1",
    )
    assert code == 0
    assert locust_wall_seconds(folder) <= 4 + 5
    assert "- load: 1 users per 1 s step, 4 steps" in (folder / "summary.md").read_text()
    live = [line for line in capfd.readouterr().err.splitlines() if re.match(r"\[\s*\d+ s\] \d+ users", line)]
    assert live, "no live line during the run"
    assert "requests" in live[-1] and "failed" in live[-1]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tritonstack.commands.loadtest", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROJECT_ROOT,
    )


def test_every_locust_process_parses_back_the_options_the_command_parsed():
    """One table of options: what `tritonstack loadtest` parsed is what the Locust
    master and workers parse from the command line it gives them."""
    given = ["--shape", "open", "--target-rps", "7", "--boxes", "2", "--max-requests", "9", "--deadline-ms", "150"]
    options = loadtest.checked(cli.from_args(LoadtestOptions, loadtest.parser().parse_args(given)))
    locust_side = argparse.ArgumentParser()
    locust_side.add_argument("--grpc-url")
    cli.add_options(locust_side, LoadOptions)
    back = locust_side.parse_args(headless.shared_options(options, "127.0.0.1:1"))
    assert cli.from_args(LoadOptions, back) == options.load
    assert (back.grpc_url, back.target_rps, back.max_requests, back.model) == (
        "127.0.0.1:1",
        7.0,
        9,
        "ensemble_regions_efficientnet_lite0",
    )


def test_steps_that_do_not_fit_the_run_time_are_refused(tmp_path):
    done = run_cli(
        "--shape", "step", "--steps", "4", "--step-seconds", "10", "--run-time", "15", "--out", str(tmp_path / "report")
    )
    assert done.returncode == 2
    assert "4 steps of 10 s take 40 s, more than --run-time 15" in done.stderr
    assert not (tmp_path / "report").exists()


def test_closed_port_exits_2_before_any_report(tmp_path):
    http, grpc = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = run_cli(
        "--url", http, "--grpc-url", grpc, "--shape", "closed", "--run-time", "60", "--out", str(tmp_path / "report")
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: no Triton server at {grpc} (grpc): start one with `make serve`")
    assert time.monotonic() - started < 30  # not the 60 s run
    assert not (tmp_path / "report").exists()


def test_unknown_model_exits_2_before_any_report(server, tmp_path):
    done = run_cli("--url", server.http_url, "--user", "http", "--model", "resnet50", "--out", str(tmp_path / "report"))
    assert done.returncode == 2
    assert "model 'resnet50' not found" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "report").exists()


def test_http_open_loop_holds_the_rate(server, tmp_path):
    code, folder, _ = load(
        server,
        tmp_path,
        "--user",
        "http",
        "--shape",
        "open",
        "--target-rps",
        "10",
        "--open-loop-users",
        "2",
        "--run-time",
        "4",
    )
    assert code == 0
    row = stats(folder)[("http", ENSEMBLE)]
    # The schedule bounds the count from above whatever the machine does: 10/s for
    # 4 s, plus one phase-shifted send per user. Below, only a loose floor: a loaded
    # machine may start the users late, and wall-clock rates are not asserted here.
    assert 20 <= int(row["Request Count"]) <= 10 * 4 + 2
    assert row["Failure Count"] == "0"
    # The users' metadata GETs are not requests under test: not in the figures.
    assert set(stats(folder)) == {("http", ENSEMBLE), ("", "Aggregated")}
    assert not (folder / "against_users.png").exists()  # fixed users: nothing to plot against them


def test_request_count_bound_stops_the_run_early(server, tmp_path):
    code, folder, seconds = load(
        server,
        tmp_path,
        "--user",
        "grpc",
        "--shape",
        "closed",
        "--users",
        "2",
        "--run-time",
        "60",
        "--max-requests",
        "20",
    )
    assert code == 0
    assert seconds < 30
    assert 20 <= int(stats(folder)[("grpc", ENSEMBLE)]["Request Count"]) <= 60


def test_http_errors_count_as_failures(server, tmp_path):
    # The classifier alone wants FP32 pixels: encoded bytes are a bad request (HTTP 400).
    # The preflight would refuse that model: skipped, to load the error path. Bounded
    # by a request count: Locust's run time starts before its users, so a short one
    # on a loaded machine may end before the first request.
    code, folder, _ = load(
        server,
        tmp_path,
        "--user",
        "http",
        "--shape",
        "closed",
        "--users",
        "1",
        "--run-time",
        "20",
        "--max-requests",
        "5",
        "--model",
        "efficientnet_lite0",
        "--skip-preflight",
    )
    assert code == 1  # Locust's exit code when requests failed
    row = stats(folder)[("http", "efficientnet_lite0")]
    assert int(row["Failure Count"]) == int(row["Request Count"]) > 0
    assert "400" in (folder / "locust_failures.csv").read_text()


def test_distributed_master_and_workers(server, tmp_path):
    # 5 s: on a loaded machine (8 agents on 2 cores) workers took up to 3 s to start
    # their users, and a 3 s run then had no request (seen on main's code too).
    code, folder, seconds = load(
        server, tmp_path, "--workers", "2", "--user", "both", "--shape", "closed", "--users", "2", "--run-time", "5"
    )
    assert code == 0
    table = stats(folder)
    for protocol in ("grpc", "http"):  # one user of each class, on the two workers
        assert int(table[(protocol, ENSEMBLE)]["Request Count"]) > 0
        assert table[(protocol, ENSEMBLE)]["Failure Count"] == "0"
    summary = (folder / "summary.md").read_text()
    assert "| worker 1 |" in summary and "| worker 2 |" in summary


def test_cpu_guard_flags_a_saturated_worker():
    busy = cpu_section([GeneratorCpu("master", 1.0, 10.0), GeneratorCpu("worker 1", 9.5, 10.0)])
    assert "load generator was the bottleneck" in busy and "worker 1" in busy
    idle = cpu_section([GeneratorCpu("local", 3.0, 10.0)])
    assert "bottleneck" not in idle


STALL_S = 2.0


def test_open_loop_latency_counts_from_the_scheduled_send(server, tmp_path):
    """The session server frozen (SIGSTOP) for STALL_S mid-run: the open loop keeps
    its schedule, and the requests scheduled during the freeze report the wait they
    suffered (timed from their scheduled send, also those that waited for a free
    connection): about STALL_S*rate/2 requests take over STALL_S/2, so the 90th
    percentile is over 800 ms. A closed loop would send one request per user into
    the freeze and show it in the maximum only."""
    before = answered(server)
    outcome = {}
    runner = threading.Thread(
        target=lambda: outcome.update(
            result=load(
                server,
                tmp_path,
                "--user",
                "http",
                "--shape",
                "open",
                "--target-rps",
                "10",
                "--open-loop-users",
                "1",
                "--run-time",
                "7",
            )
        )
    )
    runner.start()
    try:
        wait_for(lambda: answered(server) >= before + 5, timeout_s=60, what="the open loop's first answers")
        os.kill(server.pid, signal.SIGSTOP)
        try:
            threading.Event().wait(STALL_S)  # the fault's duration, not a synchronization
        finally:
            os.kill(server.pid, signal.SIGCONT)
    finally:
        runner.join(timeout=120)
    code, folder, _ = outcome["result"]
    assert code == 0
    row = stats(folder)[("http", ENSEMBLE)]
    assert row["Failure Count"] == "0"
    assert int(row["Request Count"]) >= 40  # the schedule went on through the freeze
    assert float(row["Max Response Time"]) >= STALL_S * 1000 * 0.9, row["Max Response Time"]
    assert float(row["90%"]) >= 800, row["90%"]


def answered(server) -> int:
    return int(metrics.scrape(server.metrics_url).get(ENSEMBLE, {}).get("nv_inference_request_success", 0))


class TruncatingProxy(http.server.BaseHTTPRequestHandler):
    """Forwards to the real server; its inference answers arrive cut in half (a
    broken proxy or connection): status 200, a body that does not parse."""

    upstream = ""
    protocol_version = "HTTP/1.1"  # keep-alive, as Locust's client expects

    def forward(self, body: bytes | None = None):
        request = urllib.request.Request(
            f"http://{self.upstream}{self.path}",
            data=body,
            method=self.command,
            headers={k: v for k, v in self.headers.items() if k.lower() != "host"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            status, headers, content = answer.status, dict(answer.headers), answer.read()
        if self.command == "POST":
            content = content[: len(content) // 2]
        self.send_response(status)
        for name, value in headers.items():
            if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def do_GET(self):
        self.forward()

    def do_POST(self):
        self.forward(self.rfile.read(int(self.headers["Content-Length"])))

    def log_message(self, *args):
        pass


def test_a_malformed_answer_counts_as_a_failure(server, tmp_path):
    handler = type("Proxy", (TruncatingProxy,), {"upstream": server.http_url})
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    serving = threading.Thread(target=proxy.serve_forever, daemon=True)
    serving.start()
    try:
        code = loadtest.main(
            [
                "--url",
                f"127.0.0.1:{proxy.server_address[1]}",
                "--grpc-url",
                server.grpc_url,
                "--metrics-url",
                server.metrics_url,
                "--out",
                str(tmp_path),
                "--user",
                "http",
                "--shape",
                "closed",
                "--users",
                "1",
                "--run-time",
                "5",
                "--max-requests",
                "10",
            ]
        )
    finally:
        proxy.shutdown()
        proxy.server_close()
        serving.join(timeout=10)
    assert code == 1  # Locust's exit code when requests failed
    row = stats(tmp_path)[("http", ENSEMBLE)]
    assert int(row["Failure Count"]) == int(row["Request Count"]) > 0, row
    assert "unreadable response" in (tmp_path / "locust_failures.csv").read_text()
