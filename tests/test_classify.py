"""Real photos through the real stack: tritonserver, DALI, ONNX Runtime."""

import pytest

from tritonstack.client.classifier import ClassifierClient
from tritonstack.samples.photos import PHOTOS, photo_bytes

CAT = PHOTOS["chelsea.png"]


@pytest.fixture(params=["http", "grpc"])
def client(request, server):
    url = server.http_url if request.param == "http" else server.grpc_url
    with ClassifierClient(url, protocol=request.param) as connected:
        yield connected


def test_cat_photo_is_a_cat(client):
    top = client.classify([photo_bytes("chelsea.png")], top_k=5)[0]
    assert top[0].label in CAT, top
    assert len(top) == 5
    assert top[0].score >= top[1].score >= top[4].score


def test_coffee_photo_is_espresso(client):
    top = client.classify([photo_bytes("coffee.png")], top_k=3)[0]
    assert (top[0].label, top[0].index) == ("espresso", 967), top


def test_several_images_of_different_sizes_in_one_request(client):
    names = ["coffee.png", "chelsea.png", "rocket.jpg"]
    results = client.classify([photo_bytes(name) for name in names], top_k=1)
    assert [top[0].label in PHOTOS[name] for name, top in zip(names, results)] == [True] * 3


def test_probabilities_sum_to_one(client):
    probabilities = client.probabilities([photo_bytes("coffee.png")])
    assert probabilities.shape == (1, 1000)
    assert probabilities.sum() == pytest.approx(1.0, abs=1e-4)
