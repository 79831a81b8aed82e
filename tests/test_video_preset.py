"""The video preset (ensemble_video_efficientnet_lite0): built with its options,
served from the committed repository over HTTP and gRPC, classified clip by clip
and frame by frame by `tritonstack classify`, in folders that mix photos and clips."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests import clips
from tests.test_build import build, run_pipeline
from tritonstack.build.check import check_repository
from tritonstack.client.classifier import ClassifierClient
from tritonstack.commands.build import main as build_main
from tritonstack.commands.classify import main as classify_main
from tritonstack.contract import DEFAULT_VIDEO_MODEL
from tritonstack.repository_files import read_config
from tritonstack.rules import dali_proto
from tritonstack.samples.photos import PHOTOS, SAMPLE_CLIP_LABELS, photo_bytes, sample_clip

PRESET = "video_efficientnet_lite0"
PREPROCESS = "preprocess_video_efficientnet_lite0"
FRAMES = 8  # the build's default clip_frames


def test_frame_options_reach_the_config_and_the_pipeline(tmp_path, model_repository):
    out = tmp_path / "repo"
    build(out, PRESET, "--clip-frames", "4", "--frame-stride", "2", "--max-batch-size", "16")
    config = read_config(out / PREPROCESS)
    assert config.max_batch_size == read_config(out / DEFAULT_VIDEO_MODEL).max_batch_size == 16 // 4
    assert config.parameters["split_along_outer_axis"].string_value == "DALI_OUTPUT_0"
    assert read_config(out / "efficientnet_lite0").max_batch_size == 16  # a request's frames in one batch
    serialized = (out / PREPROCESS / "1/model.dali").read_bytes()
    assert dali_proto.parse_pipeline(serialized).clip_frames == 4
    assert run_pipeline(serialized, sample_clip()).shape == (1, 4, 3, 224, 224)
    (warmup,) = config.model_warmup
    assert (out / PREPROCESS / "warmup" / warmup.inputs["DALI_INPUT_0"].input_data_file).read_bytes() == sample_clip()
    assert check_repository(out) == []


def test_more_frames_than_a_batch_holds_is_refused(tmp_path, capsys):
    assert build_main(["build", PRESET, "--out", str(tmp_path), "--clip-frames", "40"]) == 2
    assert "clip_frames 40 exceeds max_batch_size 32" in capsys.readouterr().err


def test_gpu_variant_decodes_on_the_gpu(tmp_path, model_repository):
    out = tmp_path / "gpu"
    build(out, PRESET, "--device", "gpu")
    spec = dali_proto.parse_pipeline((out / PREPROCESS / "1/model.dali").read_bytes())
    assert spec.gpu_operators == ("video(mixed)", "resize_crop_mirror(gpu)", "crop_mirror_normalize(gpu)")
    assert check_repository(out) == []


def test_dali_py_format_autoserializes_the_video_pipeline(tmp_path, model_repository):
    import importlib.util

    from nvidia.dali._utils.autoserialize import invoke_autoserialize

    out = tmp_path / "py"
    build(out, PRESET, "--format", "dali.py")
    version_dir = out / PREPROCESS / "1"
    spec = importlib.util.spec_from_file_location("autoserialize_mod", version_dir / "dali.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    invoke_autoserialize(module, str(tmp_path / "autoserialized.dali"))
    shipped = (model_repository / PREPROCESS / "1/model.dali").read_bytes()
    np.testing.assert_array_equal(
        run_pipeline((tmp_path / "autoserialized.dali").read_bytes(), sample_clip()),
        run_pipeline(shipped, sample_clip()),
    )


@pytest.fixture(scope="module")
def coffee_clip(tmp_path_factory) -> bytes:
    return clips.panning_clip("coffee.png", tmp_path_factory.mktemp("clips") / "coffee.mp4")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_preset_labels_clips_and_their_frames(server, protocol, coffee_clip):
    url = server.http_url if protocol == "http" else server.grpc_url
    with ClassifierClient(url, protocol, DEFAULT_VIDEO_MODEL) as client:
        cat, coffee = client.classify_clips_each([sample_clip(), coffee_clip], top_k=1000)
    for clip, labels in ((cat, SAMPLE_CLIP_LABELS), (coffee, PHOTOS["coffee.png"])):
        assert clip.top[0].label in labels, clip.top[:3]
        assert len(clip.frames) == FRAMES
        # The clip's ranking is of its frames' mean probabilities.
        frame_scores = [{p.index: p.score for p in frame} for frame in clip.frames]
        for prediction in clip.top[:5]:
            mean = np.mean([scores[prediction.index] for scores in frame_scores])
            assert prediction.score == pytest.approx(mean, abs=1e-5)


def test_classify_mixes_photos_and_clips_with_a_line_per_frame(server, tmp_path, capsys):
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "a_photo.png").write_bytes(photo_bytes("coffee.png"))
    (folder / "b_clip.mp4").write_bytes(sample_clip())
    (folder / "c_clip_named_otherwise").write_bytes(sample_clip())
    code = classify_main(
        [
            str(folder),
            "--url",
            server.grpc_url,
            "--protocol",
            "grpc",
            "--format",
            "jsonl",
            "--per-frame",
            "--top-k",
            "3",
            "--batch-size",
            "2",
        ]
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    assert [(line["path"].rsplit("/", 1)[1], line.get("frame")) for line in lines] == [
        ("a_photo.png", None),
        ("b_clip.mp4", None),
        *(("b_clip.mp4", n) for n in range(FRAMES)),
        ("c_clip_named_otherwise", None),
        *(("c_clip_named_otherwise", n) for n in range(FRAMES)),
    ]
    photo, clip = lines[0], lines[1]
    assert photo["top"][0]["label"] in PHOTOS["coffee.png"] and "frames" not in photo
    assert clip["frames"] == FRAMES and clip["top"][0]["label"] in SAMPLE_CLIP_LABELS
    mean = np.mean(
        [
            [next((p["score"] for p in line["top"] if p["index"] == clip["top"][0]["index"]), np.nan)]
            for line in lines[2 : 2 + FRAMES]
        ]
    )
    if not np.isnan(mean):  # the clip's top class is in every frame's top 3: its score is their mean
        assert mean == pytest.approx(clip["top"][0]["score"], abs=1e-5)


def test_a_bad_clip_fails_alone_and_video_model_can_be_given_as_model(server, tmp_path, capsys):
    folder = tmp_path / "clips"
    folder.mkdir()
    (folder / "a.mp4").write_bytes(sample_clip())
    (folder / "b.mp4").write_bytes(sample_clip()[:2000])  # cut short
    (folder / "c.webm").write_bytes(b"no video at all" * 100)
    code = classify_main(
        [
            str(folder),
            "--url",
            server.http_url,
            "--model",
            DEFAULT_VIDEO_MODEL,
            "--format",
            "jsonl",
            "--batch-size",
            "3",
        ]
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 1
    assert lines[0]["top"][0]["label"] in SAMPLE_CLIP_LABELS
    assert "cut short" in lines[1]["error"] and "not a video" in lines[2]["error"], lines


def test_photos_alone_need_no_video_model(server, tmp_path):
    (tmp_path / "coffee.png").write_bytes(photo_bytes("coffee.png"))
    assert classify_main([str(tmp_path), "--url", server.http_url, "--video-model", "no_such_model"]) == 0
