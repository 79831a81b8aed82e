"""`tritonstack tune`: candidates from the cores, the objective's choice, and a short
real search against a real server that writes a new repository and leaves the tuned
one as it was."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from tritonstack.client.classifier import ClassifierClient
from tritonstack.experiments.layout_search import (
    Layout,
    Measured,
    TuneSettings,
    best,
    p99_upper_bound_ms,
    pareto_front,
    rate_figures,
    summarized,
    thread_layouts,
    unmet_bound,
)
from tritonstack.objective import MIN_QUEUED_STEP_INSTANCES
from tritonstack.repository_files import read_config
from tritonstack.samples.photos import photo_bytes
from tritonstack.serve.launcher import TritonServer

ENSEMBLE = "ensemble_dali_efficientnet_lite0"


def measured(
    images_per_s: float, rate_p99_ms: float | None = None, p99_ms: float = 100.0, layout: Layout | None = None
) -> Measured:
    """One measurement; at --rate, 1000 latencies whose p99 and its upper bound are `rate_p99_ms`."""
    layout = layout or Layout(1, 2, 2, 1, int(images_per_s))
    at_rate = rate_figures([rate_p99_ms] * 1000) if rate_p99_ms is not None else {"rate_p99_ms": None}
    return Measured(layout, images_per_s, p99_ms, 10.0, errors=0, **at_rate)


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 8, 16])
def test_candidates_run_two_instances_a_step_and_no_thread_past_the_cores(cores):
    layouts = thread_layouts(cores, 8)
    assert layouts and len(set(layouts)) == len(layouts)
    for layout in layouts:
        assert min(layout.dali_instances, layout.classifier_instances) >= MIN_QUEUED_STEP_INSTANCES
        assert layout.dali_threads <= cores and layout.classifier_threads <= cores
        assert layout.classifier_instances * layout.classifier_threads <= max(cores, MIN_QUEUED_STEP_INSTANCES)
    # The first tried keep every core busy in both steps, and no more.
    first, busy = layouts[0], max(cores, MIN_QUEUED_STEP_INSTANCES)
    assert first.dali_instances * first.dali_threads == busy
    assert first.classifier_instances * first.classifier_threads == busy


def test_a_layout_measured_again_is_judged_by_its_medians_and_its_pooled_open_loops():
    lucky = Layout(2, 1, 2, 1, 1)
    results = [
        measured(100.0, 90.0, p99_ms=200.0, layout=lucky),
        measured(90.0, 300.0, p99_ms=260.0, layout=lucky),
        measured(95.0, 280.0, p99_ms=240.0, layout=lucky),
        measured(80, 150),
    ]
    (summary, other) = summarized(results)
    assert (summary.layout, summary.measurements) == (lucky, 3)
    assert (summary.images_per_s, summary.p99_ms) == (95.0, 240.0)
    # 3000 latencies pooled: a third of them at 300 ms sets the p99.
    assert summary.rate_p99_ms == summary.rate_p99_bound_ms == 300.0
    assert len(summary.rate_latencies_ms) == 3000
    # Its one lucky open loop (90 ms) does not make it meet a 200 ms bound: the steady one does.
    assert best(results, TuneSettings("p99", p99_ms=200, rate=50)).layout == other.layout
    assert best(results, TuneSettings()).layout == lucky


def test_a_p99_under_the_bound_by_luck_does_not_meet_it():
    # Ten slow requests of a thousand: the p99 (interpolated) is 52 ms, but the true p99
    # lies at or above 250 ms with more than 5 % probability.
    near = [50.0] * 990 + [250.0] * 10
    assert rate_figures(near)["rate_p99_ms"] < 60 < p99_upper_bound_ms(near) == 250.0
    # Four of a thousand are few enough to bound it at 50 ms, and too few latencies bound nothing.
    assert p99_upper_bound_ms([50.0] * 996 + [250.0] * 4) == 50.0
    assert p99_upper_bound_ms([50.0] * 100) == float("inf")
    layout = Layout(2, 2, 2, 1, 8)
    lucky = Measured(layout, 120.0, 100.0, 10.0, errors=0, **rate_figures(near))
    assert best([lucky, measured(100, 150)], TuneSettings("p99", p99_ms=200, rate=50)).images_per_s == 100


def test_throughput_takes_the_fastest_and_p99_the_fastest_under_the_bound():
    results = [measured(100, 300), measured(120, 900), measured(110, 200)]
    assert best(results, TuneSettings()).images_per_s == 120
    assert best(results, TuneSettings("p99", p99_ms=400, rate=50)).images_per_s == 110
    # None meets the bound: the lowest p99.
    assert best(results, TuneSettings("p99", p99_ms=100, rate=50)).rate_p99_ms == 200


def test_a_bound_no_candidate_meets_is_said_with_what_each_reached():
    results = [measured(100, 300), measured(120, 900), measured(110, 200)]
    settings = TuneSettings("p99", p99_ms=100, rate=95)
    reason = unmet_bound(results, settings)
    assert "no layout keeps the p99 under 100 ms at 95 requests/s" in reason
    assert "the lowest p99 at 95/s was 200 ms" in reason and "79% of it" in reason  # 95 of 120
    assert unmet_bound(results, TuneSettings("p99", p99_ms=400, rate=95)) is None  # one meets it
    assert unmet_bound(results, TuneSettings()) is None  # the throughput objective has no bound


def test_the_pareto_front_holds_what_nothing_beats_on_both():
    results = [measured(100, 300), measured(120, 900), measured(110, 200), measured(90, 400)]
    assert sorted(result.images_per_s for result in pareto_front(results)) == [110, 120]


def test_p99_objective_needs_its_bound_and_rate():
    with pytest.raises(ValueError, match="--p99-ms and --rate"):
        TuneSettings("p99", p99_ms=100)


def digest(folder) -> str:
    files = sorted(path for path in folder.rglob("*") if path.is_file() and "__pycache__" not in path.parts)
    return hashlib.sha256(b"".join(path.read_bytes() for path in files)).hexdigest()


def test_a_short_search_writes_the_winner_as_a_new_repository(lite0_repository, tmp_path):
    before = digest(lite0_repository)
    out, report = tmp_path / "tuned", tmp_path / "report"
    command = [sys.executable, "-m", "tritonstack", "tune", "--model-repository", str(lite0_repository)]
    done = subprocess.run(
        # A count, not a time, bounds the search: a slow machine spends 16 s on one layout.
        [*command, "--out", str(out), "--report", str(report), "--budget-s", "40", "--max-measurements", "2"]
        + ["--seconds", "1.5", "--warmup-s", "0.5", "--concurrency", "4"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert digest(lite0_repository) == before  # the tuned repository is left as it was
    summary = json.loads((report / "tune.json").read_text())
    candidates = summary["candidates"]
    assert len(candidates) == 2 and all(c["images_per_s"] > 0 and c["errors"] == 0 for c in candidates)
    chosen = summary["chosen"]
    assert "rate_latencies_ms" not in chosen  # the report has figures, not every latency
    assert chosen["images_per_s"] == max(c["images_per_s"] for c in candidates)
    assert any(c["pareto"] for c in candidates) and (report / "pareto.png").stat().st_size > 1000
    assert summary["build_flags"] in (report / "tune.md").read_text()
    layout = chosen["layout"]
    classifier = read_config(out / "efficientnet_lite0")
    assert classifier.instance_group[0].count == layout["classifier_instances"]
    assert classifier.parameters["intra_op_thread_count"].string_value == str(layout["classifier_threads"])
    dali = read_config(out / "preprocess_dali_efficientnet_lite0")
    assert (dali.instance_group[0].count, dali.parameters["num_threads"].string_value) == (
        layout["dali_instances"],
        str(layout["dali_threads"]),
    )
    check = subprocess.run([sys.executable, "-m", "tritonstack", "check", str(out)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    with TritonServer(out) as server, ClassifierClient(server.http_url, model=ENSEMBLE) as client:
        assert client.classify([photo_bytes("coffee.png")], top_k=1)[0][0].label == "espresso"


def test_it_never_writes_over_a_folder_or_into_the_tuned_repository(lite0_repository, tmp_path):
    command = [sys.executable, "-m", "tritonstack", "tune", "--model-repository", str(lite0_repository)]
    for out, says in ((tmp_path, "exists"), (lite0_repository / "new", "inside the tuned repository")):
        done = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and says in done.stderr, done.stderr
