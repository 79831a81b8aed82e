"""Bad input against the running ensemble: every request gets a correct
classification (when its bytes are a decodable image) or a client error naming
what was wrong, for that request only; never a 5xx or a hang; and the server
answers the next good request. Inputs are generated here from a real photo."""

from __future__ import annotations

import concurrent.futures
import io
import threading
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from tritonstack.client.protocol import parse_classification
from tritonstack.contract import BATCH_PRIORITY, DEFAULT_MODEL, pad_batch
from tritonstack.samples.photos import PHOTOS, photo_bytes

CAT = PHOTOS["chelsea.png"]
TIMEOUT_S = 30.0
SHARED_BATCH_BURSTS = 5


def chelsea() -> Image.Image:
    return Image.open(io.BytesIO(photo_bytes("chelsea.png"))).convert("RGB")


def encode(image: Image.Image, format: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=format, **options)
    return out.getvalue()


def jpeg(**options) -> bytes:
    return encode(chelsea(), "JPEG", quality=90, **options)


def corrupted_entropy() -> bytes:
    data = bytearray(jpeg())
    start = data.index(b"\xff\xda") + 200  # inside the scan, after the SOS header
    rng = np.random.default_rng(0)
    data[start : start + 400] = rng.integers(0, 255, 400, dtype=np.uint8).tobytes().replace(b"\xff", b"\x00")
    return bytes(data)


def header_only() -> bytes:
    data = jpeg()
    return data[: data.index(b"\xff\xda")]


def decompression_bomb() -> bytes:
    """A valid 16x16 JPEG whose frame header declares 60000x60000 pixels."""
    data = bytearray(encode(Image.new("RGB", (16, 16), "gray"), "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") * 2  # height, width
    return bytes(data)


def png_16bit() -> bytes:
    gray = np.asarray(chelsea().convert("L"), dtype=np.uint16) * 257
    return encode(Image.fromarray(gray), "PNG")


def exif_rotated() -> bytes:
    """Pixels stored rotated 90° clockwise, with EXIF orientation 8 (rotate 90° to
    view): a viewer that honours EXIF shows the upright cat."""
    exif = Image.Exif()
    exif[0x0112] = 8
    return encode(chelsea().transpose(Image.Transpose.ROTATE_270), "JPEG", quality=90, exif=exif)


# name -> (bytes, expected): "cat" must classify as a cat; "error" must be a client
# error whose message contains the given words; "image" must classify (any label).
CASES = {
    "zero_length": (lambda: b"", ("error", ["decoders.image"])),
    "random_bytes": (
        lambda: np.random.default_rng(1).integers(0, 256, 5000, dtype=np.uint8).tobytes(),
        ("error", ["decoders.image"]),
    ),
    "text": (lambda: b"This is not an image, it is a sentence.\n" * 20, ("error", ["decoders.image"])),
    "truncated_jpeg": (lambda: jpeg()[: len(jpeg()) // 2], ("error", ["decoders.image"])),
    "corrupted_entropy_jpeg": (corrupted_entropy, ("image", None)),
    "header_only_jpeg": (header_only, ("error", ["decoders.image"])),
    "gif": (lambda: encode(chelsea(), "GIF"), ("error", ["decoders.image"])),
    "png_rgb": (lambda: encode(chelsea(), "PNG"), ("cat", None)),
    "png_rgba": (lambda: encode(chelsea().convert("RGBA"), "PNG"), ("cat", None)),
    "png_palette": (lambda: encode(chelsea().convert("P", palette=Image.Palette.ADAPTIVE), "PNG"), ("cat", None)),
    "png_16bit": (png_16bit, ("cat", None)),
    "jpeg_grayscale": (lambda: encode(chelsea().convert("L"), "JPEG", quality=90), ("cat", None)),
    "jpeg_cmyk": (lambda: encode(chelsea().convert("CMYK"), "JPEG", quality=90), ("cat", None)),
    "bmp": (lambda: encode(chelsea(), "BMP"), ("cat", None)),
    "tiff": (lambda: encode(chelsea(), "TIFF"), ("cat", None)),
    "webp": (lambda: encode(chelsea(), "WEBP", quality=90), ("cat", None)),
    "progressive_jpeg": (lambda: jpeg(progressive=True), ("cat", None)),
    "exif_rotated_jpeg": (exif_rotated, ("cat", None)),
    "one_pixel": (lambda: encode(Image.new("RGB", (1, 1), "red"), "PNG"), ("image", None)),
    "extreme_aspect_4000x3": (lambda: encode(chelsea().resize((4000, 3)), "PNG"), ("image", None)),
    "decompression_bomb": (decompression_bomb, ("error", ["60000x60000", "max_pixels"])),
}


def classify_http(server, data: bytes, top_k: int = 1, priority: int = 0):
    """`priority`: BATCH_PRIORITY for requests sent all at once, which may queue past the
    latency objective behind a bad image's pipeline rebuild."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=TIMEOUT_S)
    try:
        batch = pad_batch([data]) if data else np.zeros((1, 0), np.uint8)
        tensor = httpclient.InferInput("INPUT", list(batch.shape), "UINT8")
        tensor.set_data_from_numpy(batch, binary_data=True)
        output = httpclient.InferRequestedOutput("OUTPUT", binary_data=True, class_count=top_k)
        result = client.infer(DEFAULT_MODEL, [tensor], outputs=[output], priority=priority)
        return parse_classification(result.as_numpy("OUTPUT")[0])
    finally:
        client.close()


def assert_still_serving(server):
    assert httpclient.InferenceServerClient(server.http_url).is_server_ready()
    assert classify_http(server, photo_bytes("coffee.png"))[0].label == "espresso"


def classify_grpc(server, data: bytes, top_k: int = 1):
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        batch = pad_batch([data]) if data else np.zeros((1, 0), np.uint8)
        tensor = grpcclient.InferInput("INPUT", list(batch.shape), "UINT8")
        tensor.set_data_from_numpy(batch)
        output = grpcclient.InferRequestedOutput("OUTPUT", class_count=top_k)
        result = client.infer(DEFAULT_MODEL, [tensor], outputs=[output], client_timeout=TIMEOUT_S)
        return parse_classification(result.as_numpy("OUTPUT")[0])


CLASSIFY = {"http": classify_http, "grpc": classify_grpc}
# What a client error looks like on each protocol: a pipeline (decoder) failure is
# UNKNOWN over gRPC, as the C++ DALI backend answers; a refusal before the pipeline
# (the decompression bomb's header) is INVALID_ARGUMENT.
CLIENT_ERRORS = {"http": {"400"}, "grpc": {str(grpc.StatusCode.UNKNOWN), str(grpc.StatusCode.INVALID_ARGUMENT)}}


def expected_status(case: str, protocol: str) -> str:
    if protocol == "http":
        return "400"
    return str(grpc.StatusCode.INVALID_ARGUMENT if case == "decompression_bomb" else grpc.StatusCode.UNKNOWN)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", list(CASES))
def test_each_input_is_classified_or_refused_clearly(case, protocol, server):
    make, (expected, words) = CASES[case]
    data = make()
    started = time.monotonic()
    try:
        outcome = CLASSIFY[protocol](server, data)
    except InferenceServerException as error:
        outcome = error
    assert time.monotonic() - started < TIMEOUT_S
    if expected == "error":
        assert isinstance(outcome, InferenceServerException), outcome
        assert outcome.status() == expected_status(case, protocol), outcome
        assert all(word in outcome.message() for word in words), outcome.message()
    elif expected == "cat":
        assert not isinstance(outcome, Exception), outcome
        assert outcome[0].label in CAT, outcome
    else:  # decodable or not, never a server error
        assert not isinstance(outcome, Exception) or outcome.status() in CLIENT_ERRORS[protocol], outcome
    assert_still_serving(server)


def test_exif_orientation_is_applied(server):
    """Policy: the decoder honours EXIF orientation (DALI's default), so the
    classifier sees the upright image the viewer sees."""
    client = httpclient.InferenceServerClient(server.http_url)
    upright, tagged, sideways = (
        probabilities(client, data)
        for data in (
            jpeg(),
            exif_rotated(),
            encode(chelsea().transpose(Image.Transpose.ROTATE_270), "JPEG", quality=90),
        )
    )
    client.close()
    assert np.abs(tagged - upright).sum() < np.abs(sideways - upright).sum() / 4


def probabilities(client, data: bytes) -> np.ndarray:
    batch = pad_batch([data])
    tensor = httpclient.InferInput("INPUT", list(batch.shape), "UINT8")
    tensor.set_data_from_numpy(batch, binary_data=True)
    return client.infer(DEFAULT_MODEL, [tensor]).as_numpy("OUTPUT")[0]


TENSOR_CASES = {
    # name -> (tensor name, datatype, array, words in the error)
    "fp32_instead_of_uint8": ("INPUT", "FP32", np.zeros((1, 100), np.float32), ["'INPUT'", "'FP32'", "'UINT8'"]),
    "bytes_instead_of_uint8": (
        "INPUT",
        "BYTES",
        np.array([[b"\xff\xd8"]], dtype=np.object_),
        ["'INPUT'", "'BYTES'", "'UINT8'"],
    ),
    "wrong_input_name": ("IMAGE", "UINT8", np.zeros((1, 100), np.uint8), ["IMAGE"]),
    "wrong_rank": ("INPUT", "UINT8", np.zeros((1, 10, 10), np.uint8), ["shape"]),
    "batch_above_max_batch_size": ("INPUT", "UINT8", np.zeros((33, 10), np.uint8), ["batch-size", "32"]),
}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", list(TENSOR_CASES))
def test_malformed_tensors_are_refused_by_name(case, protocol, server):
    name, datatype, array, words = TENSOR_CASES[case]
    api = httpclient if protocol == "http" else grpcclient
    client = api.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    tensor = api.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    with pytest.raises(InferenceServerException) as failure:
        client.infer(DEFAULT_MODEL, [tensor])
    client.close()
    expected = "400" if protocol == "http" else str(grpc.StatusCode.INVALID_ARGUMENT)
    assert failure.value.status() == expected, failure.value
    assert all(word in failure.value.message() for word in words), failure.value.message()
    assert_still_serving(server)


def test_good_and_bad_images_sharing_dynamic_batches(server):
    """Bad images interleaved with good ones, all in flight at once: the bad ones
    fail alone, every good one gets its right label. A burst on a slow machine can
    reach the server one request at a time, so bursts repeat (each one checked)
    until one of them shared a batch."""
    good = {"chelsea.png": CAT, "coffee.png": {"espresso"}, "rocket.jpg": PHOTOS["rocket.jpg"]}
    bad = [b"", b"garbage" * 50, header_only(), decompression_bomb(), encode(chelsea(), "GIF")]
    sends = [(name, photo_bytes(name)) for name in good] * 4
    for index, data in enumerate(bad):
        sends.insert(index * 3 + 1, (None, data))
    for _ in range(SHARED_BATCH_BURSTS):
        stats_before = preprocessing_stats(server)
        outcomes = burst(server, [data for _, data in sends])
        for (name, _), outcome in zip(sends, outcomes):
            if name is None:
                assert isinstance(outcome, InferenceServerException) and outcome.status() == "400", outcome
            else:
                assert not isinstance(outcome, Exception), (name, outcome)
                assert outcome[0].label in good[name], (name, outcome)
        after = preprocessing_stats(server)
        executions = after["execution_count"] - stats_before["execution_count"]
        if executions < after["inference_count"] - stats_before["inference_count"]:
            return
    pytest.fail(f"no batch was shared in {SHARED_BATCH_BURSTS} bursts of {len(sends)} requests")


def burst(server, payloads: list[bytes]) -> list:
    """Every payload sent by its own client, released together by a barrier once all
    threads are up; each request's result or exception, in order."""
    start = threading.Barrier(len(payloads))

    def send(data: bytes):
        start.wait(timeout=TIMEOUT_S)
        return classify_http(server, data, priority=BATCH_PRIORITY)

    with concurrent.futures.ThreadPoolExecutor(len(payloads)) as pool:
        futures = [pool.submit(send, data) for data in payloads]
    return [future.exception() or future.result() for future in futures]


def preprocessing_stats(server) -> dict:
    client = httpclient.InferenceServerClient(server.http_url)
    stats = client.get_inference_statistics("preprocess_dali_efficientnet_lite0", headers=server.admin_headers())[
        "model_stats"
    ][0]
    client.close()
    return {key: int(stats[key]) for key in ("execution_count", "inference_count")}
