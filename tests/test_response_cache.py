"""Triton's response cache: `tritonstack build --response-cache` enables it on the
ensembles, `tritonstack serve --response-cache-mb` gives the server a local cache and
turns it on for ensembles built without it (through the API, the files untouched); a
repeated upload is then answered from the cache, a new one computed. Off by default."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests import repo_factory as rf
from tritonstack.build.presets import BuildOptions, preset_named
from tritonstack.build.repository import write_repository
from tritonstack.commands import serve
from tritonstack.contract import DEFAULT_MODEL, ENSEMBLE_INPUT, ENSEMBLE_OUTPUT, pad_batch
from tritonstack.samples.photos import photo_bytes
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import ServerConfig
from tritonstack.serve.supervision import Supervision

CACHE_BYTES = 16 * 2**20


@pytest.fixture(scope="module")
def cached_server(tmp_path_factory, model_repository):
    out = tmp_path_factory.mktemp("cached")
    rf.seed_lite0_export(out)
    write_repository(out, presets=(preset_named("dali_efficientnet_lite0"),), options=BuildOptions(response_cache=True))
    config = ServerConfig(out, restricted_apis=(), response_cache_bytes=CACHE_BYTES)
    with TritonServer(config, Supervision(warmup_s=0)) as running:
        yield running


def infer(client, image: bytes) -> np.ndarray:
    batch = pad_batch([image])
    tensor = httpclient.InferInput(ENSEMBLE_INPUT, list(batch.shape), "UINT8")
    tensor.set_data_from_numpy(batch)
    return client.infer(DEFAULT_MODEL, [tensor]).as_numpy(ENSEMBLE_OUTPUT)


def cache_counts(client) -> tuple[int, int]:
    stats = client.get_inference_statistics(DEFAULT_MODEL)["model_stats"][0]["inference_stats"]
    return int(stats["cache_hit"]["count"]), int(stats["cache_miss"]["count"])


def test_a_repeated_upload_is_answered_from_the_cache(cached_server):
    with httpclient.InferenceServerClient(cached_server.http_url) as client:
        assert client.get_model_config(DEFAULT_MODEL)["response_cache"] == {"enable": True}
        hits, misses = cache_counts(client)
        first = infer(client, photo_bytes("coffee.png"))
        again = infer(client, photo_bytes("coffee.png"))
        other = infer(client, photo_bytes("chelsea.png"))
        assert cache_counts(client) == (hits + 1, misses + 2)
    np.testing.assert_array_equal(first, again)
    assert int(np.argmax(other)) != int(np.argmax(first))


def test_the_cache_is_off_by_default(model_repository):
    configs = [path.read_text() for path in model_repository.glob("*/config.pbtxt")]
    assert configs and not any("response_cache" in text for text in configs)
    assert not BuildOptions().response_cache and ServerConfig(model_repository).cache_args() == []


def test_serve_gives_the_server_a_cache_of_the_size_asked(model_repository):
    args = serve.parser().parse_args(["--model-repository", str(model_repository), "--response-cache-mb", "64"])
    command = TritonServer(serve.serve_options(args).config).command(model_repository)
    assert f"--cache-config=local,size={64 * 2**20}" in command
    assert any(arg.startswith("--cache-directory=") for arg in command)


def test_a_server_with_a_cache_turns_it_on_for_ensembles_built_without_it(tmp_path, model_repository):
    """`tritonstack serve --response-cache-mb` on a repository built without
    `--response-cache` (the committed one): the launcher reloads each ensemble with the
    cache on, through the API, and writes nothing into the repository."""
    out = tmp_path / "plain"
    rf.seed_lite0_export(out)
    write_repository(out, presets=(preset_named("dali_efficientnet_lite0"),), options=BuildOptions())
    files_before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    config = ServerConfig(out, restricted_apis=(), response_cache_bytes=CACHE_BYTES)
    with TritonServer(config, Supervision(warmup_s=0)) as running:
        with httpclient.InferenceServerClient(running.http_url) as client:
            assert client.get_model_config(DEFAULT_MODEL)["response_cache"] == {"enable": True}
            hits, misses = cache_counts(client)
            first = infer(client, photo_bytes("coffee.png"))
            again = infer(client, photo_bytes("coffee.png"))
            assert cache_counts(client) == (hits + 1, misses + 1)
    np.testing.assert_array_equal(first, again)
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == files_before
