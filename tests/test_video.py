"""Video through our `dali` backend on a real tritonserver: clips decoded by
`fn.decoders.video` on the CPU, their frames split into samples
(`split_along_outer_axis`) and classified by the Lite0 classifier in one ensemble;
bad clips refused for that request only, naming what was wrong (C++ backend:
src/dali_executor/utils/utils.h split_outer_dim; DALI's CPU decoder reads VP8, VP9
and MJPEG)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import clips
from tests import repo_factory as rf
from tests.conftest import MODEL_REPOSITORY
from tritonstack.build.classifiers import EFFICIENTNET_LITE0
from tritonstack.build.dali_model import video_classification_pipeline
from tritonstack.build.model_config import DynamicBatching, EnsembleStep, ModelConfig, Tensor
from tritonstack.samples import PHOTOS

FRAMES, STRIDE = 6, 4
CLASSIFIER = EFFICIENTNET_LITE0.name
PREPROCESS, ENSEMBLE, SMALL_BUDGET = "preprocess_video_lite0", "ensemble_video_lite0", "video_small_budget"
CLIPS_PER_REQUEST = 4  # the classifier's max_batch_size 32 holds 4 x 6 frames


def video_preprocess_config(name: str, **parameters: str) -> ModelConfig:
    crop = EFFICIENTNET_LITE0.preprocessing.crop
    return rf.dali_config(name, inputs=(Tensor("DALI_INPUT_0", "UINT8", (-1,), allow_ragged_batch=True),),
                          outputs=(Tensor("DALI_OUTPUT_0", "FP32", (3, crop, crop)),),
                          max_batch_size=CLIPS_PER_REQUEST, dynamic_batching=DynamicBatching(),
                          parameters={"split_along_outer_axis": "DALI_OUTPUT_0", "num_threads": "2", **parameters})


def ensemble_config() -> ModelConfig:
    return ModelConfig(
        name=ENSEMBLE, platform="ensemble", max_batch_size=CLIPS_PER_REQUEST,
        inputs=(Tensor("INPUT", "UINT8", (-1,)),),
        outputs=(Tensor("OUTPUT", "FP32", (EFFICIENTNET_LITE0.num_classes,)),),
        steps=(EnsembleStep(PREPROCESS, {"DALI_INPUT_0": "INPUT"}, {"DALI_OUTPUT_0": "frames"}),
               EnsembleStep(CLASSIFIER, {EFFICIENTNET_LITE0.input_name: "frames"},
                            {EFFICIENTNET_LITE0.output_name: "OUTPUT"})),
    )


@pytest.fixture(scope="module")
def clip_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    return {
        "chelsea": clips.panning_clip("chelsea.png", folder / "chelsea.mp4"),
        "coffee": clips.panning_clip("coffee.png", folder / "coffee.mp4"),
        "h264": clips.panning_clip("chelsea.png", folder / "chelsea_h264.mp4", codec="h264", seconds=1),
    }


@pytest.fixture(scope="module")
def repository(tmp_path_factory, model_repository):
    out = tmp_path_factory.mktemp("video_repository")
    shutil.copytree(MODEL_REPOSITORY / CLASSIFIER, out / CLASSIFIER)
    preprocessing = EFFICIENTNET_LITE0.preprocessing
    serialized = video_classification_pipeline(
        resize_shorter=preprocessing.resize_shorter, crop=preprocessing.crop, mean=preprocessing.mean,
        std=preprocessing.std, frames=FRAMES, stride=STRIDE, batch_size=CLIPS_PER_REQUEST, num_threads=2,
        device_id=None).serialize()
    rf.write_model(out, video_preprocess_config(PREPROCESS), {"model.dali": serialized})
    # 6 frames of 240x240 are 345 600 pixels: above this model's budget.
    rf.write_model(out, video_preprocess_config(SMALL_BUDGET, max_pixels="300000", max_request_pixels="300000",
                                                max_batch_pixels="300000"), {"model.dali": serialized})
    rf.write_model(out, ensemble_config(), {})
    return out


@pytest.fixture(scope="module")
def triton(repository):
    with rf.explicit_server(repository) as running, httpclient.InferenceServerClient(running.http_url) as client:
        for model in (CLASSIFIER, PREPROCESS, ENSEMBLE, SMALL_BUDGET):
            client.load_model(model)
        yield running


@pytest.fixture(scope="module")
def http(triton):
    with httpclient.InferenceServerClient(triton.http_url) as client:
        yield client


def infer(client, model: str, encoded: list[bytes], module=httpclient) -> np.ndarray:
    batch = np.zeros((len(encoded), max(map(len, encoded))), np.uint8)
    for row, data in enumerate(encoded):
        batch[row, :len(data)] = np.frombuffer(data, np.uint8)
    tensor = module.InferInput("INPUT" if model == ENSEMBLE else "DALI_INPUT_0", list(batch.shape), "UINT8")
    tensor.set_data_from_numpy(batch)
    output = "OUTPUT" if model == ENSEMBLE else "DALI_OUTPUT_0"
    return client.infer(model, [tensor], outputs=[module.InferRequestedOutput(output)]).as_numpy(output)


def clip_label(frame_probabilities: np.ndarray) -> str:
    return EFFICIENTNET_LITE0.labels()[int(frame_probabilities.mean(axis=0).argmax())]


def test_a_clip_panning_over_a_photo_gets_the_photos_label(http, triton, clip_files):
    with grpcclient.InferenceServerClient(triton.grpc_url) as grpc:
        for photo, clip in (("chelsea.png", clip_files["chelsea"]), ("coffee.png", clip_files["coffee"])):
            for client, module in ((http, httpclient), (grpc, grpcclient)):
                frames = infer(client, ENSEMBLE, [clip], module)
                assert frames.shape == (FRAMES, EFFICIENTNET_LITE0.num_classes)
                assert clip_label(frames) in PHOTOS[photo], (photo, clip_label(frames))


def test_each_clip_of_a_request_gives_its_frames_in_order(http, clip_files):
    frames = infer(http, ENSEMBLE, [clip_files["chelsea"], clip_files["coffee"]])
    assert frames.shape == (2 * FRAMES, EFFICIENTNET_LITE0.num_classes)
    assert clip_label(frames[:FRAMES]) in PHOTOS["chelsea.png"]
    assert clip_label(frames[FRAMES:]) in PHOTOS["coffee.png"]


@pytest.mark.parametrize("bad, words", [
    ("h264", ["H.264", "VP9", "re-encode"]),
    ("not_a_video", ["not a video"]),
    ("cut_short", ["cut short"]),
    ("no_frames", ["no frames"]),
])
def test_a_bad_clip_is_refused_for_that_request_only(http, clip_files, bad, words):
    good = clip_files["chelsea"]
    data = {"h264": clip_files["h264"], "not_a_video": b"this is no video" * 64,
            "cut_short": good[:len(good) // 2], "no_frames": clips.without_frames(good)}[bad]
    with pytest.raises(InferenceServerException) as refused:
        infer(http, ENSEMBLE, [data])
    message = str(refused.value)
    assert "400" in message or refused.value.status() in ("400", "StatusCode.INVALID_ARGUMENT"), message
    assert all(word in message for word in words), message
    assert clip_label(infer(http, ENSEMBLE, [good])) in PHOTOS["chelsea.png"]  # the server still answers


def test_a_clips_frames_count_against_the_decode_budget(http, clip_files):
    with pytest.raises(InferenceServerException) as refused:
        infer(http, SMALL_BUDGET, [clip_files["chelsea"]])
    message = str(refused.value)
    assert f"{FRAMES} frames of 240x240" in message and "max_pixels 300000" in message, message
