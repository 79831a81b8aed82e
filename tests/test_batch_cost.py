"""The classifier's preferred batch from its cost curve on this machine
(tritonstack.serve.batch_cost): the choice on known curves, the cache, and a real
server that serves the batch its (cached) curve chooses."""

from __future__ import annotations

import json

import pytest
import tritonclient.http as httpclient
from onnx import TensorProto

from tests import repo_factory as rf
from tests.conftest import TEST_STOP_GRACE_S
from tritonstack.serve import batch_cost
from tritonstack.serve.batch_cost import cached_curve, chosen_batch, with_measured_batch
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.layout import CORES_LAYOUT
from tritonstack.serve.server_config import ServerConfig
from tritonstack.serve.supervision import Supervision

CLASSIFIER = "efficientnet_lite0"


@pytest.mark.parametrize(
    ("curve", "batch"),
    [
        # EfficientNet-Lite0 on one ONNX Runtime thread, ms an image at 1 / 2 / 4 / 8.
        ({1: 4.9, 2: 4.7, 4: 4.8, 8: 5.5}, 2),  # Zen 5: 1 within the tolerance, but 1 is never served if 2 is
        ({1: 9.3, 2: 8.9, 4: 8.8, 8: 9.1}, 2),  # Zen 4: within the tolerance, the smaller
        ({1: 9.0, 2: 9.0, 4: 7.0, 8: 7.2}, 4),  # a model that gains from batching: the smallest of the cheap
        ({1: 3.0, 2: 6.0, 4: 12.0, 8: 24.0}, 1),  # no gain from batching at all
        ({1: 3.0, 2: 3.1, 4: 6.0, 8: 9.0}, 2),  # 2 within the tolerance of a cheapest 1
    ],
)
def test_the_smallest_batch_of_two_or_more_within_the_tolerance_of_the_cheapest(curve, batch):
    assert chosen_batch(curve) == batch


def test_a_curve_is_measured_once_and_read_back(tmp_path):
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(rf.add_graph())
    cache = tmp_path / "cache.json"
    curve = cached_curve(onnx, threads=1, cache=cache)
    assert sorted(curve) == list(batch_cost.SIZES) and all(ms > 0 for ms in curve.values())
    ((key, stored),) = json.loads(cache.read_text()).items()
    cache.write_text(json.dumps({key: {"1": 1.0, "2": 0.1, "4": 9.0, "8": 9.0}}))
    assert cached_curve(onnx, threads=1, cache=cache) == {1: 1.0, 2: 0.1, 4: 9.0, 8: 9.0}
    assert cached_curve(onnx, threads=2, cache=cache) != {1: 1.0, 2: 0.1, 4: 9.0, 8: 9.0}  # another key


def test_a_uint8_classifier_is_timed_with_uint8_input(tmp_path):
    """A classifier that normalizes inside its graph takes pixels as UINT8: the
    curve feeds it its own type (FP32 fed to it failed the server's start)."""
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(rf.identity_graph(TensorProto.UINT8))
    curve = batch_cost.cost_curve(onnx, threads=1, repeats=1)
    assert sorted(curve) == list(batch_cost.SIZES) and all(ms > 0 for ms in curve.values())


def test_the_builds_batch_stays_beside_the_measured_one_for_a_backlog():
    assert batch_cost.preferred_sizes(2, [8]) == [2, 8]
    assert batch_cost.preferred_sizes(8, [8]) == [8]
    assert batch_cost.preferred_sizes(4, [2, 8]) == [4, 8]


def test_a_step_without_a_preferred_batch_is_left_alone(tmp_path):
    config = {"name": "m", "max_batch_size": 8, "dynamic_batching": {}}
    assert with_measured_batch(config, tmp_path, 1) is config


def test_the_server_serves_the_batch_the_machines_curve_chooses(lite0_repository, tmp_path, monkeypatch):
    """The cache holds a curve for this very file whose cheapest batch is 2: the launcher
    (layout cores) loads the classifier preferring 2 beside the 8 the build wrote (for a backlog)."""
    monkeypatch.setenv(batch_cost.CACHE_ENV, str(tmp_path))
    onnx = lite0_repository / CLASSIFIER / "1" / "model.onnx"
    measured = cached_curve(onnx, threads=1, cache=batch_cost.cache_path())
    (key,) = json.loads(batch_cost.cache_path().read_text())
    batch_cost.cache_path().write_text(json.dumps({key: {"1": 9.0, "2": 5.0, "4": 9.0, "8": 9.0}}))
    assert set(measured) == set(batch_cost.SIZES)
    config = ServerConfig(lite0_repository, stop_grace_s=TEST_STOP_GRACE_S, layout=CORES_LAYOUT)
    with TritonServer(config, Supervision(warmup_s=0)) as server:
        with httpclient.InferenceServerClient(server.http_url) as client:
            served = client.get_model_config(CLASSIFIER)
    assert served["dynamic_batching"]["preferred_batch_size"] == [2, 8]
