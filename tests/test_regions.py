"""The regions presets (ensemble_regions_<classifier>): an image and its boxes in, a row of
probabilities per box out. Built with their options, checked offline, served from a
repository of their own over HTTP and gRPC; bad boxes refused per request."""

from __future__ import annotations

import csv
import io
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from nvidia.dali import Pipeline
from PIL import Image
from tritonclient.utils import InferenceServerException

from tests import reference
from tests import repo_factory as rf
from tests.test_build import autoserialized, build
from tritonstack.build.check import check_repository
from tritonstack.build.presets import preset_named
from tritonstack.build.repository import write_repository
from tritonstack.client.aio import AsyncClassifierClient
from tritonstack.client.classifier import ClassifierClient
from tritonstack.commands.classify import main as classify_main
from tritonstack.contract import (
    BATCH_PRIORITY,
    DEFAULT_REGIONS_MODEL,
    ENSEMBLE_BOXES,
    ENSEMBLE_INPUT,
    ENSEMBLE_OUTPUT,
    PREPROCESS_BOXES,
    PREPROCESS_INPUT,
    boxes_array,
    pad_batch,
)
from tritonstack.media.regions import BoxError
from tritonstack.repository_files import read_config
from tritonstack.rules import dali_proto
from tritonstack.samples.photos import PHOTOS, collage, photo_bytes, sample_jpeg
from tritonstack.serve.launcher import TritonServer

PRESET = "regions_efficientnet_lite0"
PREPROCESS = "preprocess_regions_efficientnet_lite0"
SAMPLE_SIZE = (451, 300)  # sample.jpg, chelsea


def run_regions(serialized: bytes, images: list[bytes], boxes: list) -> list[np.ndarray]:
    """The pipeline run here on a batch of images and their boxes: each image's crops."""
    pipeline = Pipeline.deserialize(
        serialized_pipeline=serialized, batch_size=len(images), num_threads=1, device_id=None, prefetch_queue_depth=1
    )
    pipeline.build()
    pipeline.feed_input(PREPROCESS_INPUT, [np.frombuffer(image, np.uint8) for image in images])
    pipeline.feed_input(PREPROCESS_BOXES, [boxes_array(b) for b in boxes])
    (output,) = pipeline.run()
    return [np.asarray(output[index]) for index in range(len(images))]


def test_max_boxes_reaches_the_configs_and_the_pipeline(tmp_path, model_repository):
    out = tmp_path / "repo"
    build(out, PRESET, "--max-boxes", "4", "--max-batch-size", "16")
    config = read_config(out / PREPROCESS)
    assert config.max_batch_size == read_config(out / DEFAULT_REGIONS_MODEL).max_batch_size == 16 // 4
    assert config.parameters["split_along_outer_axis"].string_value == "DALI_OUTPUT_0"
    assert config.parameters["max_boxes"].string_value == "4"
    assert config.parameters["boxes_input"].string_value == PREPROCESS_BOXES
    assert [tensor.name for tensor in read_config(out / DEFAULT_REGIONS_MODEL).input] == [
        ENSEMBLE_INPUT,
        ENSEMBLE_BOXES,
    ]
    serialized = (out / PREPROCESS / "1/model.dali").read_bytes()
    one, four, none = run_regions(
        serialized, [sample_jpeg()] * 3, [[(0, 0, 451, 300)], [(0, 0, 10, 10)] * 4, np.zeros((0, 4))]
    )
    assert (one.shape, four.shape, none.shape) == ((1, 3, 224, 224), (4, 3, 224, 224), (0, 3, 224, 224))
    assert check_repository(out) == []


def test_more_boxes_than_a_batch_holds_is_refused(tmp_path, capsys):
    from tritonstack.commands.build import main

    assert main(["build", PRESET, "--out", str(tmp_path), "--max-boxes", "40"]) == 2
    assert "max_boxes 40 exceeds max_batch_size 32" in capsys.readouterr().err


def test_gpu_variant_decodes_and_cuts_on_the_gpu(tmp_path, model_repository):
    out = tmp_path / "gpu"
    build(out, PRESET, "--device", "gpu", "--max-boxes", "2")
    spec = dali_proto.parse_pipeline((out / PREPROCESS / "1/model.dali").read_bytes())
    assert spec.gpu_operators == (
        "image(mixed)",
        *("resize(gpu)", "crop(gpu)") * 2,  # a slot per box
        "stack(gpu)",
        "slice(gpu)",
        "crop_mirror_normalize(gpu)",
    )
    assert check_repository(out) == []


def test_dali_py_format_autoserializes_the_regions_pipeline(tmp_path, model_repository):
    out = tmp_path / "py"
    build(out, PRESET, "--format", "dali.py")
    boxes = [[(140, 40, 330, 230), (0, 0, 451, 300)]]
    np.testing.assert_array_equal(
        run_regions(autoserialized(out / PREPROCESS / "1/dali.py", tmp_path), [sample_jpeg()], boxes)[0],
        run_regions((model_repository / PREPROCESS / "1/model.dali").read_bytes(), [sample_jpeg()], boxes)[0],
    )


def test_every_classifier_gets_a_regions_preset_by_the_same_code(model_repository):
    for name in ("regions_efficientnet_lite0", "regions_efficientnet_lite2", "regions_efficientnet_lite0_int8"):
        preset = preset_named(name)
        assert (model_repository / preset.ensemble_name / "config.pbtxt").is_file()
        assert (model_repository / preset.preprocessing_name / "1/model.dali").is_file()
    # INT8 takes Lite0's crops: one preprocessing model for both.
    assert preset_named("regions_efficientnet_lite0_int8").preprocessing_name == PREPROCESS


# --- served -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def regions_server(server):
    """The session's server: its repository holds this preset, built with the same
    options a server of the preset alone would get (FUNCTIONAL_BUILD); no test here
    changes or stops it."""
    assert (server.config.model_repository / PREPROCESS).is_dir()
    return server


def infer(server, protocol: str, image: bytes, boxes, class_count: int = 1, priority: int = 0):
    """One raw request of one image and its boxes: the answer's classification strings.
    `priority`: BATCH_PRIORITY for requests sent together, which queue past the latency
    objective (the regions step takes two images a batch)."""
    api = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    client = api.InferenceServerClient(url.split("://")[-1])
    image_tensor = pad_batch([image])
    box_tensor = np.asarray(boxes, np.float32)[None]
    inputs = [
        api.InferInput(ENSEMBLE_INPUT, list(image_tensor.shape), "UINT8"),
        api.InferInput(ENSEMBLE_BOXES, list(box_tensor.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(image_tensor)
    inputs[1].set_data_from_numpy(box_tensor)
    output = api.InferRequestedOutput(ENSEMBLE_OUTPUT, class_count=class_count)  # 0: the probabilities
    try:
        return client.infer(DEFAULT_REGIONS_MODEL, inputs, outputs=[output], priority=priority).as_numpy(
            ENSEMBLE_OUTPUT
        )
    finally:
        client.close()


def top_label(entry) -> str:
    return entry.decode().split(":", 2)[2]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_collage_gets_each_panels_subject(regions_server, protocol):
    picture = collage()
    answer = infer(regions_server, protocol, picture.jpeg, picture.boxes)
    assert len(answer) == len(picture.boxes)
    for row, photo in zip(answer, picture.photos):
        assert top_label(row[0]) in PHOTOS[photo], (photo, row)


def exif_rotated(jpeg: bytes) -> bytes:
    """The image stored turned a quarter, with EXIF orientation 6 saying so: decoders
    that apply it (DALI's, Pillow's exif_transpose) give back the original."""
    with Image.open(io.BytesIO(jpeg)) as image:
        stored = image.transpose(Image.Transpose.ROTATE_90)
        exif = Image.Exif()
        exif[0x0112] = 6
        encoded = io.BytesIO()
        stored.save(encoded, "JPEG", quality=95, exif=exif)
    return encoded.getvalue()


BAD_BOXES = [
    # (boxes, what the message says besides the box index and the image size)
    ([(0, 0, 452, 300)], "box 0 [0, 0, 452, 300] reaches outside the image"),
    ([(10, 10, 50, 50), (-1, 0, 5, 5)], "box 1 [-1, 0, 5, 5] reaches outside the image"),
    ([(10, 10, 50, 50), (60, 10, 60, 50)], "box 1 [60, 10, 60, 50] is empty"),
    ([(10, 40, 50, 20)], "box 0 [10, 40, 50, 20] is empty"),
    ([(10, 10, float("nan"), 50)], "box 0 [10, 10, nan, 50] is not finite"),
    ([(1, 1, 5, 5)] * 17, "17 boxes, above this model's max_boxes 16"),
    (np.zeros((0, 4)), "no boxes"),
]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("boxes, says", BAD_BOXES, ids=[says.split(" [")[0] for _, says in BAD_BOXES])
def test_bad_boxes_are_refused_naming_the_box_and_the_image_size(regions_server, protocol, boxes, says):
    with pytest.raises(InferenceServerException) as refused:
        infer(regions_server, protocol, sample_jpeg(), boxes)
    message = refused.value.message()
    assert says in message and "image 0 (451x300 after EXIF orientation)" in message, message
    assert refused.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")


def test_boxes_are_in_the_pixels_after_exif_orientation(regions_server):
    """Stored 300x451 with orientation 6: decoded 451x300, as the boxes say."""
    rotated = exif_rotated(sample_jpeg())
    (row,) = infer(regions_server, "http", rotated, [(140, 40, 330, 230)])
    assert top_label(row[0]) in PHOTOS["chelsea.png"]
    with pytest.raises(InferenceServerException, match=r"image 0 \(451x300 after EXIF orientation\).*box 0"):
        infer(regions_server, "http", rotated, [(0, 0, 300, 451)])


def test_a_bad_request_fails_alone_among_concurrent_ones(regions_server):
    picture = collage()
    jobs = [(picture.jpeg, picture.boxes)] * 3 + [(picture.jpeg, [(0, 0, 1e6, 10)])] + [(picture.jpeg, picture.boxes)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [
            pool.submit(infer, regions_server, "grpc", image, boxes, priority=BATCH_PRIORITY) for image, boxes in jobs
        ]
    outcomes = [future.exception() or future.result() for future in futures]
    assert isinstance(outcomes[3], InferenceServerException) and "box 0" in outcomes[3].message()
    for outcome in outcomes[:3] + outcomes[4:]:
        assert [top_label(row[0]) in PHOTOS[photo] for row, photo in zip(outcome, picture.photos)] == [True] * 3


def test_a_users_own_classifier_gets_a_regions_preset(tmp_path, model_repository):
    from tritonstack.commands.build import main

    onnx = tmp_path / "my_net.onnx"
    onnx.symlink_to(model_repository / "efficientnet_lite0/1/model.onnx")
    out = tmp_path / "repo"
    own = ["--classifier-onnx", str(onnx), "--labels", str(model_repository / "efficientnet_lite0/labels.txt")]
    assert main(["build", "--out", str(out), *own, "--preprocessors", "regions", "--max-boxes", "8"]) == 0
    assert read_config(out / "preprocess_regions_my_net").parameters["max_boxes"].string_value == "8"
    assert [tensor.name for tensor in read_config(out / "ensemble_regions_my_net").input] == ["INPUT", "BOXES"]
    assert check_repository(out) == []


# --- the Python clients ---------------------------------------------------------------------


def url_of(server, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_sync_client_classifies_regions_in_order(regions_server, protocol):
    picture = collage()
    with ClassifierClient(url_of(regions_server, protocol), protocol, DEFAULT_REGIONS_MODEL) as client:
        # Reversed: the answer follows the boxes' order, not the panels'.
        answer = client.classify_regions(picture.jpeg, picture.boxes[::-1], top_k=3)
        assert client.classify_regions(picture.jpeg, []) == []
        with pytest.raises(BoxError, match=r"box 1 \[0, 0, 5000, 10\] reaches outside the image"):
            client.classify_regions(picture.jpeg, [picture.boxes[0], (0, 0, 5000, 10)])
    assert [len(top) for top in answer] == [3, 3, 3]
    assert [top[0].label in PHOTOS[photo] for top, photo in zip(answer, picture.photos[::-1])] == [True] * 3


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_asyncio_client_classifies_regions(regions_server, protocol):
    import asyncio

    picture = collage()

    async def classify():
        async with AsyncClassifierClient(url_of(regions_server, protocol), protocol, DEFAULT_REGIONS_MODEL) as client:
            return await client.classify_regions(picture.jpeg, picture.boxes), await client.classify_regions(
                picture.jpeg, np.zeros((0, 4))
            )

    answer, empty = asyncio.run(classify())
    assert empty == []
    assert [top[0].label in PHOTOS[photo] for top, photo in zip(answer, picture.photos)] == [True] * 3


# --- tritonstack classify --boxes ----------------------------------------------------------


@pytest.fixture
def collage_files(tmp_path):
    picture = collage()
    image, boxes = tmp_path / "collage.jpg", tmp_path / "boxes.json"
    image.write_bytes(picture.jpeg)
    boxes.write_text(json.dumps([list(box) for box in picture.boxes]))
    return image, boxes


@pytest.mark.parametrize("fmt", ["table", "jsonl", "csv"])
def test_classify_prints_a_line_per_box_in_order(regions_server, collage_files, capsys, fmt):
    image, boxes = collage_files
    args = [
        str(image),
        "--boxes",
        str(boxes),
        "--url",
        regions_server.grpc_url,
        "--protocol",
        "grpc",
        "--format",
        fmt,
        "--top-k",
        "3",
    ]
    assert classify_main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    photos = collage().photos
    if fmt == "jsonl":
        records = [json.loads(line) for line in lines]
        assert [record["box"] for record in records] == [0, 1, 2]
        assert [record["region"] for record in records] == [list(box) for box in collage().boxes]
        labels = [record["top"][0]["label"] for record in records]
    elif fmt == "csv":
        header, *rows = list(csv.reader(lines))
        assert header[:7] == ["path", "box", "x0", "y0", "x1", "y1", "error"] and len(header) == 7 + 3 * 3
        assert [row[1] for row in rows] == ["0", "1", "2"]
        labels = [row[7] for row in rows]
    else:
        assert [line.split("]")[0].rsplit("[", 1)[1] for line in lines] == ["box 0", "box 1", "box 2"]
        labels = [line.split("]", 1)[1].strip().split(" (")[0] for line in lines]
    assert [label in PHOTOS[photo] for label, photo in zip(labels, photos)] == [True] * 3


def test_classify_gives_the_servers_refusal_as_the_images_error_line(regions_server, tmp_path, capsys):
    image, boxes = tmp_path / "sample.jpg", tmp_path / "boxes.json"
    image.write_bytes(sample_jpeg())
    boxes.write_text(json.dumps([[0, 0, 10, 10]] * 17))  # only the server knows max_boxes
    assert (
        classify_main([str(image), "--boxes", str(boxes), "--url", regions_server.http_url, "--format", "jsonl"]) == 1
    )
    (line,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "17 boxes, above this model's max_boxes 16" in line["error"] and "451x300" in line["error"]


def test_classify_refuses_boxes_for_a_model_that_takes_none(regions_server, collage_files, capsys):
    image, boxes = collage_files
    code = classify_main(
        [str(image), "--boxes", str(boxes), "--url", regions_server.http_url, "--model", "efficientnet_lite0"]
    )
    assert code == 2
    assert "takes" in capsys.readouterr().err


# --- parity with Pillow ----------------------------------------------------------------------


def parity_cases() -> list[tuple[str, bytes, list]]:
    """Real photos (JPEG and PNG, one stored turned with EXIF orientation) and boxes of
    every kind: subjects, whole images, thin strips, fractional corners, random ones."""
    rng = np.random.default_rng(7)
    cases = [
        ("collage", collage().jpeg, collage().boxes),
        ("exif-rotated", exif_rotated(sample_jpeg()), [(140, 40, 330, 230), (0, 0, 451, 300)]),
    ]
    for name in ("chelsea.png", "coffee.png", "rocket.jpg", "astronaut.png", "motorcycle_left.png"):
        with Image.open(io.BytesIO(photo_bytes(name))) as image:
            width, height = image.size
        corners = np.sort(rng.uniform(0, 1, (4, 2, 2)), axis=1) * (width, height)
        boxes = [(0, 0, width, height), (10.5, 20.25, 60.75, height - 1.5), (0, height / 2, width, height / 2 + 7)]
        boxes += [(x0, y0, x1, y1) for (x0, y0), (x1, y1) in corners if x1 - x0 > 2 and y1 - y0 > 2]
        cases.append((name, photo_bytes(name), boxes))
    return cases


def test_each_box_matches_its_pillow_crop_classified_in_process(regions_server, model_repository):
    """The image preset's parity (tests/test_parity.py): the same top-1 and top-5, tensors
    a rounding apart on average; the probabilities served near those of Pillow's crops."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_repository / "efficientnet_lite0/1/model.onnx"))
    serialized = (model_repository / PREPROCESS / "1/model.dali").read_bytes()
    preprocessing = preset_named(PRESET).classifier.preprocessing
    served, local, level_differences = [], [], []
    for _, image, boxes in parity_cases():
        crops = np.stack(
            [
                reference.letterbox(image, box, preprocessing.crop, preprocessing.mean, preprocessing.std)
                for box in boxes
            ]
        )
        dali_crops = run_regions(serialized, [image], [boxes])[0]
        level_differences.append(np.abs(reference.levels(dali_crops - crops, preprocessing.std)).mean(axis=(1, 2, 3)))
        local.append(session.run(None, {"input": crops})[0])
        served.append(infer(regions_server, "http", image, boxes, class_count=0))
    served, local, level_differences = np.concatenate(served), np.concatenate(local), np.concatenate(level_differences)
    assert len(served) == len(local) >= 25
    assert (served.argmax(1) == local.argmax(1)).all()
    assert [set(np.argsort(-row)[:5]) for row in served] == [set(np.argsort(-row)[:5]) for row in local]
    assert level_differences.mean() <= 0.01, level_differences.round(4).tolist()
    # Measured below 0.001 here; ten times that leaves room for other CPUs' rounding.
    assert np.abs(served - local).max() <= 0.01, np.abs(served - local).max(1).round(4).tolist()


# --- load ------------------------------------------------------------------------------------


@pytest.mark.parametrize("user", ["grpc", "http"])
def test_locust_users_send_random_boxes_and_check_a_row_per_box(regions_server, tmp_path, user):
    from tritonstack.commands import loadtest
    from tritonstack.loadtests.report import final_stats

    servers = ["--url", regions_server.http_url, "--grpc-url", regions_server.grpc_url]
    bounds = ["--shape", "closed", "--users", "1", "--run-time", "60", "--max-requests", "6"]
    assert loadtest.main([*servers, "--out", str(tmp_path), "--user", user, "--boxes", "4", *bounds]) == 0
    rows = {(row["Type"], row["Name"]): row for row in final_stats(tmp_path / "locust")}
    row = rows[(user, DEFAULT_REGIONS_MODEL)]
    assert int(row["Request Count"]) >= 6 and int(row["Failure Count"]) == 0


def test_the_decode_budget_counts_the_image_once_plus_its_crops(tmp_path, model_repository):
    """max_request_pixels set to the image's pixels and two crops': two boxes pass, three do not."""
    from tritonstack.build.model_config import write_config

    out = tmp_path / "repo"
    rf.seed_lite0_export(out)
    write_repository(out, presets=(preset_named(PRESET),))
    config = read_config(out / PREPROCESS)
    config.parameters["max_request_pixels"].string_value = str(451 * 300 + 2 * 224 * 224)
    write_config(out / PREPROCESS, config)
    with TritonServer(out) as server:
        assert len(infer(server, "grpc", sample_jpeg(), [(0, 0, 100, 100)] * 2)) == 2
        with pytest.raises(InferenceServerException) as refused:
            infer(server, "grpc", sample_jpeg(), [(0, 0, 100, 100)] * 3)
    message = refused.value.message()
    assert "(135300 pixels) and their 3 crops (150528 pixels) exceed" in message, message


def test_check_refuses_regions_models_the_server_could_not_serve(tmp_path, model_repository):
    from tritonstack.build.model_config import write_config

    out = tmp_path / "repo"
    build(out, PRESET)
    config = read_config(out / PREPROCESS)
    config.max_batch_size = 4  # 4 images of 16 crops: 64 rows for a classifier of 32
    config.parameters["boxes_input"].string_value = "DALI_INPUT_0"
    write_config(out / PREPROCESS, config)
    problems = [str(problem) for problem in check_repository(out)]
    assert any("boxes_input" in p and "names no config input of TYPE_FP32 with dims [-1, 4]" in p for p in problems)
    assert any("hands on up to 64 crops per request" in p and "takes at most 32" in p for p in problems), problems


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_boxes_of_the_wrong_shape_are_refused_by_name(regions_server, protocol):
    """Triton checks the BOXES tensor against the ensemble's dims [-1, 4] before any step."""
    with pytest.raises(InferenceServerException) as refused:
        infer(regions_server, protocol, sample_jpeg(), [(1, 2, 3, 4, 5)])
    assert "BOXES" in refused.value.message() and "[-1,-1,4]" in refused.value.message(), refused.value.message()
    assert refused.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
