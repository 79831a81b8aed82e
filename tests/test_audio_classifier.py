"""Bring your own audio classifier: an ONNX tagger of log-mel patches, built into a
repository with `tritonstack build --audio-classifier-onnx`, checked offline, its DALI
features held to the NumPy reference (`tritonstack parity`), served, and ranking the
labels of clips it never saw.

No permissively licensed audio classifier ships in a wheel here, so the test makes one
nobody tuned by hand: a linear tagger (mean log-mel of a patch -> 3 logits) fitted by
least squares on synthesized speech, chords and faint noise, exported with onnx.helper
as a YAMNet-shaped graph ([N, 96, 64] patches in, logits out)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import SESSION_OBJECTIVE_MS, TEST_STOP_GRACE_S
from tritonstack.build.audio_classifier import _dali_features
from tritonstack.build.audio_classifier_graph import read_audio_classifier, servable_audio_classifier
from tritonstack.build.audio_features import LogMelFeatures
from tritonstack.client.classifier import ClassifierClient
from tritonstack.commands import build as build_command
from tritonstack.contract import ENSEMBLE_INPUT, ENSEMBLE_OUTPUT, ENSEMBLE_PATCH_PROBABILITIES
from tritonstack.samples.speech import SAMPLE_RATE, encode, music, speech_track
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import ServerConfig

LABELS = ["silence", "speech", "music"]
PATCH, HOP, MELS = 96, 48, 64
MODEL = "ensemble_audio_tagger"


def _noise(seconds: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).normal(0, 30, int(seconds * SAMPLE_RATE))).astype(np.int16)


def _speech(text: str) -> np.ndarray:
    return speech_track([("speech", text)]).samples


def _examples(seed: int) -> dict[str, list[bytes]]:
    texts = {
        0: ["The weather is mild today", "Please hold the line", "Numbers one two three four"],
        1: ["Models serve audio on Triton", "Good morning to everyone here"],
    }[seed]
    return {
        "silence": [encode(_noise(3.0, seed * 10 + n), "flac") for n in range(2)],
        "speech": [encode(_speech(text), "flac") for text in texts],
        "music": [encode(music(3.0, seed=seed * 10 + n), "flac") for n in range(2)],
    }


def _patch_means(features: np.ndarray) -> np.ndarray:
    count = 1 + max(len(features) - PATCH, 0) // HOP
    return np.stack([features[p * HOP : p * HOP + PATCH].mean(axis=0) for p in range(count)])


def _tagger_graph(weights: np.ndarray, bias: np.ndarray, layout: str = "NTM") -> onnx.ModelProto:
    """patches -> mean over frames -> weights -> logits, in `layout` (NTM or NCTM)."""
    dims = ["batch", PATCH, MELS] if layout == "NTM" else ["batch", 1, PATCH, MELS]
    flat = "patches" if layout == "NTM" else "flat"
    nodes = [] if layout == "NTM" else [helper.make_node("Reshape", ["patches", "ntm"], ["flat"])]
    nodes += [
        helper.make_node("ReduceMean", [flat], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "weights"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tagger",
        [helper.make_tensor_value_info("patches", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(LABELS)])],
        [
            numpy_helper.from_array(weights.astype(np.float32), "weights"),
            numpy_helper.from_array(bias.astype(np.float32), "bias"),
            numpy_helper.from_array(np.asarray([-1, PATCH, MELS], np.int64), "ntm"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    """The fitted tagger as tagger.onnx and its labels as a JSON list."""
    folder = tmp_path_factory.mktemp("tagger")
    rows, targets = [], []
    for label, clips in _examples(0).items():
        for features in _dali_features(LogMelFeatures(), clips):
            means = _patch_means(features)
            rows.append(means)
            targets += [LABELS.index(label)] * len(means)
    inputs = np.concatenate(rows)
    design = np.hstack([inputs, np.ones((len(inputs), 1))])
    onehot = np.eye(len(LABELS))[targets] * 8 - 4  # logits of about +-4
    solution = np.linalg.lstsq(design, onehot, rcond=None)[0]
    onnx.save(_tagger_graph(solution[:-1], solution[-1]), folder / "tagger.onnx")
    (folder / "labels.json").write_text(json.dumps(LABELS))
    return folder


@pytest.fixture(scope="module")
def repository(tagger, tmp_path_factory):
    out = tmp_path_factory.mktemp("audio_classifier_repository")
    code = build_command.main(
        [
            "build",
            "--audio-classifier-onnx",
            str(tagger / "tagger.onnx"),
            "--labels",
            str(tagger / "labels.json"),
            "--latency-objective-ms",
            str(SESSION_OBJECTIVE_MS),
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return out


@pytest.fixture(scope="module")
def served(repository):
    with TritonServer(ServerConfig(repository, stop_grace_s=TEST_STOP_GRACE_S)) as server:
        yield server


def test_the_build_reads_the_graph_and_adds_a_softmax_to_logits(tagger, repository, capsys):
    build_command.main(
        ["build", "--audio-classifier-onnx", str(tagger / "tagger.onnx"), "--labels", str(tagger / "labels.json")]
        + ["--out", str(repository)]
    )
    said = capsys.readouterr().out
    assert "patches of 96 frames x 64 mel bins (NTM), 48 frames apart; 3 labels" in said
    assert "a softmax head added" in said
    assert build_command.main(["check", str(repository)]) == 0


def test_dali_features_match_the_numpy_reference(repository, capsys):
    """`tritonstack parity --preset audio_<name>`: every log-mel value within 1e-3 + 1e-3 x |value|
    of the NumPy reference, in every encoding of the sample speech."""
    assert build_command.main(["parity", str(repository), "--preset", "audio_tagger"]) == 0
    report = capsys.readouterr().out
    differences = [float(line.split()[-1]) for line in report.splitlines() if "max |difference|" in line]
    assert len(differences) == 4 and max(differences) < 5e-3, report  # the verdict is the exit code


def test_served_tagger_ranks_the_labels_of_clips_it_never_saw(served):
    unseen = _examples(1)
    with ClassifierClient(served.grpc_url, "grpc", MODEL) as client:
        for label, clips in unseen.items():
            for clip in clips:
                top = client.classify([clip], top_k=3)[0]
                assert top[0].label == label, (label, top)
                assert abs(sum(p.score for p in top) - 1) < 1e-3, top


def test_patch_probabilities_on_request_from_a_stock_client(served):
    clip = encode(np.concatenate([_speech("A clip of several patches"), music(2.0, seed=3)]), "ogg_vorbis")
    tensor = np.frombuffer(clip, np.uint8)[None]
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        request = grpcclient.InferInput(ENSEMBLE_INPUT, list(tensor.shape), "UINT8")
        request.set_data_from_numpy(tensor)
        outputs = [grpcclient.InferRequestedOutput(name) for name in (ENSEMBLE_OUTPUT, ENSEMBLE_PATCH_PROBABILITIES)]
        result = client.infer(MODEL, [request], outputs=outputs)
    clip_probabilities = result.as_numpy(ENSEMBLE_OUTPUT)[0]
    patches = result.as_numpy(ENSEMBLE_PATCH_PROBABILITIES)[0]
    assert patches.shape[0] >= 3 and patches.shape[1] == len(LABELS)
    np.testing.assert_allclose(patches.mean(axis=0), clip_probabilities, atol=1e-5)
    # the first patches are speech, the last music
    assert LABELS[patches[0].argmax()] == "speech" and LABELS[patches[-1].argmax()] == "music", patches


def test_classify_cli_ranks_audio_with_an_audio_classifier(served, tmp_path):
    (tmp_path / "talk.flac").write_bytes(_examples(1)["speech"][0])
    run = subprocess.run(
        [sys.executable, "-m", "tritonstack", "classify", str(tmp_path / "talk.flac"), "--url", served.http_url]
        + ["--audio-model", MODEL, "--format", "jsonl", "--top-k", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    (line,) = run.stdout.splitlines()
    assert json.loads(line)["top"][0]["label"] == "speech", line


def test_a_channels_first_graph_is_served_alike(tagger):
    """[N, 1, frames, mels] (a YAMNet-like NCHW export): the same answers as [N, frames, mels]."""
    model = onnx.load(str(tagger / "tagger.onnx"))
    weights, bias = (numpy_helper.to_array(t) for t in model.graph.initializer[:2])
    onnx.save(_tagger_graph(weights, bias, "NCTM"), tagger / "tagger_nctm.onnx")
    features = np.random.default_rng(0).normal(-5, 2, (300, MELS)).astype(np.float32)
    answers = []
    for name in ("tagger.onnx", "tagger_nctm.onnx"):
        graph = read_audio_classifier(tagger / name)
        served = servable_audio_classifier(tagger / name, graph, len(LABELS), HOP, np.log(0.001), softmax=True)
        session = ort.InferenceSession(served, providers=["CPUExecutionProvider"])
        answers.append(session.run(None, {"log_mel": features[None]}))
        assert graph.layout == ("NTM" if name == "tagger.onnx" else "NCTM")
    for ours, theirs in zip(*answers):
        np.testing.assert_allclose(ours, theirs, atol=1e-6)
