"""Pacing (tritonstack.pacing): the slots each step's instances hold, as the build
writes them and the layout changes them, and the pool tritonserver is started with.
The served behaviour (refusals within the objective under overload) is measured by
`tritonstack overload`: docs/performance.md#overload."""

from pathlib import Path

from tritonstack import pacing
from tritonstack.build.model_config import write_config
from tritonstack.build.scheduling import step_instances
from tritonstack.repository_files import config_dict, read_config
from tritonstack.serve.layout import StepLayout, with_layout
from tritonstack.serve.server_config import ServerConfig

PROJECT_ROOT = Path(__file__).resolve().parents[1]
COMMITTED = PROJECT_ROOT / "model_repository"


def committed_configs() -> dict[str, dict]:
    return {path.parent.name: config_dict(read_config(path.parent)) for path in COMMITTED.glob("*/config.pbtxt")}


def slots(config: dict) -> int:
    return max(
        (
            int(resource["count"])
            for group in config.get("instance_group", [])
            for resource in group.get("rate_limiter", {}).get("resources", [])
            if resource["name"] == pacing.CPU_SLOTS and resource.get("global")
        ),
        default=0,
    )


def test_each_step_the_objective_bounds_holds_its_slots_in_the_committed_repository():
    configs = committed_configs()
    ensembles = [config for config in configs.values() if "ensemble_scheduling" in config]
    checked = 0
    for ensemble in ensembles:
        first, *later = (step["model_name"] for step in ensemble["ensemble_scheduling"]["step"])
        assert slots(configs[first]) == pacing.FIRST_STEP_SLOTS, first
        for name in later:
            step = configs[name]
            threads = int(step.get("parameters", {}).get("intra_op_thread_count", {}).get("string_value", 0))
            expected = pacing.step_slots(first_step=False, threads=threads) if "dynamic_batching" in step else 0
            assert slots(step) == expected, name  # a step without a queue (the VAD's segments) holds none
        checked += 1
    assert checked >= 6


def test_a_gpus_instances_hold_no_slots():
    assert step_instances(2, "KIND_GPU", first_step=True).to_proto().HasField("rate_limiter") is False
    group = step_instances(2, "KIND_CPU", threads=3).to_proto()
    assert [(r.name, r.count, getattr(r, "global")) for r in group.rate_limiter.resources] == [("cpu_slots", 6, True)]


def test_the_pool_is_two_slots_a_core_and_never_below_one_instances_claim():
    assert pacing.pool_slots(2) == 4
    assert pacing.pool_slots(16) == 32
    assert pacing.pool_slots(0) == 2
    assert pacing.pool_slots(2, largest_claim=8) == 8  # else Triton refuses to load that model


def test_a_layout_gives_a_classifiers_instances_the_slots_of_their_threads():
    configs = committed_configs()
    classifier = with_layout(configs["efficientnet_lite0"], StepLayout(4, 3))
    assert slots(classifier) == 6 and classifier["instance_group"][0]["count"] == 4
    first_step = with_layout(configs["preprocess_dali_efficientnet_lite0"], StepLayout(2, 8))
    assert slots(first_step) == pacing.FIRST_STEP_SLOTS


def flags(config: ServerConfig) -> list[str]:
    return [arg for arg in config.args(Path("/backends"), lambda flag: True) if arg.startswith("--rate-limit")]


def test_the_launcher_starts_tritonserver_with_the_pool_unless_told_otherwise(tmp_path):
    repository = tmp_path / "repository"
    (repository / "wide").mkdir(parents=True)
    config = read_config(COMMITTED / "efficientnet_lite0")
    config.instance_group[0].rate_limiter.resources[0].count = 64  # a classifier of 32 threads
    write_config(repository / "wide", config)
    (repository / "broken").mkdir()
    (repository / "broken" / "config.pbtxt").write_text("not { a config")

    assert flags(ServerConfig(repository)) == ["--rate-limit=execution_count", "--rate-limit-resource=cpu_slots:64"]
    assert flags(ServerConfig(repository, pacing=False)) == []
    assert flags(ServerConfig(repository, extra_args=("--rate-limit=off",))) == ["--rate-limit=off"]
