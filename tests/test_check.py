"""`build_pipelines.py check` catches each kind of broken repository it claims to,
with one line naming the model, the field and the tensor, and passes the shipped
repository."""

import shutil
import subprocess
import sys

import pytest
from nvidia.dali import fn, pipeline_def, types
from tritonclient.grpc import model_config_pb2 as pb

from tests import repo_factory as rf
from tests.conftest import PROJECT_ROOT
from tests.test_build import build
from tritonstack.build.check import check_repository
from tritonstack.build.model_config import ModelConfig, Tensor, write_config
from tritonstack.repository_files import CONFIG_FILENAME, read_config
from tritonstack.rules import dali as dali_rules
from tritonstack.rules.dali_proto import parse_pipeline

ENSEMBLE = "ensemble_dali_efficientnet_lite0"
PREPROCESS = "preprocess_dali_efficientnet_lite0"
CLASSIFIER = "efficientnet_lite0"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, model_repository):
    out = tmp_path_factory.mktemp("check") / "pristine"
    build(out, "dali_efficientnet_lite0", "python_efficientnet_lite0")
    return out


@pytest.fixture
def repo(pristine, tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(pristine, copy)
    return copy


def edit(repo, model, change):
    config = read_config(repo / model)
    change(config)
    write_config(repo / model, config)


def only_problem(repo):
    problems = [str(problem) for problem in check_repository(repo)]
    assert len(problems) == 1, problems
    assert "\n" not in problems[0] and "; " in problems[0]  # one line: what is wrong; what to do
    return problems[0]


def run_check(repository):
    return subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "build_pipelines.py"), "check", str(repository)],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
    )


def test_shipped_and_built_repositories_are_clean(model_repository, pristine):
    assert check_repository(model_repository) == []
    assert check_repository(pristine) == []


def test_cli_exit_codes(repo):
    assert run_check(repo).returncode == 0
    (repo / CLASSIFIER / "labels.txt").write_text("tabby\n")
    broken = run_check(repo)
    assert broken.returncode == 1
    assert broken.stdout.startswith(f"error: {CLASSIFIER}: output.label_filename 'probabilities'")


def test_unknown_step_output_in_ensemble_map(repo):
    def rename(config):
        step = config.ensemble_scheduling.step[0]
        step.output_map["DALI_OUTPUT_9"] = step.output_map.pop("DALI_OUTPUT_0")

    edit(repo, ENSEMBLE, rename)
    # The unknown name is caught, and so the ensemble's classifier input is unfed.
    problems = [str(p) for p in check_repository(repo)]
    assert problems[0].startswith(
        f"{ENSEMBLE}: ensemble_scheduling.step[0].output_map 'DALI_OUTPUT_9': not an output of {PREPROCESS}"
    )
    assert "DALI_OUTPUT_0" in problems[0]


def test_unknown_step_input_in_ensemble_map(repo):
    def rename(config):
        step = config.ensemble_scheduling.step[1]
        step.input_map["image"] = step.input_map.pop("input")

    edit(repo, ENSEMBLE, rename)
    assert "step[1].input_map 'image': not an input of efficientnet_lite0" in only_problem(repo)


def test_missing_step_model(repo):
    shutil.rmtree(repo / CLASSIFIER)
    problems = [str(p) for p in check_repository(repo)]
    assert problems == [
        f"{ensemble}: ensemble_scheduling.step[1].model_name 'efficientnet_lite0': no such model "
        f"in the repository; build it or use one of {', '.join(sorted(p.name for p in repo.iterdir()))}"
        for ensemble in (ENSEMBLE, "ensemble_python_efficientnet_lite0")
    ]


def test_dims_disagree_along_the_chain(repo):
    def shrink(config):
        config.input[0].dims[1:] = [200, 200]

    edit(repo, CLASSIFIER, shrink)
    problems = [str(p) for p in check_repository(repo)]
    assert any(
        p.startswith(
            f"{ENSEMBLE}: ensemble_scheduling.step[1].input_map 'preprocessed_image': "
            "is FP32 [3, 224, 224] but efficientnet_lite0"
        )
        for p in problems
    ), problems


def test_type_disagrees_with_the_onnx_graph(repo):
    edit(repo, CLASSIFIER, lambda config: setattr(config.input[0], "data_type", pb.TYPE_FP16))
    problems = [str(p) for p in check_repository(repo)]
    assert (
        f"{CLASSIFIER}: input.data_type 'input': config says TYPE_FP16, the graph TYPE_FP32; set data_type: TYPE_FP32"
        in problems
    )
    assert any("step[1].input_map 'preprocessed_image'" in p for p in problems)


def test_ensemble_batch_larger_than_a_step(repo):
    edit(repo, ENSEMBLE, lambda config: setattr(config, "max_batch_size", 64))
    problems = [str(p) for p in check_repository(repo)]
    assert f"{ENSEMBLE}: max_batch_size '{PREPROCESS}': ensemble has 64, step model 32" in problems[0]


def test_dali_input_not_an_external_source(repo):
    edit(repo, PREPROCESS, lambda config: setattr(config.input[0], "name", "IMAGE"))
    problems = [str(p) for p in check_repository(repo)]
    assert (
        f"{PREPROCESS}: input 'IMAGE': no external source of the pipeline has this name; "
        "rename it to one of DALI_INPUT_0" in problems
    )


@pytest.mark.parametrize("filename, bad", [('model".dali', '"'), ("model dali", " "), ("../model.dali", "/")])
def test_model_file_name_the_cpp_backend_refuses(repo, filename, bad):
    """dali_backend src/utils/utils.h, ValidateFilename; a server cannot refuse the
    quote or the space itself: Triton's Python backend never starts the stub."""
    edit(repo, PREPROCESS, lambda config: setattr(config, "default_model_filename", filename))
    problem = only_problem(repo)
    assert f"Model file name '{filename}' contains an invalid character: '{bad}'" in problem, problem


def test_dali_output_count(repo):
    edit(repo, PREPROCESS, lambda config: config.output.add(name="DALI_OUTPUT_1", data_type=pb.TYPE_FP32, dims=[1]))
    assert "config has 2 outputs, the pipeline has 1" in only_problem(repo)


def test_dali_output_type_and_rank(repo):
    def damage(config):
        config.output[0].data_type = pb.TYPE_UINT8
        del config.output[0].dims[2]

    edit(repo, PREPROCESS, damage)
    problems = [str(p) for p in check_repository(repo) if p.model == PREPROCESS]
    assert (
        f"{PREPROCESS}: output.data_type 'DALI_OUTPUT_0': data type mismatch: config says TYPE_UINT8, "
        "the pipeline's output 0 gives TYPE_FP32; set data_type: TYPE_FP32" in problems
    )
    assert any("output.dims 'DALI_OUTPUT_0': rank mismatch: config dims [3, 224] (rank 2)" in p for p in problems)


def test_gpu_pipeline_on_cpu_instances(tmp_path, model_repository):
    out = tmp_path / "gpu"
    build(out, "dali_efficientnet_lite0", "--device", "gpu")
    edit(out, PREPROCESS, lambda config: setattr(config.instance_group[0], "kind", pb.ModelInstanceGroup.KIND_CPU))
    assert (
        "instance_group: KIND_CPU instances cannot run GPU operators image (decoders__Image, device='mixed')"
        in only_problem(out)
    )


def test_label_file_line_count(repo):
    labels = repo / ENSEMBLE / "labels.txt"
    labels.write_text("".join(labels.read_text().splitlines(keepends=True)[:999]))
    assert only_problem(repo).startswith(
        f"{ENSEMBLE}: output.label_filename 'OUTPUT': labels.txt has 999 lines but the output has 1000 classes"
    )


def test_missing_model_file(repo):
    (repo / PREPROCESS / "1/model.dali").unlink()
    assert only_problem(repo).startswith(f"{PREPROCESS}: model file '1': none of model.dali, dali.py in 1/")


def test_random_bytes_warmup(repo):
    import os

    sample = repo / "preprocess_python_efficientnet_lite0/warmup/sample.jpg"
    sample.write_bytes(os.urandom(sample.stat().st_size))
    assert "warmup/sample.jpg is not a decodable image" in only_problem(repo)


def test_warmup_size_disagrees_with_dims(repo):
    sample = repo / PREPROCESS / "warmup/sample.jpg"
    sample.write_bytes(sample.read_bytes() + b"\0")
    assert "dims [35042] need 35042" in only_problem(repo)


def test_folder_without_config(repo):
    (repo / "leftover").mkdir()
    assert only_problem(repo).startswith("leftover: config.pbtxt: missing")


def test_unbuilt_or_missing_repository_exits_2_in_one_line(model_repository, tmp_path):
    from tests.test_launcher_cli import fresh_clone_repository

    unbuilt = run_check(fresh_clone_repository(model_repository, tmp_path / "clone"))
    assert unbuilt.returncode == 2
    assert unbuilt.stdout == "" and len(unbuilt.stderr.splitlines()) == 1 and "run `make build`" in unbuilt.stderr
    missing = run_check(tmp_path / "nonexistent")
    assert (
        missing.returncode == 2 and "nonexistent: no such folder" in missing.stderr and "make build" in missing.stderr
    )


# --- the rules the tests above leave out, one test each --------------------------


def problems_of(repo) -> list[str]:
    return [str(problem) for problem in check_repository(repo)]


def test_unparsable_config(repo):
    (repo / CLASSIFIER / CONFIG_FILENAME).write_text('name: "efficientnet_lite0"\ninput {{ oops')
    assert any(p.startswith(f"{CLASSIFIER}: config.pbtxt: does not parse:") for p in problems_of(repo)), problems_of(
        repo
    )


def test_name_differs_from_the_folder(repo):
    edit(repo, CLASSIFIER, lambda config: setattr(config, "name", "other_name"))
    assert (
        f"{CLASSIFIER}: name 'other_name': differs from the folder name; rename the folder or set "
        f'name: "{CLASSIFIER}"' in problems_of(repo)
    )


def test_no_version_folder(repo):
    shutil.rmtree(repo / CLASSIFIER / "1")
    assert any(
        p.startswith(f"{CLASSIFIER}: version folder: no numeric version folder (e.g. 1/)") for p in problems_of(repo)
    ), problems_of(repo)


def test_missing_warmup_file(repo):
    (repo / PREPROCESS / "warmup/sample.jpg").unlink()
    assert "warmup/sample.jpg is missing" in only_problem(repo)


def test_invalid_model_dali(repo):
    (repo / PREPROCESS / "1/model.dali").write_bytes(b"this is not a serialized pipeline")
    assert only_problem(repo).startswith(f"{PREPROCESS}: model.dali: is not a serialized DALI pipeline (")


def test_pipeline_external_source_without_config_input(repo):
    """The other half of 'inputs by name, both ways'. Auto-complete adds a source the
    config leaves out, as the C++ backend's does (dali_backend
    src/config_tools/config_tools.cc, AutofillConfig), so check accepts it; with
    auto-complete off (Triton's --disable-auto-complete-config) the backend applies
    the rule to the config as written."""
    config = rf.dali_config(
        "two_sources",
        inputs=(Tensor("A", "FP32", (-1,)),),
        outputs=(Tensor("SUM", "FP32", (-1,)), Tensor("PRODUCT", "FP32", (-1,))),
    )
    pipeline = rf.serialized(rf.two_in_two_out_pipeline)
    rf.write_model(repo, config, {"model.dali": pipeline})
    assert problems_of(repo) == []
    written = {
        "name": "two_sources",
        "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [
            {"name": "SUM", "data_type": "TYPE_FP32", "dims": [-1]},
            {"name": "PRODUCT", "data_type": "TYPE_FP32", "dims": [-1]},
        ],
    }
    assert (
        "two_sources: input 'B': the pipeline's external source has no config input; add an input "
        "named 'B' (config inputs: A)" in [str(p) for p in dali_rules.dali_problems(written, parse_pipeline(pipeline))]
    )


@pipeline_def(batch_size=1, num_threads=1, device_id=None)
def reshape_to_seven():
    encoded = fn.external_source(name="DALI_INPUT_0", dtype=types.UINT8, ndim=1)
    return fn.reshape(fn.decoders.image(encoded, device="cpu"), shape=[7])  # no image has 7 values


def test_pipeline_failing_on_a_real_jpeg(repo):
    (repo / PREPROCESS / "1/model.dali").write_bytes(reshape_to_seven().serialize())
    problem = only_problem(repo)
    assert problem.startswith(f"{PREPROCESS}: model.dali: fails on a real JPEG: "), problem
    assert "Critical error in pipeline:;" not in problem and "reshape" in problem.lower(), problem


def test_onnx_tensor_name_not_in_the_graph(repo):
    edit(repo, CLASSIFIER, lambda config: setattr(config.input[0], "name", "pixels"))
    assert any(
        p.startswith(f"{CLASSIFIER}: input 'pixels': is not in the ONNX graph; use one of the graph's inputs: input")
        for p in problems_of(repo)
    ), problems_of(repo)


def test_onnx_dims_disagree_with_the_graph(repo):
    edit(repo, CLASSIFIER, lambda config: config.input[0].dims.__setitem__(1, 225))
    assert any(
        p.startswith(f"{CLASSIFIER}: input.dims 'input': shape mismatch: config [batch] + [3, 225, 224]")
        for p in problems_of(repo)
    ), problems_of(repo)


def test_ensemble_output_no_step_produces(repo):
    edit(repo, ENSEMBLE, lambda config: config.output.add(name="EXTRA", data_type=pb.TYPE_FP32, dims=[1]))
    assert f"{ENSEMBLE}: output 'EXTRA': no step's output_map produces it; map a step output to it" in problems_of(repo)


def test_check_completes_configs_as_the_backends_do(tmp_path):
    """The same auto-complete rules offline (tritonstack.rules): a config-less
    `<name>.dali` folder and partial configs pass; what the backends would refuse
    at load is refused here, with the same words."""
    from tests import repo_factory as rf
    from tests.test_foreign_repositories import MODELS

    for model in ("no_config_file.dali", "onnx_bare", "onnx_inputs_only", "onnx_cannot_batch", "onnx_listed_untyped"):
        for relative, content in MODELS[model].items():
            path = tmp_path / model / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode() if isinstance(content, str) else content)
    # No instance group: check runs only KIND_CPU pipelines, on a JPEG (these take floats).
    partial = ModelConfig(
        name="partial_dali", backend="dali", inputs=(Tensor("A", "FP32", ()),), outputs=(), max_batch_size=None
    )
    rf.write_model(tmp_path, partial, {"model.dali": rf.serialized(rf.two_in_two_out_pipeline)})
    problems = sorted(str(problem) for problem in check_repository(tmp_path))
    assert len(problems) == 2, problems
    assert problems[0].startswith("onnx_cannot_batch: max_batch_size") and "cannot batch" in problems[0]
    assert problems[1].startswith("onnx_listed_untyped: input.data_type 'X'") and "TYPE_FP32" in problems[1]
