"""Video through our `dali` backend on a real tritonserver: clips decoded by
`fn.decoders.video` on the CPU, their frames split into samples
(`split_along_outer_axis`) and classified by the Lite0 classifier in one ensemble;
bad clips refused for that request only, naming what was wrong (C++ backend:
src/dali_executor/utils/utils.h split_outer_dim; DALI's CPU decoder reads VP8, VP9
and MJPEG)."""

from __future__ import annotations

import queue
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from nvidia.dali import fn, pipeline_def, types
from tritonclient.utils import InferenceServerException

from tests import clips
from tests import repo_factory as rf
from tests.conftest import MODEL_REPOSITORY
from tritonstack.build.classifiers import EFFICIENTNET_LITE0
from tritonstack.build.dali_model import video_classification_pipeline
from tritonstack.build.model_config import DynamicBatching, EnsembleStep, ModelConfig, Tensor
from tritonstack.samples.photos import PHOTOS, sample_clip

FRAMES, STRIDE = 6, 4
CLASSIFIER = EFFICIENTNET_LITE0.name
PREPROCESS, ENSEMBLE, SMALL_BUDGET = "preprocess_video_lite0", "ensemble_video_lite0", "video_small_budget"
CLIPS_PER_REQUEST = 4  # the classifier's max_batch_size 32 holds 4 x 6 frames
# qa/L0_video_input_decoupled's model: fn.experimental.inputs.video, 5 frames a
# sequence, 3 sequences a run, each run a response of a decoupled model.
STREAM, NOT_DECOUPLED, SEQUENCE, SEQUENCES_PER_RUN = "video_stream", "video_stream_coupled", 5, 3
STREAM_CONFIG = """backend: "dali"
max_batch_size: 0
{policy}
input [ {{ name: "INPUT" dims: [ 1, -1 ] }} ]
output [ {{ name: "OUTPUT" }} ]
instance_group [ {{ kind: KIND_CPU }} ]
"""


@pipeline_def(output_ndim=4, output_dtype=types.UINT8)
def streamed_video_pipeline():
    return fn.experimental.inputs.video(sequence_length=SEQUENCE, name="INPUT", last_sequence_policy="pad")


def write_stream_model(repository, name: str, decoupled: bool) -> None:
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    (folder / "config.pbtxt").write_text(STREAM_CONFIG.format(policy=policy))
    (folder / "1" / "model.dali").write_bytes(rf.serialized(streamed_video_pipeline, batch_size=SEQUENCES_PER_RUN))


def video_preprocess_config(name: str, **parameters: str) -> ModelConfig:
    crop = EFFICIENTNET_LITE0.preprocessing.crop
    return rf.dali_config(
        name,
        inputs=(Tensor("DALI_INPUT_0", "UINT8", (-1,), allow_ragged_batch=True),),
        outputs=(Tensor("DALI_OUTPUT_0", "FP32", (3, crop, crop)),),
        max_batch_size=CLIPS_PER_REQUEST,
        dynamic_batching=DynamicBatching(),
        parameters={"split_along_outer_axis": "DALI_OUTPUT_0", "num_threads": "2", **parameters},
    )


def ensemble_config() -> ModelConfig:
    return ModelConfig(
        name=ENSEMBLE,
        platform="ensemble",
        max_batch_size=CLIPS_PER_REQUEST,
        inputs=(Tensor("INPUT", "UINT8", (-1,)),),
        outputs=(Tensor("OUTPUT", "FP32", (EFFICIENTNET_LITE0.num_classes,)),),
        steps=(
            EnsembleStep(PREPROCESS, {"DALI_INPUT_0": "INPUT"}, {"DALI_OUTPUT_0": "frames"}),
            EnsembleStep(
                CLASSIFIER, {EFFICIENTNET_LITE0.input_name: "frames"}, {EFFICIENTNET_LITE0.output_name: "OUTPUT"}
            ),
        ),
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
        resize_shorter=preprocessing.resize_shorter,
        crop=preprocessing.crop,
        mean=preprocessing.mean,
        std=preprocessing.std,
        frames=FRAMES,
        stride=STRIDE,
        batch_size=CLIPS_PER_REQUEST,
        num_threads=2,
        device_id=None,
    ).serialize()
    rf.write_model(out, video_preprocess_config(PREPROCESS), {"model.dali": serialized})
    # 6 frames of 240x240 are 345 600 pixels: above this model's budget.
    rf.write_model(
        out,
        video_preprocess_config(
            SMALL_BUDGET, max_pixels="300000", max_request_pixels="300000", max_batch_pixels="300000"
        ),
        {"model.dali": serialized},
    )
    rf.write_model(out, ensemble_config(), {})
    write_stream_model(out, STREAM, decoupled=True)
    write_stream_model(out, NOT_DECOUPLED, decoupled=False)
    return out


@pytest.fixture(scope="module")
def triton(repository):
    with rf.explicit_server(repository) as running, httpclient.InferenceServerClient(running.http_url) as client:
        for model in (CLASSIFIER, PREPROCESS, ENSEMBLE, SMALL_BUDGET, STREAM):
            client.load_model(model)
        yield running


@pytest.fixture(scope="module")
def http(triton):
    with httpclient.InferenceServerClient(triton.http_url) as client:
        yield client


def infer(client, model: str, encoded: list[bytes], module=httpclient) -> np.ndarray:
    batch = np.zeros((len(encoded), max(map(len, encoded))), np.uint8)
    for row, data in enumerate(encoded):
        batch[row, : len(data)] = np.frombuffer(data, np.uint8)
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


@pytest.mark.parametrize(
    "bad, words",
    [
        ("h264", ["H.264", "VP9", "re-encode"]),
        ("not_a_video", ["not a video"]),
        ("cut_short", ["cut short"]),
        ("no_frames", ["no frames"]),
    ],
)
def test_a_bad_clip_is_refused_for_that_request_only(http, clip_files, bad, words):
    good = clip_files["chelsea"]
    data = {
        "h264": clip_files["h264"],
        "not_a_video": b"this is no video" * 64,
        "cut_short": good[: len(good) // 2],
        "no_frames": clips.without_frames(good),
    }[bad]
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


def stream(url: str, clip: bytes) -> list[np.ndarray]:
    """One request to the decoupled model over gRPC's stream: every response's
    OUTPUT until the final flag."""
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        tensor = grpcclient.InferInput("INPUT", [1, len(clip)], "UINT8")
        tensor.set_data_from_numpy(np.frombuffer(clip, np.uint8)[None])
        client.async_stream_infer(STREAM, [tensor], request_id="clip", enable_empty_final_response=True)
        outputs = []
        try:
            while True:
                result, error = answers.get(timeout=120)
                if error is not None:
                    raise error
                if result.as_numpy("OUTPUT") is not None:
                    outputs.append(result.as_numpy("OUTPUT"))
                if result.get_response().parameters["triton_final_response"].bool_param:
                    return outputs
        finally:
            client.stop_stream()


def reference_sequences(clip: bytes) -> np.ndarray:
    """The clip's frames decoded at once, zero-padded to whole sequences, as the QA client's reference."""

    @pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def decode():
        frames = fn.decoders.video(fn.external_source(name="data"), device="cpu")
        return fn.pad(frames, axes=0, align=SEQUENCE)

    pipeline = decode()
    pipeline.build()
    pipeline.feed_input("data", [np.frombuffer(clip, np.uint8)])
    (frames,) = pipeline.run()
    frames = np.asarray(frames.at(0))
    return frames.reshape(-1, SEQUENCE, *frames.shape[1:])


@pytest.mark.parametrize(
    "clip_name, sequences, responses",
    [
        ("chelsea", 5, [3, 2]),  # 24 frames: the last run is short
        ("sample", 6, [3, 3]),  # 30 frames: the last run is full, the input is found consumed after it
    ],
)
def test_a_decoupled_model_streams_a_clip_run_by_run(triton, clip_files, clip_name, sequences, responses):
    """qa/L0_video_input_decoupled; src/dali_model_instance.cc ProcessRequest (a
    response per run until the input is consumed)."""
    clip = sample_clip() if clip_name == "sample" else clip_files["chelsea"]
    expected = reference_sequences(clip)
    assert len(expected) == sequences
    for _ in range(2):  # nothing of one request's clip is left for the next
        outputs = stream(triton.grpc_url, clip)
        assert [len(output) for output in outputs] == responses
        np.testing.assert_array_equal(np.concatenate(outputs), expected)


def test_a_bad_clip_ends_its_stream_with_an_error(triton, clip_files):
    with pytest.raises(InferenceServerException) as refused:
        stream(triton.grpc_url, clip_files["h264"])
    assert "H.264" in str(refused.value)
    assert len(stream(triton.grpc_url, sample_clip())) == 2


def test_an_input_operator_needs_a_decoupled_model(http):
    message = rf.load_error(http, NOT_DECOUPLED)
    assert "decoupled" in message and "fn.experimental.inputs.video" in message, message
