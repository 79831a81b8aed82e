"""The Kubernetes chart (deploy/helm/image-classifier), offline: no cluster here.
The real helm binary (`make tools`) lints and renders every mode; every rendered
built-in object is checked against the Kubernetes JSON schemas of a current minor
release (kubernetes-validate, strict: unknown fields are errors); then what the
schemas cannot see: the autoscaler targets the Deployment, the metrics its query
reads are ones our served Triton really exports, probes point at Triton's health
endpoints, no secret in a ConfigMap, Locust workers reach their master."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from deploy.image.build_images import LOCUST
from tests.chart import (
    CHART,
    HELM,
    RELEASE,
    flag,
    free_server_ports,
    helm,
    http_status,
    one,
    one_container,
    render,
    run_probe,
    serve_rendered,
    triton_container,
)
from tests.conftest import PROJECT_ROOT
from tests.promql import exported_series, unexported
from tritonstack import cli
from tritonstack.client.classifier import ClassifierClient
from tritonstack.commands import serve
from tritonstack.contract import ADMIN_KEY_ENV, DEFAULT_MODEL, DEFAULT_VIDEO_MODEL, is_video_model
from tritonstack.loadtests.metrics import QUEUE_US, REFUSED_REASON, SUCCESS
from tritonstack.samples.photos import PHOTOS, photo_bytes
from tritonstack.serve.network import LOOPBACK, free_port
from tritonstack.serve.process_tree import server_stubs
from tritonstack.serve.security import RESTRICTED_APIS, restriction_flags
from tritonstack.serve.server_config import SUMMARY_QUANTILES, ServerConfig, otlp_trace_flags, summary_metrics_flags
from tritonstack.serve.supervision import Supervision

KUBERNETES_VERSION = "1.33.0"
MODES = ("gpu", "cpu", "local")
# Custom resources: kubernetes-validate has no schema for them (their operators' CRDs
# define them); they are checked by the assertions below instead.
CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("keda.sh/v1alpha1", "ScaledObject"),
}
# Everything optional switched on, so that every template renders.
EVERYTHING = ("locust.enabled=true", "metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true")
HEALTH = {"livenessProbe": "/v2/health/live", "readinessProbe": "/v2/health/ready"}
# With the warmup on (the default), readiness sends the sample (docs/reliability.md#readiness).
SAMPLED = "readinessProbe"
LOADTEST_FILES = ("__init__.py", "load_options.py", "locustfile.py", "users.py")


@pytest.fixture(scope="module")
def exported_metric_names(server) -> set[str]:
    """Metric families our real served Triton exports (the session's server)."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        return {family.name for family in text_string_to_metric_families(response.read().decode())}


@pytest.mark.parametrize("mode", MODES)
def test_lint_strict(mode):
    helm(
        "lint",
        "--strict",
        str(CHART),
        "-f",
        str(CHART / f"values-{mode}.yaml"),
        *[arg for setting in EVERYTHING for arg in ("--set", setting)],
    )


@pytest.mark.parametrize(
    "sets", [(), EVERYTHING, ("autoscaling.kind=keda", *EVERYTHING)], ids=["defaults", "everything", "keda"]
)
@pytest.mark.parametrize("mode", MODES)
def test_every_object_matches_the_kubernetes_schemas(mode, sets):
    objects = render(mode, *sets)
    skipped = set()
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CRDS:
            skipped.add(obj["kind"])
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {error.message} at {list(error.path)}")
    assert {"Deployment", "Service"} <= {o["kind"] for o in objects}
    if "metrics.serviceMonitor.enabled=true" in sets:
        assert {"ServiceMonitor", "PrometheusRule"} <= skipped


@pytest.mark.parametrize("mode", MODES)
def test_probes_use_triton_health_endpoints_on_a_declared_port(mode):
    container = triton_container(render(mode))
    port_names = {port["name"] for port in container["ports"]}
    unwarmed = triton_container(render(mode, "server.warmup.enabled=false"))
    for probe, path in HEALTH.items():
        assert unwarmed[probe]["httpGet"] == {"path": path, "port": "http"}, probe
        if probe != SAMPLED:
            assert container[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    # The startup and readiness probes send each ensemble the sample over the same port
    # (run against a server below).
    url = f"--url=http://127.0.0.1:{flag(container['args'], 'http-port')}"
    assert url in container["startupProbe"]["exec"]["command"]
    assert url in container[SAMPLED]["exec"]["command"] and "--readiness" in container[SAMPLED]["exec"]["command"]
    assert unwarmed["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert "http" in port_names
    assert int(flag(container["args"], "http-port")) == next(
        p["containerPort"] for p in container["ports"] if p["name"] == "http"
    )


@pytest.mark.parametrize("mode", MODES)
def test_server_binds_every_interface_and_drains_before_the_kill(mode):
    objects = render(mode)
    container = triton_container(objects)
    args = container["args"]
    for kind in ("http", "grpc", "metrics"):
        assert flag(args, f"{kind}-address") == "0.0.0.0"
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + int(flag(args, "exit-timeout-secs"))
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert flag(args, "load-model") == DEFAULT_MODEL


@pytest.mark.parametrize("mode", MODES)
def test_admin_apis_are_restricted_with_the_key_from_a_secret(mode):
    objects = render(mode, *EVERYTHING)
    container = triton_container(objects)
    # The same flags the launcher gives tritonserver, the key expanded by the kubelet.
    expected = restriction_flags(RESTRICTED_APIS, f"$({ADMIN_KEY_ENV})")
    assert [arg for arg in container["args"] if "restricted" in arg] == expected
    key_env = next(env for env in container["env"] if env["name"] == ADMIN_KEY_ENV)
    assert set(key_env) == {"name", "valueFrom"} and "secretKeyRef" in key_env["valueFrom"]


@pytest.mark.parametrize("mode", MODES)
def test_no_secret_value_is_rendered(mode):
    objects = render(mode, *EVERYTHING)
    assert "Secret" not in {o["kind"] for o in objects}  # Secrets exist before install
    for obj in objects:
        for container in _containers(obj):
            for env in container.get("env", []):
                if re.search(r"KEY|SECRET|TOKEN|PASSWORD", env["name"]) and env["name"] != "AWS_DEFAULT_REGION":
                    assert "value" not in env, (obj["metadata"]["name"], env)
    for config_map in (o for o in objects if o["kind"] == "ConfigMap"):
        text = yaml.safe_dump(config_map["data"])
        assert not re.search(r"AWS_SECRET_ACCESS_KEY\s*[=:]\s*\S|tritonstack-admin-key=(?!\$\()", text), config_map[
            "metadata"
        ]["name"]


def _containers(obj: dict) -> list[dict]:
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) + spec.get("initContainers", [])


def test_s3_credentials_and_pvc_per_mode():
    for mode in ("gpu", "cpu"):
        container = triton_container(render(mode))
        assert flag(container["args"], "model-repository").startswith("s3://")
        names = {env["name"]: env for env in container["env"]}
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert "secretKeyRef" in names[name]["valueFrom"], name
    local = render("local")
    container = triton_container(local)
    claim = one(local, "PersistentVolumeClaim")["metadata"]["name"]
    volumes = one(local, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"claimName": claim, "readOnly": True} in [v.get("persistentVolumeClaim") for v in volumes]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "models")
    assert flag(container["args"], "model-repository") == mount["mountPath"]
    assert not any(env["name"].startswith("AWS_") for env in container["env"])


def test_gpu_mode_asks_for_a_gpu_and_the_others_do_not():
    for mode in MODES:
        resources = triton_container(render(mode))["resources"]
        gpus = resources["limits"].get("nvidia.com/gpu")
        assert (gpus == 1) == (mode == "gpu"), (mode, resources)


def test_local_mode_runs_one_replica_without_autoscaling():
    objects = render("local")
    assert one(objects, "Deployment")["spec"]["replicas"] == 1
    assert not {"HorizontalPodAutoscaler", "ScaledObject", "PodDisruptionBudget"} & {o["kind"] for o in objects}


@pytest.mark.parametrize("mode", ("gpu", "cpu"))
def test_hpa_scales_the_deployment_on_triton_queue_time(mode, exported_metric_names):
    objects = render(mode)
    deployment = one(objects, "Deployment")
    assert "replicas" not in deployment["spec"]  # the autoscaler owns the count
    hpa = one(objects, "HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        "apps/v1",
        "Deployment",
        deployment["metadata"]["name"],
    )
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["target"]["type"] == "AverageValue"
    rules = yaml.safe_load(
        one(objects, "ConfigMap", f"{RELEASE}-image-classifier-adapter-rules")["data"]["config.yaml"]
    )
    (rule,) = rules["rules"]
    assert rule["name"]["as"] == metric["pods"]["metric"]["name"]
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    _check_query(rule["metricsQuery"], exported_metric_names)
    snippet = yaml.safe_load(
        one(objects, "ConfigMap", f"{RELEASE}-image-classifier-adapter-rules")["data"]["values-snippet.yaml"]
    )
    assert snippet["rules"]["custom"] == rules["rules"]


def test_keda_scales_the_deployment_on_the_same_query(exported_metric_names):
    objects = render("gpu", "autoscaling.kind=keda")
    assert "HorizontalPodAutoscaler" not in {o["kind"] for o in objects}
    scaled = one(objects, "ScaledObject")
    deployment = one(objects, "Deployment")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    assert float(trigger["metadata"]["threshold"]) > 0
    _check_query(trigger["metadata"]["query"], exported_metric_names)
    assert f'pod=~"{deployment["metadata"]["name"]}-.*"' in trigger["metadata"]["query"]


def _check_query(query: str, exported: set[str]):
    """Queue time over successes of the entry model, names our Triton exports."""
    assert re.findall(r"nv_\w+", query) == [QUEUE_US, SUCCESS]
    assert {QUEUE_US, SUCCESS} <= exported, sorted(exported)
    assert f'model=~"{DEFAULT_MODEL}"' in query
    assert "rate(" in query and "delta(" not in query  # counters, not gauges


@pytest.mark.parametrize("mode", MODES)
def test_server_exports_the_launchers_latency_summaries(mode):
    summaries = [arg for arg in triton_container(render(mode))["args"] if arg.startswith("--metrics-config=")]
    assert summaries == summary_metrics_flags()
    launcher = ServerConfig(PROJECT_ROOT / "model_repository").args(Path("backends"), lambda flag: False)
    assert [arg for arg in launcher if arg.startswith("--metrics-config=")] == summaries
    off = triton_container(render(mode, "metrics.summaryLatencies=false"))["args"]
    assert not any(arg.startswith("--metrics-config=") for arg in off)


TRACES = "http://otel-collector.observability:4318/v1/traces"
# The `tritonstack serve` options the chart mirrors: a serve command line, and the chart
# values that must render the same tritonserver flags.
MIRRORED = {
    "--http-port": (["--http-port", "9000"], ["server.ports.http=9000"]),
    "--grpc-port": (["--grpc-port", "9001"], ["server.ports.grpc=9001"]),
    "--metrics-port": (["--metrics-port", "9002"], ["server.ports.metrics=9002"]),
    "--stop-grace-s": (["--stop-grace-s", "45"], ["server.exitTimeoutSeconds=45"]),
    "--no-summary-latencies": (["--no-summary-latencies"], ["metrics.summaryLatencies=false"]),
    "--response-cache-mb": (["--response-cache-mb", "64"], ["server.responseCache.sizeMegabytes=64"]),
    "--trace-otlp": (["--trace-otlp", TRACES], [f"tracing.otlpEndpoint={TRACES}"]),
    "--trace-rate": (
        ["--trace-otlp", TRACES, "--trace-rate", "200"],
        [f"tracing.otlpEndpoint={TRACES}", "tracing.rate=200"],
    ),
}
# The launcher's own policies: the pod runs tritonserver itself, and the kubelet restarts it.
SUPERVISION = "the launcher's supervision, which the pod does not run"
NOT_MIRRORED = {
    "--model-repository": "the chart's own: S3 or the claim's mount path",
    "--models": "server.models, loaded by name (--load-model) with the default ensemble as its default, where "
    "the launcher loads every model unless told",
    "--host": "the pod binds every interface (test_server_binds_every_interface_and_drains_before_the_kill)",
    "--open-apis": "the chart always restricts them (test_admin_apis_are_restricted_with_the_key_from_a_secret)",
    "--max-input-bytes": "told to our backends; the NGC image runs NVIDIA's C++ backends",
    "--latency-objective-ms": "applied by the launcher at load; the pod serves the objective the repository "
    "was built with (`tritonstack build --latency-objective-ms`)",
    "--layout": "applied by the launcher at load; the pod runs tritonserver itself and serves the repository's "
    "layout (docs/kubernetes.md#limits)",
    "--no-pacing": "the pool follows the cores the launcher reads, and the pacing was measured with our backends, "
    "not the C++ ones the pod runs: server.extraArgs takes it (docs/kubernetes.md#limits)",
    "--always-auto-complete": "the NGC image's C++ backends complete a config in process, without a stub: the "
    "pod keeps Triton's default (docs/operations.md#auto-complete)",
    "extra": "tritonserver's own flags, passed as they are: the chart's server.extraArgs",
    **dict.fromkeys(cli.flags(Supervision), SUPERVISION),
}


def serve_flags(argv: list[str]) -> set[str]:
    """What `tritonstack serve ARGV` gives tritonserver (a fixed admin key: comparable)."""
    args = serve.parser().parse_args(["--model-repository", "/models", *argv])
    config = cli.from_args(ServerConfig, args, admin_key="key", extra_args=())
    return set(config.args(Path("backends"), lambda flag: False))


def test_the_chart_renders_each_serve_option_it_mirrors_as_the_launcher():
    """Every serve option is mirrored by a chart value or said not to be; each mirrored
    one changes the rendered flags as it changes the launcher's, and by default both
    render the same (off: the cache, tracing)."""
    assert set(cli.flags(ServerConfig)) | set(cli.flags(Supervision)) == set(MIRRORED) | set(NOT_MIRRORED)
    launcher_default, chart_default = serve_flags([]), set(triton_container(render("cpu"))["args"])
    for option, (argv, values) in MIRRORED.items():
        launcher, chart = serve_flags(argv), set(triton_container(render("cpu", *values))["args"])
        changed = launcher ^ launcher_default
        assert changed, option
        assert chart - chart_default == launcher - launcher_default, option
        assert chart_default - chart == launcher_default - launcher, option
        assert chart_default & changed == launcher_default & changed, option


def test_alerts_read_the_servers_p99_and_refusals(server):
    """The PrometheusRule's expressions parse and name only metrics, quantiles and
    failure reasons the session's real server exports."""
    objects = render("cpu", "metrics.prometheusRule.enabled=true", "metrics.prometheusRule.p99Milliseconds=250")
    (group,) = one(objects, "PrometheusRule")["spec"]["groups"]
    rules = {rule["alert"]: rule for rule in group["rules"]}
    assert set(rules) == {"ImageClassifierP99High", "ImageClassifierRefusing"}
    exported = exported_series(server.metrics_url)
    for name, rule in rules.items():
        assert unexported(rule["expr"], exported) == [], name
        assert rule["for"] and rule["annotations"]["runbook"].startswith("docs/operations.md#"), name
    p99 = rules["ImageClassifierP99High"]["expr"]
    assert 'quantile="0.99"' in p99 and "0.99" in SUMMARY_QUANTILES and p99.rstrip().endswith("> 250")
    assert f'model=~"{DEFAULT_MODEL}"' in p99 and "by (namespace, pod, model)" in p99
    refused = rules["ImageClassifierRefusing"]["expr"]
    assert refused.count(f'reason="{REFUSED_REASON}"') == 2
    guide = (PROJECT_ROOT / "docs" / "operations.md").read_text().splitlines()
    anchors = {line.lstrip("#").strip().lower() for line in guide if line.startswith("#")}
    assert {rule["annotations"]["runbook"].split("#")[1] for rule in rules.values()} <= anchors


def test_locust_workers_reach_the_master_and_the_server():
    objects = render("cpu", "locust.enabled=true")
    master_job = one(objects, "Job", f"{RELEASE}-image-classifier-locust-master")
    master_service = one(objects, "Service", f"{RELEASE}-image-classifier-locust-master")
    workers = one(objects, "Deployment", f"{RELEASE}-image-classifier-locust-worker")
    triton_service = one(objects, "Service", f"{RELEASE}-image-classifier")
    worker_args = one_container(workers)["args"]
    master = one_container(master_job)

    assert flag(worker_args, "master-host") == master_service["metadata"]["name"]
    master_labels = master_job["spec"]["template"]["metadata"]["labels"]
    assert master_service["spec"]["selector"].items() <= master_labels.items()
    (port,) = master_service["spec"]["ports"]
    assert int(flag(worker_args, "master-port")) == port["port"] == int(flag(master["args"], "master-bind-port"))
    assert port["targetPort"] in {p["name"] for p in master["ports"]}
    assert workers["spec"]["replicas"] == int(flag(master["args"], "expect-workers"))

    http = next(p["port"] for p in triton_service["spec"]["ports"] if p["name"] == "http")
    grpc = next(p["port"] for p in triton_service["spec"]["ports"] if p["name"] == "grpc")
    for args in (worker_args, master["args"]):
        assert flag(args, "host") == f"http://{triton_service['metadata']['name']}:{http}"
        assert flag(args, "grpc-url") == f"{triton_service['metadata']['name']}:{grpc}"
        assert "/locust/loadtests/locustfile.py" in args
    # Headless and bounded: the run ends by itself and leaves its reports.
    assert "--headless" in master["args"] and flag(master["args"], "run-time")
    assert master_job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert flag(master["args"], "csv").startswith("/reports/")
    assert "/reports" in {m["mountPath"] for m in master["volumeMounts"]}


def test_locust_configmap_carries_the_projects_own_users():
    objects = render("cpu", "locust.enabled=true")
    data = one(objects, "ConfigMap", f"{RELEASE}-image-classifier-locust")["data"]
    assert set(data) == set(LOADTEST_FILES)
    for name in LOADTEST_FILES:
        assert data[name] == (PROJECT_ROOT / "tritonstack" / "loadtests" / name).read_text(), name
    # Everything the mounted files import from tritonstack.loadtests is mounted too.
    imported = {
        m for text in data.values() for m in re.findall(r"^from tritonstack\.loadtests\.(\w+) import", text, re.M)
    }
    assert {f"{m}.py" for m in imported} <= set(data)
    # What they import from the package (the corpus among it) is in the image's tritonstack.
    from_package = {m for text in data.values() for m in re.findall(r"^from (tritonstack[.\w]*) import", text, re.M)}
    assert "tritonstack.samples.corpus" in from_package
    assert all(importlib.util.find_spec(module) for module in from_package)
    # The Locust image installs what the users import besides (its wheels, then its Dockerfile).
    dockerfile = (PROJECT_ROOT / "deploy" / "locust" / "Dockerfile").read_text()
    assert all(package in dockerfile for package in ("locust", "gevent", "scikit-image", "tritonstack[client]"))
    assert {"locust", "gevent", "scikit-image"} <= set(LOCUST.packages) and LOCUST.extras == "client"


def test_install_command_in_docs_renders():
    """The GPU mode's documented install command is one the chart accepts."""
    doc = (PROJECT_ROOT / "docs" / "kubernetes.md").read_text()
    command = next(line for line in doc.splitlines() if line.startswith("helm install") and "values-gpu" in line)
    args = shlex.split(command.replace("deploy/helm/image-classifier", str(CHART)))
    assert args[:2] == ["helm", "install"]
    helm("template", *args[2:])


def test_local_mode_fill_pod_in_docs_is_a_valid_pod_on_the_charts_claim():
    doc = (PROJECT_ROOT / "docs" / "kubernetes.md").read_text()
    command = next(line for line in doc.splitlines() if line.startswith("kubectl run fill-models"))
    overrides = json.loads(shlex.split(command.split("--overrides=", 1)[1])[0])
    pod = {"kind": "Pod", "metadata": {"name": "fill-models"}, **overrides}
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    (volume,) = pod["spec"]["volumes"]
    claim = one(render("local"), "PersistentVolumeClaim")["metadata"]["name"]
    assert volume["persistentVolumeClaim"]["claimName"] == claim


def test_rendered_locust_pods_run_a_bounded_test_against_the_server(server, tmp_path):
    """The master's and the worker's rendered commands, run here as the pods would:
    users from the ConfigMap's files only, cluster names mapped to loopback."""
    http_port, grpc_port = server.http_url.rsplit(":", 1)[1], server.grpc_url.rsplit(":", 1)[1]
    objects = render(
        "local",
        "locust.enabled=true",
        "locust.workers=1",
        "locust.users=2",
        "locust.spawnRate=2",
        "locust.runTime=4s",
        f"locust.masterPort={free_port(LOOPBACK)}",
        "locust.workersMaxWaitSeconds=60",
        f"server.ports.http={http_port}",
        f"server.ports.grpc={grpc_port}",
        f"locust.extraArgs={{--master-bind-host={LOOPBACK}}}",
    )
    mount = tmp_path / "locust" / "loadtests"
    mount.mkdir(parents=True)
    for name, text in one(objects, "ConfigMap", f"{RELEASE}-image-classifier-locust")["data"].items():
        (mount / name).write_text(text)
    (tmp_path / "reports").mkdir()
    processes = []
    try:
        for workload in (one(objects, "Job"), one(objects, "Deployment", f"{RELEASE}-image-classifier-locust-worker")):
            command, env = _as_here(one_container(workload), tmp_path)
            # cwd: a folder without the project, so only the mounted users are importable.
            processes.append(
                subprocess.Popen(
                    command, cwd=tmp_path, env={**_base_env(), **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
                )
            )
        master, worker = processes
        deadline = time.monotonic() + 120
        while master.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert master.poll() == 0, master.stderr.read().decode()[-3000:] if master.poll() is not None else "hung"
        while worker.poll() is None and time.monotonic() < deadline:  # the master told it to quit
            time.sleep(0.2)
        assert worker.poll() is not None, "the worker did not stop with its master"
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
    with open(tmp_path / "reports" / f"{RELEASE}_stats.csv") as stats:
        total = next(row for row in csv.DictReader(stats) if row["Name"] == "Aggregated")
    assert int(total["Request Count"]) > 0 and int(total["Failure Count"]) == 0, total
    assert (tmp_path / "reports" / f"{RELEASE}.html").is_file()


def _as_here(container: dict, root: Path) -> tuple[list[str], dict[str, str]]:
    """A rendered Locust container's command and environment for this machine: the
    mounts under `root`, the cluster's Service names (the longer first) on loopback."""
    names = {f"{RELEASE}-image-classifier-locust-master": LOOPBACK, f"{RELEASE}-image-classifier": LOOPBACK}
    args = []
    for arg in container["args"]:
        arg = arg.replace("/locust/", f"{root}/locust/").replace("/reports/", f"{root}/reports/")
        for service, address in names.items():
            arg = arg.replace(f"={service}", f"={address}").replace(f"//{service}:", f"//{address}:")
        args.append(arg)
    env = {e["name"]: e["value"].replace("/locust", f"{root}/locust") for e in container.get("env", [])}
    (command,) = container["command"]
    return [str(Path(sys.executable).parent / command), *args], env


def _get(url: str, headers: dict[str, str]) -> str:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
        return response.read().decode()


def test_startup_probe_gives_a_video_ensemble_the_clip_and_others_the_photo():
    models = f"server.models={{{DEFAULT_MODEL},{DEFAULT_VIDEO_MODEL}}}"
    command = triton_container(render("cpu", models))["startupProbe"]["exec"]["command"]
    pairs = [command[i + 1 : i + 3] for i, arg in enumerate(command) if arg == "--model"]
    assert pairs == [[DEFAULT_MODEL, "/warmup/sample.jpg"], [DEFAULT_VIDEO_MODEL, "/warmup/sample_clip.mp4"]]
    assert is_video_model(DEFAULT_VIDEO_MODEL) and not is_video_model(DEFAULT_MODEL)


def _base_env() -> dict[str, str]:
    """This environment without PYTHONPATH: the pod's own decides what imports."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


# The rendered server's exit timeout in the test that runs it (server.exitTimeoutSeconds).
RENDERED_EXIT_TIMEOUT_S = 5


def test_rendered_server_command_serves_with_probes_key_and_graceful_exit(model_repository, tmp_path):
    """The Deployment's tritonserver command line, run with this machine's
    tritonserver (the release of the chart's NGC image) as the pod would run it
    (tests/chart.py), the built repository at the claim's mount path. The exit timeout
    is set short (the value's default, 30 s, is checked against the grace period by
    test_server_binds_every_interface_and_drains_before_the_kill): the stubs stopped
    below leave the DALI step unable to unload, so Triton ends at its exit timeout,
    which this run shows the rendered flag bounds, in 5 s rather than 30."""
    objects = render("local", *free_server_ports(), f"server.exitTimeoutSeconds={RENDERED_EXIT_TIMEOUT_S}")
    container = triton_container(objects)
    key = secrets.token_hex(16)
    ref = next(e for e in container["env"] if e["name"] == ADMIN_KEY_ENV)["valueFrom"]["secretKeyRef"]
    admin = (ref["name"], ref["key"])
    with serve_rendered(container, {admin: key}, tmp_path, repository=str(model_repository)) as served:
        base = f"http://{served.http_url}"
        for probe, path in HEALTH.items():
            assert http_status(base + path) == 200, probe
        # The startup probe: each ensemble of server.models answers the sample once.
        warmed = run_probe(container["startupProbe"], objects, tmp_path / "pod")
        assert warmed.returncode == 0 and f"warmup: {DEFAULT_MODEL} answered" in warmed.stdout, warmed
        # Readiness: ready while it answers; not while the DALI step's stubs are stopped
        # (Triton's own /v2/health/ready still says 200 then), ready again once they go on.
        assert run_probe(container[SAMPLED], objects, tmp_path / "pod").returncode == 0
        stubs = [pid for pid, model in server_stubs(served.process.pid)[0].items() if model.startswith("preprocess_")]
        for pid in stubs:
            os.kill(pid, signal.SIGSTOP)
        try:
            hung = run_probe(container[SAMPLED], objects, tmp_path / "pod")
            assert http_status(base + HEALTH[SAMPLED]) == 200
        finally:
            for pid in stubs:
                os.kill(pid, signal.SIGCONT)
        assert hung.returncode == 1 and "not healthy" in hung.stderr, hung
        stats = json.loads(_get(f"{base}/v2/models/{DEFAULT_MODEL}/stats", {"tritonstack-admin-key": key}))
        assert int(stats["model_stats"][0]["inference_stats"]["success"]["count"]) >= 1
        # The latency summaries the dashboard and alerts read, with the chart's quantiles.
        metrics_url = f"http://{LOOPBACK}:{flag(served.args, 'metrics-port')}/metrics"
        assert exported_series(metrics_url)["nv_inference_request_summary_us"]["quantile"] == set(SUMMARY_QUANTILES)
        # Restricted: statistics answer only with the Secret's key; inference is open.
        assert http_status(f"{base}/v2/models/stats") == 403
        assert http_status(f"{base}/v2/models/stats", {"tritonstack-admin-key": key}) == 200
        with ClassifierClient(served.grpc_url, "grpc") as client:
            top = client.classify([photo_bytes("coffee.png")], top_k=1)[0]
        assert top[0].label in PHOTOS["coffee.png"]
        # SIGTERM (what the kubelet sends after preStop): Triton exits within its
        # exit timeout, inside the grace period the pod grants.
        served.process.send_signal(signal.SIGTERM)
        assert flag(served.args, "exit-timeout-secs") == str(RENDERED_EXIT_TIMEOUT_S)
        served.process.wait(timeout=int(flag(served.args, "exit-timeout-secs")) + 5)


@pytest.mark.parametrize(
    "setting",
    [
        "mode=laptop",
        "server.adminKey.key=sekrit",
        "autoscaling.kind=vpa",
        "locust.runTime=forever",
        "modelRepository.s3.url=gs://bucket/models",
        "tracing.otlpEndpoint=otel-collector:4318",
    ],
)
def test_values_schema_refuses_what_the_chart_cannot_serve(setting):
    """A key in values, an unknown mode or autoscaler, an unbounded Locust run, a
    non-S3 URL: refused at render time, before anything reaches a cluster."""
    done = subprocess.run(
        [str(HELM), "template", RELEASE, str(CHART), "--set", setting], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "values don't meet the specifications of the schema" in done.stderr, (
        setting,
        done.stderr[-500:],
    )


# --- cpu-image mode: our CPU image (deploy/image) running `tritonstack serve` ---

IMAGE_MODE = "cpu-image"


@pytest.mark.parametrize("sets", [(), EVERYTHING], ids=["defaults", "everything"])
def test_the_image_mode_matches_the_kubernetes_schemas_and_lints(sets):
    helm("lint", "--strict", str(CHART), "-f", str(CHART / f"values-{IMAGE_MODE}.yaml"))
    for obj in render(IMAGE_MODE, *sets):
        if (obj["apiVersion"], obj["kind"]) not in CRDS:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_image_mode_runs_the_launcher_and_probes_its_readiness():
    """`tritonstack serve` with the chart's values as its flags (the same ServerConfig the
    command builds), the launcher's /ready and /live as probes, the baked repository."""
    objects = render(IMAGE_MODE, "tracing.otlpEndpoint=" + TRACES, "server.responseCache.sizeMegabytes=64")
    container = triton_container(objects)
    assert container["command"] == ["tritonstack", "serve"]
    args = serve.parser().parse_args(container["args"])
    config = serve.serve_options(args).config
    assert (str(config.model_repository), config.host, config.models) == ("/models", "0.0.0.0", (DEFAULT_MODEL,))
    rendered = config.args(Path("backends"), lambda flag: False)
    assert set(otlp_trace_flags(TRACES)) <= set(rendered) and config.response_cache_bytes == 64 << 20
    health = next(p["containerPort"] for p in container["ports"] if p["name"] == "health")
    assert serve.serve_options(args).supervision.health_port == health
    probes = {name: container[name]["httpGet"] for name in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes == {
        "startupProbe": {"path": "/ready", "port": "health"},
        "readinessProbe": {"path": "/ready", "port": "health"},
        "livenessProbe": {"path": "/live", "port": "health"},
    }
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert {volume["name"] for volume in pod["volumes"]} == {"shm", "tmp"}  # no claim: the image holds it
    assert not [o for o in objects if o["kind"] in ("PersistentVolumeClaim", "ConfigMap") and "warmup" in str(o)]


def test_the_image_modes_command_serves_here_as_rendered(model_repository, tmp_path):
    """The rendered command run here (the built repository for the image's /models,
    loopback for 0.0.0.0): ready on its health port, photos classified, SIGTERM drains."""
    ports = {kind: free_port(LOOPBACK) for kind in ("http", "grpc", "metrics", "health")}
    container = triton_container(render(IMAGE_MODE, *(f"server.ports.{kind}={port}" for kind, port in ports.items())))
    args = [
        arg.replace("=/models", f"={model_repository}").replace("=0.0.0.0", f"={LOOPBACK}") for arg in container["args"]
    ]
    key = secrets.token_hex(8)
    environment = {**_base_env(), ADMIN_KEY_ENV: key}
    launcher = shutil.which("tritonstack", path=str(Path(sys.executable).parent))
    with open(tmp_path / "serve.log", "w") as log:
        process = subprocess.Popen(
            [launcher, "serve", *args], env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        ready = f"http://{LOOPBACK}:{ports['health']}/ready"
        deadline = time.monotonic() + 180
        while http_status(ready) != 200:
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.5)
        assert http_status(f"http://{LOOPBACK}:{ports['health']}/live") == 200
        with ClassifierClient(f"{LOOPBACK}:{ports['grpc']}", "grpc") as client:
            assert client.classify([photo_bytes("coffee.png")], top_k=1)[0][0].label in PHOTOS["coffee.png"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
