"""The capacity planner's arithmetic, on a benchmark of known figures, and its
command line on a JSON file of the benchmark's shape."""

import json
import math

import pytest

from tritonstack.commands import plan as plan_command
from tritonstack.experiments import capacity_plan
from tritonstack.measure import results

# One replica: saturates at 100 req/s, 20 ms unloaded; at 70 req/s p50 30 ms, p99 60 ms.
MEASURED = {
    "server_images_per_s": 100.0,
    "latency_ms_p50_concurrency_1": 20.0,
    "open_loop_rate": 70.0,
    "open_loop_ms_p50": 30.0,
    "open_loop_ms_p99": 60.0,
}


def test_a_loose_budget_stays_at_the_measured_load():
    result = capacity_plan.plan(MEASURED, target_rps=500, p99_budget_ms=120)
    # p99(u) = 20 + k u/(1-u), k = 40 / (0.7/0.3) = 17.14; 120 ms allows u <= 0.854 ...
    assert result.model_utilization == pytest.approx(0.8537, abs=1e-4)
    # ... but nothing was measured past 0.7: 70 req/s per replica, ceil(500/70) = 8.
    assert result.utilization == pytest.approx(0.7)
    assert result.replicas == 8
    assert result.target_queue_time_us == 10_000  # 30 - 20 ms of waiting at u = 0.7


def test_a_tight_budget_lowers_the_load_per_replica():
    result = capacity_plan.plan(MEASURED, target_rps=500, p99_budget_ms=50)
    # (50 - 20) / 17.14 = 1.75 = u/(1-u): u = 0.636, 63.6 req/s per replica.
    assert result.utilization == pytest.approx(1.75 / 2.75)
    assert result.replicas == math.ceil(500 / (100 * 1.75 / 2.75)) == 8
    # Waiting at u: 10 ms * 1.75 / (0.7/0.3) = 7.5 ms.
    assert result.target_queue_time_us == 7500
    assert capacity_plan.plan(MEASURED, 60, 50).replicas == 1


def test_a_budget_below_the_unloaded_latency_is_infeasible():
    with pytest.raises(capacity_plan.InfeasiblePlan):
        capacity_plan.plan(MEASURED, 100, 15)


def test_plan_reads_only_keys_the_benchmark_promises():
    # REQUIRED_KEYS is what test_benchmark checks a real run writes.
    assert set(capacity_plan.PLAN_KEYS) - set(results.REQUIRED_KEYS) == set()
    with pytest.raises(KeyError):
        capacity_plan.plan({"server_images_per_s": 1.0}, 1, 100)


def test_command_line_shows_the_arithmetic(tmp_path, capsys):
    path = tmp_path / "benchmark.json"
    path.write_text(json.dumps(MEASURED | {"errors": 0}))
    assert plan_command.main([str(path), "--target-rps", "500", "--p99-ms", "50"]) == 0
    out = capsys.readouterr().out
    assert "replicas: ceil(500.0 / 63.6) = 8" in out
    assert "autoscaling.targetQueueTimeUs: 7500" in out
    assert plan_command.main([str(path), "--target-rps", "500", "--p99-ms", "10"]) == 1
