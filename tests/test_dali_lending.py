"""The dali backend hands a run's outputs to the stub as views of DALI's buffers when
that run is the last before execute returns (tritonstack.backends.dali.pipeline:
PipelineRunner.run(borrow=True)); every earlier run of the same execute is copied,
since the next run reuses the buffers. A merged batch split into several runs by the
decode budget is where a wrong choice would show: a request would get another
request's crop."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests import repo_factory as rf
from tests.conftest import TEST_STOP_GRACE_S
from tests.test_hostile import add_parameters
from tritonstack.backends.dali.pipeline import PipelineRunner
from tritonstack.samples.photos import photo_bytes
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import ServerConfig

PREPROCESS = "preprocess_dali_efficientnet_lite0"
# 135k, 240k, 273k and 262k pixels: no two of the last three fit one run of 300k.
PHOTOS = ("chelsea.png", "coffee.png", "rocket.jpg", "astronaut.png")
BUDGET = {"max_pixels": 300_000, "max_request_pixels": 300_000, "max_batch_pixels": 300_000}


def encoded(name: str) -> np.ndarray:
    return np.frombuffer(photo_bytes(name), np.uint8)[None]


@pytest.fixture(scope="module")
def split_runs_server(model_repository, tmp_path_factory):
    root = tmp_path_factory.mktemp("lending")
    shutil.copytree(model_repository / PREPROCESS, root / PREPROCESS)
    config = root / PREPROCESS / "config.pbtxt"
    # Requests sent together wait to be merged into one execute (within the queue policy's 300 ms).
    delayed = "dynamic_batching {\n  max_queue_delay_microseconds: 150000"
    config.write_text(config.read_text().replace("dynamic_batching {", delayed, 1))
    add_parameters(root / PREPROCESS, BUDGET)
    with TritonServer(ServerConfig(root, stop_grace_s=TEST_STOP_GRACE_S)) as server:
        yield server


def crops(client, requests: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    outcomes = rf.infer_concurrently(client, PREPROCESS, requests, ["DALI_OUTPUT_0"])
    assert not [str(o) for o in outcomes if isinstance(o, Exception)], [str(o) for o in outcomes]
    return [outcome.as_numpy("DALI_OUTPUT_0") for outcome in outcomes]


def merged_requests(client, server) -> int:
    """Requests the model answered beyond its executions: > 0 once any were merged."""
    (stats,) = client.get_inference_statistics(PREPROCESS, headers=server.admin_headers("http"))["model_stats"]
    return int(stats["inference_count"]) - int(stats["execution_count"])


def test_each_request_of_a_batch_run_in_parts_gets_its_own_crop(split_runs_server):
    with httpclient.InferenceServerClient(split_runs_server.http_url, concurrency=4) as client:
        alone = {name: crops(client, [{"DALI_INPUT_0": encoded(name)}])[0] for name in PHOTOS}
        assert merged_requests(client, split_runs_server) == 0
        for order in (PHOTOS, PHOTOS[::-1]):
            together = crops(client, [{"DALI_INPUT_0": encoded(name)} for name in order])
            for name, crop in zip(order, together):
                np.testing.assert_allclose(crop, alone[name], atol=1e-6, err_msg=name)
        assert merged_requests(client, split_runs_server) > 0  # the executes merged requests and ran them in parts


def test_a_borrowed_run_gives_what_a_copied_one_does(model_repository: Path):
    serialized = (model_repository / PREPROCESS / "1" / "model.dali").read_bytes()
    runner = PipelineRunner(serialized, 8, None, 1, ["DALI_INPUT_0"])
    feeds = [{"DALI_INPUT_0": encoded(name)} for name in PHOTOS[:2]]
    copied = runner.run(feeds)
    borrowed = runner.run(feeds, borrow=True)
    for copy, view in zip(copied, borrowed):
        np.testing.assert_array_equal(copy[0], view[0])
    assert not np.shares_memory(copied[0][0], borrowed[0][0])
    # The copies outlive the runs that made them; the views only until the next run.
    again = runner.run(feeds[::-1])
    np.testing.assert_array_equal(again[1][0], copied[0][0])
