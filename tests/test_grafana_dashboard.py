"""The chart's Grafana dashboard (grafana.dashboard.enabled): a ConfigMap the Grafana
sidecar picks up, off by default; every panel's query parses as PromQL and names only
metrics a real server exports (Triton's GPU-only ones aside), and the autoscaling
panel plots the query the autoscaler scales on."""

from __future__ import annotations

import json

import pytest

from tests.chart import RELEASE, helm, one, render
from tests.promql import exported_series, metric_names, parse, unexported
from tritonstack.loadtests.metrics import REFUSED_REASON

CONFIGMAP = f"{RELEASE}-image-classifier-grafana-dashboard"
# Exported by Triton only where it sees a GPU (the server's user guide, metrics.md).
GPU_ONLY = {"nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"}


def dashboard(*settings: str) -> tuple[dict, dict]:
    configmap = one(render("cpu", "grafana.dashboard.enabled=true", *settings), "ConfigMap", CONFIGMAP)
    return configmap, json.loads(configmap["data"]["image-classifier.json"])


def queries(board: dict) -> dict[str, list[str]]:
    return {panel["title"]: [target["expr"] for target in panel["targets"]] for panel in board["panels"]}


def test_dashboard_is_off_by_default():
    assert [o for o in render("cpu") if o["metadata"]["name"] == CONFIGMAP] == []


def test_dashboard_configmap_carries_the_sidecars_label_and_a_panel_per_concern():
    configmap, board = dashboard("grafana.dashboard.annotations.grafana_folder=Triton")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Triton"}
    assert board["uid"] and len(board["uid"]) <= 40 and board["title"]
    titles = " | ".join(queries(board)).lower()
    for concern in ("throughput", "failure", "queue", "compute", "autoscaling", "cpu", "memory", "p99", "refused"):
        assert concern in titles, concern
    variables = {variable["name"] for variable in board["templating"]["list"]}
    assert {"datasource", "namespace", "pod"} <= variables
    assert all(panel["datasource"]["uid"] == "${datasource}" for panel in board["panels"])


def test_every_query_parses_as_promql():
    for title, exprs in queries(dashboard()[1]).items():
        for expr in exprs:
            assert "__AUTOSCALING" not in expr, title
            parse(expr)  # raises on a syntax error


def test_autoscaling_panel_plots_the_autoscalers_query_and_target():
    _, board = dashboard("autoscaling.model=ensemble_dali_efficientnet_lite2", "autoscaling.targetQueueTimeUs=12345")
    (exprs,) = [exprs for title, exprs in queries(board).items() if title.startswith("Autoscaling")]
    adapter_rule = one(
        render("cpu", "autoscaling.model=ensemble_dali_efficientnet_lite2"),
        "ConfigMap",
        f"{RELEASE}-image-classifier-adapter-rules",
    )["data"]["config.yaml"]
    assert 'model=~"ensemble_dali_efficientnet_lite2"' in exprs[0] and "by (pod)" in exprs[0]
    assert "ensemble_dali_efficientnet_lite2" in adapter_rule
    assert metric_names(parse(exprs[0])) == {"nv_inference_queue_duration_us", "nv_inference_request_success"}
    assert exprs[1] == "vector(12345)"


def test_every_metric_the_dashboard_names_is_exported_by_the_server(server):
    """Metrics, quantiles and failure reasons: the session's server exports each (its
    latency summaries are on by default)."""
    exported = exported_series(server.metrics_url)
    exprs = [expr for exprs in queries(dashboard()[1]).values() for expr in exprs]
    named = set().union(*(metric_names(parse(expr)) for expr in exprs))
    assert named - GPU_ONLY, "the dashboard should name Triton's metrics"
    missing = {expr: unexported(expr, exported, GPU_ONLY) for expr in exprs}
    assert {expr: names for expr, names in missing.items() if names} == {}
    assert {"nv_inference_queue_duration_us", "nv_inference_count", "nv_cpu_memory_used_bytes"} <= named
    assert "nv_inference_request_summary_us" in named
    assert any(f'reason="{REFUSED_REASON}"' in expr for expr in exprs)


@pytest.mark.parametrize("mode", ["cpu", "gpu"])
def test_chart_with_the_dashboard_lints(mode):
    from tests.chart import CHART

    helm(
        "lint",
        "--strict",
        str(CHART),
        "-f",
        str(CHART / f"values-{mode}.yaml"),
        "--set",
        "grafana.dashboard.enabled=true",
    )
