"""The layout follows the cores it gets (tritonstack.serve.layout): the rule over
several core counts, the committed repository's layout on 2 cores, the cores read
from the affinity and a cgroup's CPU quota, the steps left alone, the option, and a
real server pinned to one CPU serving the layout of one core with its files unchanged."""

from __future__ import annotations

import contextlib
import dataclasses
import os

import pytest
import tritonclient.http as httpclient

from tests.conftest import FUNCTIONAL_BUILD, MODEL_REPOSITORY, TEST_STOP_GRACE_S
from tritonstack import cli
from tritonstack.client.classifier import ClassifierClient
from tritonstack.commands import serve
from tritonstack.objective import queue_ceiling_us
from tritonstack.repository_files import CONFIG_FILENAME, config_dict, read_config
from tritonstack.samples.photos import photo_bytes
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.layout import (
    CORES_LAYOUT,
    REPOSITORY_LAYOUT,
    THREAD_PARAMETERS,
    Cores,
    StepLayout,
    cgroup_cpu_quota,
    overridden,
    read_cores,
    step_layouts,
    with_layout,
)
from tritonstack.serve.server_config import ServerConfig

# cores -> (DALI instances x threads, classifier instances x threads, Pillow step instances)
EXPECTED = {
    1: ((2, 2), (2, 1), 2),
    2: ((2, 2), (2, 1), 2),
    4: ((2, 4), (4, 1), 2),
    8: ((2, 8), (8, 1), 4),
    16: ((2, 16), (8, 2), 8),
    64: ((2, 16), (8, 8), 8),
}


@pytest.mark.parametrize("cores", sorted(EXPECTED))
def test_the_rule_sizes_each_step_from_the_cores(cores):
    dali, classifier, python = EXPECTED[cores]
    layouts = step_layouts(cores)
    assert layouts["dali"] == StepLayout(*dali)
    assert layouts["onnxruntime"] == StepLayout(*classifier)
    assert layouts["python"] == StepLayout(python, None)
    # Every core a classifier thread, and never more threads an instance than cores (two at least).
    assert layouts["onnxruntime"].instances * layouts["onnxruntime"].threads == max(cores, 2)
    assert all((layout.threads or 1) <= max(cores, 2) for layout in layouts.values())
    assert all(layout.instances >= 2 for layout in layouts.values())


def test_no_layout_for_no_core():
    with pytest.raises(ValueError):
        step_layouts(0)


def committed_configs() -> list[dict]:
    return [config_dict(read_config(folder)) for folder in sorted(MODEL_REPOSITORY.iterdir()) if folder.is_dir()]


def test_on_1_and_2_cores_the_committed_repository_is_the_layout_and_nothing_is_reloaded():
    configs = committed_configs()
    assert overridden(configs, step_layouts(1)) == overridden(configs, step_layouts(2)) == []
    # Not vacuous: every preprocessing step and classifier of the repository is sized.
    sized = {config["name"] for config in overridden(configs, step_layouts(8))}
    steps = {config["name"] for config in configs if config.get("backend") in ("dali", "onnxruntime", "python")}
    assert sized == steps


def cpu_slots(count: int) -> dict:
    return {"rate_limiter": {"resources": [{"name": "cpu_slots", "global": True, "count": count}]}}


def test_a_layout_changes_instances_the_threads_parameter_and_a_classifiers_slots_only():
    configs = {config["name"]: config for config in committed_configs()}
    changed = {config["name"]: config for config in overridden(list(configs.values()), step_layouts(16))}
    dali, classifier = changed["preprocess_dali_efficientnet_lite0"], changed["efficientnet_lite0"]
    assert dali["parameters"]["num_threads"] == {"string_value": "16"}
    assert dali["instance_group"] == [{"count": 2, "kind": "KIND_CPU"} | cpu_slots(1)]  # a first step's: one
    assert classifier["parameters"]["intra_op_thread_count"] == {"string_value": "2"}
    assert classifier["instance_group"] == [{"count": 8, "kind": "KIND_CPU"} | cpu_slots(4)]  # two a thread
    python = changed["preprocess_python_efficientnet_lite0"]
    assert python["parameters"] == configs["preprocess_python_efficientnet_lite0"]["parameters"]
    for name, config in changed.items():
        assert unsized(config) == unsized(configs[name]), name


def unsized(config: dict) -> dict:
    """A config without what a layout sizes: its instances and its thread parameter."""
    parameters = {
        key: value for key, value in config.get("parameters", {}).items() if key not in THREAD_PARAMETERS.values()
    }
    return {key: value for key, value in config.items() if key not in ("instance_group", "parameters")} | {
        "parameters": parameters
    }


def step(name: str, backend: str, kind: str = "KIND_CPU", groups: int = 1) -> dict:
    return {"name": name, "backend": backend, "instance_group": [{"count": 1, "kind": kind}] * groups}


def ensemble_of(*steps: dict) -> dict:
    return {
        "name": "ensemble",
        "platform": "ensemble",
        "ensemble_scheduling": {"step": [{"model_name": config["name"]} for config in steps]},
    }


def test_other_backends_gpu_instances_and_models_of_no_ensemble_are_left_alone():
    ours = step("ours", "onnxruntime")
    left = [step("foreign", "openvino"), step("gpu", "onnxruntime", "KIND_GPU"), step("two", "dali", groups=2)]
    alone = step("alone", "onnxruntime")
    changed = overridden([ensemble_of(ours, *left), ours, *left, alone], step_layouts(4))
    assert changed == [with_layout(ours, step_layouts(4)["onnxruntime"])]


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "400000 100000\n"}, 4.0),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "250000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.5),
        ({"cpu,cpuacct/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 0.5),
        ({"cpu.max": "not a quota\n"}, None),
        ({}, None),
    ],
)
def test_the_cgroup_quota_is_read_from_v2_or_v1(tmp_path, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == quota


@pytest.mark.parametrize(
    ("affinity", "quota", "usable"), [(8, None, 8), (8, 1.5, 2), (2, 4.0, 2), (4, 0.5, 1), (64, 16.0, 16)]
)
def test_the_usable_cores_are_the_affinity_within_the_quota(affinity, quota, usable):
    assert Cores(affinity, quota).usable == usable


def test_the_cores_read_are_this_process_affinity_within_its_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert read_cores(tmp_path) == Cores(len(os.sched_getaffinity(0)), 1.0)
    assert read_cores(tmp_path).usable == 1


def test_serve_sizes_by_the_cores_unless_told_to_keep_the_repository():
    def config_of(*argv: str) -> ServerConfig:
        return cli.from_args(ServerConfig, serve.parser().parse_args(["--model-repository", "/models", *argv]))

    assert config_of().layout == CORES_LAYOUT
    assert config_of("--layout", "repository").layout == REPOSITORY_LAYOUT
    assert ServerConfig("/models").layout == REPOSITORY_LAYOUT  # a server started in code: the repository's
    with pytest.raises(ValueError):
        ServerConfig("/models", layout="fastest")


@contextlib.contextmanager
def one_cpu():
    """This thread, and the processes it starts, on one CPU: the affinity the launcher reads."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@pytest.fixture(scope="module")
def one_thread_repository(tmp_path_factory):
    """dali_efficientnet_lite0 built with one classifier instance and one DALI instance
    of one thread: a layout the rule changes on any number of cores."""
    from tests import repo_factory as rf
    from tritonstack.build.presets import preset_named
    from tritonstack.build.repository import write_repository

    out = tmp_path_factory.mktemp("one_thread")
    rf.seed_lite0_export(out)
    options = dataclasses.replace(FUNCTIONAL_BUILD, classifier_instances=1, instances=1, num_threads=1)
    write_repository(out, presets=(preset_named("dali_efficientnet_lite0"),), options=options)
    return out


def test_a_server_on_one_cpu_serves_the_layout_of_one_core_and_leaves_the_files(one_thread_repository):
    """With an objective applied at load too: a step both change is loaded again once, with both."""
    repository = one_thread_repository
    files = {path: path.read_bytes() for path in repository.glob(f"*/{CONFIG_FILENAME}")}
    objective_ms = 20_000  # not the repository's
    config = ServerConfig(
        repository, stop_grace_s=TEST_STOP_GRACE_S, layout=CORES_LAYOUT, latency_objective_ms=objective_ms
    )
    with one_cpu():
        server = TritonServer(config).start()
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            classifier = client.get_model_config("efficientnet_lite0")
            dali = client.get_model_config("preprocess_dali_efficientnet_lite0")
        with ClassifierClient(server.http_url, "http") as classifier_client:  # the ensemble serves on the new steps
            assert classifier_client.classify([photo_bytes("coffee.png")], top_k=1)[0][0].label == "espresso"
        log = server.log_path.read_text(errors="replace")
    finally:
        server.stop()
    for step in ("efficientnet_lite0", "preprocess_dali_efficientnet_lite0"):
        assert log.count(f"successfully loaded '{step}'") == 2, step  # at start, then once with both changes
    policy = classifier["dynamic_batching"]["default_queue_policy"]
    assert int(policy["default_timeout_microseconds"]) == queue_ceiling_us(objective_ms, first_step=False)
    layouts = step_layouts(1)
    assert classifier["instance_group"][0]["count"] == layouts["onnxruntime"].instances == 2
    assert classifier["parameters"]["intra_op_thread_count"]["string_value"] == "1"
    assert dali["instance_group"][0]["count"] == layouts["dali"].instances == 2
    assert dali["parameters"]["num_threads"]["string_value"] == str(layouts["dali"].threads) == "2"
    assert {path: path.read_bytes() for path in repository.glob(f"*/{CONFIG_FILENAME}")} == files
    assert read_config(repository / "efficientnet_lite0").instance_group[0].count == 1  # never written
