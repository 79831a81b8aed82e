"""Error isolation inside one shared batch, proven rather than left to chance.

Each model here waits up to QUEUE_DELAY_US for its preferred batch size N, so N
requests sent together are merged into exactly one execution (checked from the
statistics: execution_count +1, inference_count +N). Inside that one execution the
bad requests fail alone: every good request gets its own answer, every bad one a
clear client error. Both Python-based backends: `dali` (a decoder refusing bytes that
are not an image) and `onnxruntime` (ONNX Runtime refusing an out-of-range index)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from tests import repo_factory as rf
from tests.processes import wait_for
from tests.test_decodable import corrupt_png_with_valid_crcs
from tritonstack.build.model_config import DynamicBatching, ModelConfig, Tensor
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import ServerConfig

N = 5
# Long enough that N requests sent together always meet in the queue, even on a
# loaded machine; reached only if they do not (then the statistics assert fails).
QUEUE_DELAY_US = 15_000_000
BATCHING = DynamicBatching(max_queue_delay_us=QUEUE_DELAY_US, preferred_batch_sizes=(N,))
TABLE = (10.0, 20.0, 30.0, 40.0)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repository = tmp_path_factory.mktemp("isolation")
    decoder = rf.dali_config(
        "isolated_decoder",
        max_batch_size=N,
        dynamic_batching=BATCHING,
        inputs=(Tensor("ENCODED", "UINT8", (-1,), allow_ragged_batch=True),),
        outputs=(Tensor("IMAGE", "UINT8", (8, 8, 3)),),
    )
    rf.write_model(repository, decoder, {"model.dali": rf.serialized(rf.decode_pipeline, batch_size=N)})
    lookup = ModelConfig(
        name="isolated_lookup",
        backend="onnxruntime",
        max_batch_size=N,
        instance_groups=rf.CPU,
        dynamic_batching=BATCHING,
        inputs=(Tensor("X", "INT64", (1,)),),
        outputs=(Tensor("Y", "FP32", (1,)),),
    )
    rf.write_model(repository, lookup, {"model.onnx": rf.lookup_graph(TABLE)})
    return repository


@pytest.fixture(scope="module")
def http(repository):
    # Default model control: every model of the repository loads at start.
    with TritonServer(ServerConfig(repository, restricted_apis=())) as running:
        client = httpclient.InferenceServerClient(running.http_url, concurrency=N)
        try:
            yield client
        finally:
            client.close()


def counts(client, model: str) -> tuple[int, int]:
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return int(stats["execution_count"]), int(stats["inference_count"])


def counts_after(client, model: str, before: tuple[int, int], requests: int) -> tuple[int, int]:
    """The counts once the `requests` since `before` are in: Triton records an
    execution's statistics after it answers, so a read right after may miss them."""
    return wait_for(
        lambda: (now := counts(client, model))[1] - before[1] >= requests and now,
        timeout_s=10,
        what=f"the statistics of {requests} requests",
    )


def solid_png(rgb: tuple[int, int, int]) -> np.ndarray:
    out = io.BytesIO()
    Image.new("RGB", (16, 16), rgb).save(out, format="PNG")
    return np.frombuffer(out.getvalue(), np.uint8)[None]


def raw(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.uint8)[None]


def test_bad_images_fail_alone_inside_one_dali_execution(http):
    colours = {0: (255, 0, 0), 2: (0, 200, 0), 4: (10, 20, 250)}
    # 1 is refused before the pipeline runs (tritonstack.media.decodable); 3 passes that
    # screen and fails inside the decoder, in the merged run: the others are re-run.
    bad = {1: raw(b"this is a sentence, not an image " * 8), 3: raw(corrupt_png_with_valid_crcs())}
    requests = [{"ENCODED": solid_png(colours[i]) if i in colours else bad[i]} for i in range(N)]
    before = counts(http, "isolated_decoder")
    results = rf.infer_concurrently(http, "isolated_decoder", requests, ["IMAGE"])
    after = counts_after(http, "isolated_decoder", before, N)

    assert (after[0] - before[0], after[1] - before[1]) == (1, N), "the N requests were not one execution"
    for index, result in enumerate(results):
        if index in colours:
            assert not isinstance(result, Exception), (index, result)
            # A solid image decodes and resizes to its own colour: not a neighbour's.
            expected = np.broadcast_to(np.array(colours[index], np.uint8), (1, 8, 8, 3))
            np.testing.assert_allclose(result.as_numpy("IMAGE"), expected, atol=1)
        else:
            assert isinstance(result, InferenceServerException), (index, result)
            assert result.status() == "400", result
            assert "decoders.image" in result.message(), result.message()


def test_refused_tensor_fails_alone_inside_one_onnxruntime_execution(http):
    # Index 7 and -9 are outside the 4-entry table: ONNX Runtime refuses the merged
    # batch, the backend re-runs each request so only those two fail.
    indices = [0, 7, 3, -9, 2]
    requests = [{"X": np.array([[index]], np.int64)} for index in indices]
    before = counts(http, "isolated_lookup")
    results = rf.infer_concurrently(http, "isolated_lookup", requests, ["Y"])
    after = counts_after(http, "isolated_lookup", before, N)

    assert (after[0] - before[0], after[1] - before[1]) == (1, N), "the N requests were not one execution"
    expected_values = {0: 10.0, 3: 40.0, 2: 30.0}
    for index, result in zip(indices, results):
        if index in expected_values:
            assert not isinstance(result, Exception), (index, result)
            np.testing.assert_array_equal(result.as_numpy("Y"), [[expected_values[index]]])
        else:
            assert isinstance(result, InferenceServerException), (index, result)
            assert result.status() == "400", result
            assert "Gather" in result.message() and "out of" in result.message(), result.message()
