"""build_pipelines.py build/list and its options, by inspecting what it writes;
a bring-your-own classifier is built, checked and served."""

import io
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from nvidia.dali import Pipeline
from tritonclient.grpc import model_config_pb2 as pb

from tests import reference
from tests import repo_factory as rf
from tests.conftest import MODEL_REPOSITORY, PROJECT_ROOT
from tritonstack.build import pipelines
from tritonstack.build.check import check_repository
from tritonstack.build.model_config import write_config
from tritonstack.build.presets import PRESETS
from tritonstack.client.classifier import ClassifierClient
from tritonstack.commands.build import main
from tritonstack.contract import PREPROCESS_INPUT, PREPROCESS_OUTPUT, pad_batch
from tritonstack.objective import DEFAULT_OBJECTIVE_MS, OBJECTIVE_PARAMETER
from tritonstack.repository_files import read_config
from tritonstack.rules import dali_proto
from tritonstack.samples.photos import photo_bytes, sample_jpeg
from tritonstack.serve.launcher import TritonServer

LITE0 = "efficientnet_lite0"
PREPROCESS = "preprocess_dali_efficientnet_lite0"


def build(out, *args):
    rf.seed_lite0_export(out)
    assert main(["build", "--out", str(out), *args]) == 0


def autoserialized(script, folder) -> bytes:
    """What the DALI backend serializes at load from a model's `dali.py`."""
    import importlib.util

    from nvidia.dali._utils.autoserialize import invoke_autoserialize

    spec = importlib.util.spec_from_file_location(f"autoserialize_{Path(folder).name}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    invoke_autoserialize(module, str(Path(folder) / "autoserialized.dali"))
    return (Path(folder) / "autoserialized.dali").read_bytes()


def run_pipeline(serialized, image):
    pipeline = Pipeline.deserialize(
        serialized_pipeline=serialized, batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1
    )
    pipeline.build()
    pipeline.feed_input(PREPROCESS_INPUT, list(pad_batch([image])))
    return np.asarray(pipeline.run()[0].as_tensor())


def test_list_names_every_preset(capsys, model_repository):
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    for preset in PRESETS:
        assert preset.ensemble_name in listed and preset.preprocessing_name in listed
    assert "(260, 297)" in listed  # Lite2's own resolution


def test_options_reach_the_configs_and_the_pipeline(tmp_path, model_repository):
    out = tmp_path / "repo"
    build(
        out,
        "dali_efficientnet_lite0",
        "--max-batch-size",
        "8",
        "--instances",
        "2",
        "--num-threads",
        "3",
        "--intra-op-threads",
        "2",
        "--max-queue-delay-us",
        "500",
    )
    assert sorted(p.name for p in out.iterdir()) == sorted([LITE0, PREPROCESS, "ensemble_dali_efficientnet_lite0"])
    for model in out.iterdir():
        config = read_config(model)
        assert config.max_batch_size == 8
        if model.name != "ensemble_dali_efficientnet_lite0":
            assert config.instance_group[0].count == 2
            assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert read_config(out / PREPROCESS).parameters["num_threads"].string_value == "3"
    assert read_config(out / LITE0).parameters["intra_op_thread_count"].string_value == "2"
    assert (out / PREPROCESS / "1/model.dali.version").read_text() == f"{pipelines.DALI_VERSION}\n"
    assert check_repository(out) == []


def test_classifier_batch_is_a_cpu_preference_below_max_batch_size(tmp_path, model_repository):
    for args, preferred, first_step in (
        # The first step forms batches of 4 whatever the classifier's: smaller ones refuse
        # sooner under overload, and fewer fall behind at its low priority.
        (("--classifier-batch", "16"), [16], [4]),
        (("--classifier-batch", "4"), [4], [4]),
        (("--classifier-batch", "1"), [1], [4]),
        (("--classifier-batch", "0"), [], []),
        # A classifier batch of max_batch_size is no preference; the first step's 4 still is.
        (("--max-batch-size", "8"), [], [4]),
        (("--device", "gpu"), [], []),
    ):
        out = tmp_path / "-".join(args)
        build(out, "dali_efficientnet_lite0", *args)
        assert list(read_config(out / LITE0).dynamic_batching.preferred_batch_size) == preferred, args
        assert list(read_config(out / PREPROCESS).dynamic_batching.preferred_batch_size) == first_step, args


def test_classifier_instances_split_the_cores_between_classifier_processes(tmp_path, model_repository):
    for args, classifier_count, preprocess_count in (
        ((), 2, 2),
        (("--classifier-instances", "1", "--intra-op-threads", "2"), 1, 2),
        (("--instances", "3"), 2, 3),
        (("--instances", "3", "--classifier-instances", "0"), 3, 3),
    ):
        out = tmp_path / ("-".join(args) or "default")
        build(out, "dali_efficientnet_lite0", *args)
        assert read_config(out / LITE0).instance_group[0].count == classifier_count, args
        assert read_config(out / PREPROCESS).instance_group[0].count == preprocess_count, args
        assert check_repository(out) == [], args


def test_every_steps_queue_ceiling_derives_from_the_latency_objective(tmp_path, model_repository):
    """What a step starts can still be answered within the objective, whatever the
    client sends: the first step's ceiling and the later step's together leave room
    for the computing; the objective is recorded on the ensemble."""
    out = tmp_path / "default"
    build(out, "dali_efficientnet_lite0")
    first = read_config(out / PREPROCESS).dynamic_batching.default_queue_policy
    later = read_config(out / LITE0).dynamic_batching.default_queue_policy
    objective_us = DEFAULT_OBJECTIVE_MS * 1000
    assert first.max_queue_size == later.max_queue_size == 0
    assert first.allow_timeout_override and later.allow_timeout_override  # a client's shorter timeout wins
    assert first.timeout_action == later.timeout_action == first.REJECT
    assert 0 < later.default_timeout_microseconds < first.default_timeout_microseconds
    assert first.default_timeout_microseconds + later.default_timeout_microseconds <= 0.6 * objective_us
    ensemble = read_config(out / "ensemble_dali_efficientnet_lite0")
    assert ensemble.parameters[OBJECTIVE_PARAMETER].string_value == str(DEFAULT_OBJECTIVE_MS)
    tuned = tmp_path / "tuned"
    build(tuned, "dali_efficientnet_lite0", "--max-queue-size", "4", "--latency-objective-ms", "500")
    tuned_first = read_config(tuned / PREPROCESS).dynamic_batching.default_queue_policy
    assert tuned_first.max_queue_size == 4
    assert tuned_first.default_timeout_microseconds == first.default_timeout_microseconds // 2
    off = tmp_path / "off"
    build(off, "dali_efficientnet_lite0", "--max-queue-size", "0", "--latency-objective-ms", "0")
    for model in (PREPROCESS, LITE0):
        assert not read_config(off / model).dynamic_batching.HasField("default_queue_policy"), model
    assert OBJECTIVE_PARAMETER not in read_config(off / "ensemble_dali_efficientnet_lite0").parameters


def test_warmup_is_a_real_jpeg_of_the_declared_size(model_repository):
    from PIL import Image

    for name in (PREPROCESS, "preprocess_python_efficientnet_lite0", "preprocess_dali_efficientnet_lite2"):
        config = read_config(model_repository / name)
        (tensor,) = config.model_warmup[0].inputs.values()
        sample = (model_repository / name / "warmup" / tensor.input_data_file).read_bytes()
        assert sample == sample_jpeg() and list(tensor.dims) == [len(sample)]
        assert Image.open(io.BytesIO(sample)).format == "JPEG"


def test_gpu_variant_serializes_here_with_gpu_operators(tmp_path, model_repository):
    out = tmp_path / "gpu"
    build(out, "dali_efficientnet_lite0", "python_efficientnet_lite0", "--device", "gpu")
    kinds = {model.name: read_config(model).instance_group for model in out.iterdir()}
    assert kinds[PREPROCESS][0].kind == kinds[LITE0][0].kind == pb.ModelInstanceGroup.KIND_GPU
    assert kinds["preprocess_python_efficientnet_lite0"][0].kind == pb.ModelInstanceGroup.KIND_CPU
    serialized = (out / PREPROCESS / "1/model.dali").read_bytes()
    spec = dali_proto.parse_pipeline(serialized)
    assert spec.gpu_operators == ("image(mixed)", "resize_crop_mirror(gpu)", "crop_mirror_normalize(gpu)")
    assert spec.outputs[0].device == "gpu" and b"hw_decoder_load" in serialized
    (tensorrt,) = read_config(out / LITE0).optimization.execution_accelerators.gpu_execution_accelerator
    assert (tensorrt.name, tensorrt.parameters["precision_mode"]) == ("tensorrt", "FP16")
    assert not read_config(MODEL_REPOSITORY / LITE0).HasField("optimization")  # the CPU variant asks for none
    assert check_repository(out) == []


def test_cpu_backend_loads_a_classifier_that_asks_for_tensorrt(tmp_path, model_repository):
    # The GPU variant's classifier config, served on KIND_CPU by our onnxruntime
    # backend: the accelerator block is accepted and ignored, results unchanged.
    out = tmp_path / "gpu"
    build(out, "dali_efficientnet_lite0", "--device", "gpu")
    config = read_config(out / LITE0)
    config.instance_group[0].kind = pb.ModelInstanceGroup.KIND_CPU
    repository = tmp_path / "served"
    shutil.copytree(MODEL_REPOSITORY / LITE0, repository / LITE0)
    write_config(repository / LITE0, config)
    with TritonServer(repository) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        served = client.get_model_config(LITE0)
        assert served["optimization"]["execution_accelerators"]["gpu_execution_accelerator"][0]["name"] == "tensorrt"
        image = np.zeros((1, 3, 224, 224), np.float32)
        request = httpclient.InferInput("input", list(image.shape), "FP32")
        request.set_data_from_numpy(image)
        probabilities = client.infer(LITE0, [request]).as_numpy("probabilities")
        client.close()
    import onnxruntime as ort

    reference = ort.InferenceSession(
        str(repository / LITE0 / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    ).run(None, {"input": image})[0]
    np.testing.assert_allclose(probabilities, reference, atol=1e-5)


def test_dali_py_format_autoserializes_to_the_same_pipeline(tmp_path, model_repository):
    out = tmp_path / "py"
    build(out, "dali_efficientnet_lite0", "--format", "dali.py")
    version_dir = out / PREPROCESS / "1"
    assert sorted(p.name for p in version_dir.iterdir()) == ["dali.py", "preprocessing.json"]
    image = photo_bytes("chelsea.png")
    shipped = (MODEL_REPOSITORY / PREPROCESS / "1/model.dali").read_bytes()
    np.testing.assert_array_equal(
        run_pipeline(autoserialized(version_dir / "dali.py", tmp_path), image), run_pipeline(shipped, image)
    )
    assert check_repository(out) == []
    build(out, "dali_efficientnet_lite0")  # back to model.dali: the dali.py files go
    assert sorted(p.name for p in version_dir.iterdir()) == ["model.dali", "model.dali.version"]


def test_bad_usage_exits_2_naming_the_problem():
    command = [sys.executable, str(PROJECT_ROOT / "build_pipelines.py"), "build", "--out", "unused"]
    unknown = subprocess.run([*command, "no_such_preset"], capture_output=True, text=True, cwd=PROJECT_ROOT)
    assert (
        unknown.returncode == 2 and "no_such_preset" in unknown.stderr and "dali_efficientnet_lite0" in unknown.stderr
    )
    alone = subprocess.run([*command, "--classifier-onnx", "x.onnx"], capture_output=True, text=True, cwd=PROJECT_ROOT)
    assert alone.returncode == 2 and "--labels" in alone.stderr


# Distinctive per channel, and not EfficientNet-Lite's 127/128: a build that ignored
# --mean/--std would serve tensors far from the reference below.
OWN_MEAN = (110, 127, 140)
OWN_STD = (100, 128, 150)


@pytest.fixture(scope="module")
def own_classifier_repository(tmp_path_factory, model_repository):
    """A user's ONNX classifier (the shipped Lite0 export, renamed) and labels."""
    folder = tmp_path_factory.mktemp("own")
    shutil.copy2(model_repository / LITE0 / "1/model.onnx", folder / "my_net.onnx")
    shutil.copy2(model_repository / LITE0 / "labels.txt", folder / "classes.txt")
    out = folder / "repo"
    assert (
        main(
            [
                "build",
                "--out",
                str(out),
                "--classifier-onnx",
                str(folder / "my_net.onnx"),
                "--labels",
                str(folder / "classes.txt"),
                "--input-size",
                "224",
                "--resize-shorter",
                "256",
                "--mean",
                ",".join(map(str, OWN_MEAN)),
                "--std",
                ",".join(map(str, OWN_STD)),
                "--preprocessors",
                "dali",
                "python",
                "--max-batch-size",
                "4",
            ]
        )
        == 0
    )
    return out


def test_own_classifier_gets_preprocessing_and_ensembles(own_classifier_repository):
    names = sorted(p.name for p in own_classifier_repository.iterdir())
    assert names == [
        "ensemble_dali_my_net",
        "ensemble_python_my_net",
        "my_net",
        "preprocess_dali_my_net",
        "preprocess_python_my_net",
    ]
    assert check_repository(own_classifier_repository) == []
    python_parameters = read_config(own_classifier_repository / "preprocess_python_my_net").parameters
    assert python_parameters["mean"].string_value == "110,127,140"
    photo = photo_bytes("chelsea.png")
    expected = reference.preprocess(photo, 256, 224, OWN_MEAN, OWN_STD)
    session = ort.InferenceSession(str(own_classifier_repository / "my_net/1/model.onnx"))
    expected_top1 = int(session.run(None, {session.get_inputs()[0].name: expected[None]})[0][0].argmax())
    with TritonServer(own_classifier_repository) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        for preprocessor in ("dali", "python"):
            batch = pad_batch([photo])
            tensor = httpclient.InferInput(PREPROCESS_INPUT, list(batch.shape), "UINT8")
            tensor.set_data_from_numpy(batch, binary_data=True)
            served = client.infer(f"preprocess_{preprocessor}_my_net", [tensor]).as_numpy(PREPROCESS_OUTPUT)[0]
            difference = np.abs(reference.levels(served - expected, OWN_STD))
            assert difference.mean() <= 1.0 and np.quantile(difference, 0.9) <= 2.0, (preprocessor, difference.mean())
            with ClassifierClient(server.http_url, model=f"ensemble_{preprocessor}_my_net") as classifier:
                (top,) = classifier.classify([photo], top_k=1)
            assert top[0].index == expected_top1, (preprocessor, top, expected_top1)
        client.close()


def test_own_classifier_with_mismatched_labels_is_refused(tmp_path, model_repository):
    (tmp_path / "classes.txt").write_text("cat\ndog\n")
    code = main(
        [
            "build",
            "--out",
            str(tmp_path / "repo"),
            "--classifier-onnx",
            str(model_repository / LITE0 / "1/model.onnx"),
            "--labels",
            str(tmp_path / "classes.txt"),
        ]
    )
    assert code == 2 and not (tmp_path / "repo").exists()


def test_classifiers_declare_what_tritons_image_clients_read(model_repository):
    """triton-inference-server/client's image_client.py and grpc_image_client.py read
    the model's config: one input of 3 dims (beside the batch) with its layout declared
    (FORMAT_NCHW or FORMAT_NHWC), one FP32 vector output, labels for class_count."""
    for classifier in {preset.classifier.name for preset in PRESETS}:
        config = read_config(model_repository / classifier)
        (image,), (scores,) = config.input, config.output
        assert image.format == pb.ModelInput.FORMAT_NCHW and len(image.dims) == 3 and image.dims[0] == 3, classifier
        assert scores.data_type == pb.TYPE_FP32 and len(scores.dims) == 1 and scores.label_filename, classifier
