"""The served preprocessing against an independent reference: Pillow + NumPy
written in tests/reference.py (not tritonstack's Pillow model), with literal
tolerances in 0..255 pixel levels, measured on these photos. Mean 127 and std 128
are EfficientNet-Lite's published normalization, written here as literals."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests import repo_factory as rf
from tests.reference import levels, preprocess, read_labels
from tritonstack.client.classifier import ClassifierClient
from tritonstack.contract import pad_batch
from tritonstack.samples.photos import PHOTOS, photo_bytes

LITE0 = {"resize_shorter": 256, "crop": 224, "mean": (127.0, 127.0, 127.0), "std": (128.0, 128.0, 128.0)}


def served_preprocessing(server, model: str, images: list[bytes]) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        return rf.infer_http(client, model, {"DALI_INPUT_0": pad_batch(images)}, ["DALI_OUTPUT_0"]).as_numpy(
            "DALI_OUTPUT_0"
        )
    finally:
        client.close()


@pytest.fixture(scope="module")
def photos():
    return {name: photo_bytes(name) for name in PHOTOS}


@pytest.fixture(scope="module")
def served(server, photos):
    images = list(photos.values())
    return {
        preprocessor: served_preprocessing(server, f"preprocess_{preprocessor}_efficientnet_lite0", images)
        for preprocessor in ("dali", "python")
    }


@pytest.mark.parametrize("preprocessor", ["dali", "python"])
def test_served_preprocessing_matches_an_independent_pillow_reference(preprocessor, served, photos):
    for name, tensor in zip(photos, served[preprocessor]):
        expected = preprocess(photos[name], **LITE0)
        assert tensor.shape == expected.shape == (3, 224, 224), name
        difference = np.abs(levels(tensor - expected, LITE0["std"]))
        # Measured: mean 0.15-0.78 levels, 90% within 2, 99% within 7; a few pixels
        # differ by up to 19 levels where Pillow's 8-bit resize and the crop anchor
        # round differently. A wrong mean, std, resize or crop moves far more.
        assert difference.mean() <= 1.0, (name, difference.mean())
        assert np.quantile(difference, 0.9) <= 2.0, (name, np.quantile(difference, 0.9))
        assert np.quantile(difference, 0.99) <= 8.0, (name, np.quantile(difference, 0.99))
        assert difference.max() <= 25.0, (name, difference.max())


def test_served_dali_and_pillow_preprocessing_agree_to_one_level(served):
    difference = np.abs(levels(served["dali"] - served["python"], LITE0["std"]))
    assert difference.max() <= 1.0 + 1e-4, difference.max()  # one level of rounding at most
    assert difference.mean() <= 1e-3, difference.mean()  # and almost never


def test_served_dali_and_pillow_ensembles_agree_on_log_probabilities(server, photos):
    images = list(photos.values())
    with (
        ClassifierClient(server.grpc_url, protocol="grpc", model="ensemble_dali_efficientnet_lite0") as dali,
        ClassifierClient(server.grpc_url, protocol="grpc", model="ensemble_python_efficientnet_lite0") as pillow,
    ):
        from_dali, from_pillow = dali.probabilities(images), pillow.probabilities(images)
    # Log-probabilities are the logits up to a per-image constant: compare them on
    # each image's top 5, where a wrong tensor would move them by far more.
    for row, (dali_row, pillow_row) in enumerate(zip(from_dali, from_pillow)):
        top5 = np.argsort(dali_row)[::-1][:5]
        assert list(np.argsort(pillow_row)[::-1][:5]) == list(top5), row
        np.testing.assert_allclose(np.log(pillow_row[top5]), np.log(dali_row[top5]), atol=0.05, rtol=0)


def test_labels_come_from_the_label_file(server, model_repository, photos):
    labels = read_labels(model_repository / "efficientnet_lite0" / "labels.txt")
    assert len(labels) == 1000 and labels[0] == "tench"
    with ClassifierClient(server.http_url, model="ensemble_dali_efficientnet_lite0") as client:
        (top,) = client.classify([photos["coffee.png"]], top_k=3)
        probabilities = client.probabilities([photos["coffee.png"]])[0]
    expected = np.argsort(probabilities)[::-1][:3]
    assert [p.label for p in top] == [labels[index] for index in expected]
    assert top[0].label == "espresso" and labels.index("espresso") == 967
