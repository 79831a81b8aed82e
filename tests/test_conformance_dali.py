"""Our `dali` backend against the C++ dali_backend's contract, on a real
tritonserver in explicit model-control mode: each test writes a small model,
loads it, and checks what the server answers (status codes and messages)."""

from __future__ import annotations

from dataclasses import replace

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from nvidia.dali import fn, pipeline_def, types
from tritonclient.utils import InferenceServerException

from tests import repo_factory as rf
from tests.processes import wait_for
from tritonstack.build.model_config import DynamicBatching, Tensor
from tritonstack.samples.photos import photo_bytes, sample_jpeg
from tritonstack.serve.process_tree import rss_parts_mib


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return tmp_path_factory.mktemp("dali_conformance")


@pytest.fixture(scope="module")
def triton(repository):
    with rf.explicit_server(repository) as running:
        yield running


@pytest.fixture(scope="module")
def http(triton):
    with httpclient.InferenceServerClient(triton.http_url, concurrency=8) as client:
        yield client


@pytest.fixture(scope="module")
def identity(repository, http):
    name = rf.write_model(
        repository, rf.identity_config("identity"), {"model.dali": rf.serialized(rf.identity_pipeline)}
    )
    http.load_model(name)
    return name


def ragged_rows(*lengths: int) -> list[np.ndarray]:
    return [np.arange(length, dtype=np.uint8)[None] for length in lengths]


# --- finding the pipeline ------------------------------------------------------


def test_identity_round_trips_over_http_and_grpc(identity, http, triton):
    data = np.arange(100, dtype=np.uint8).reshape(2, 50)
    result = rf.infer_http(http, identity, {"DALI_INPUT_0": data}, ["DALI_OUTPUT_0"])
    np.testing.assert_array_equal(result.as_numpy("DALI_OUTPUT_0"), data)
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        tensor = grpcclient.InferInput("DALI_INPUT_0", list(data.shape), "UINT8")
        tensor.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer(identity, [tensor]).as_numpy("DALI_OUTPUT_0"), data)


def test_default_model_filename_is_honoured(repository, http):
    name = rf.write_model(
        repository,
        rf.identity_config("renamed_file"),
        {"preprocess.bin": rf.serialized(rf.identity_pipeline)},
        default_model_filename="preprocess.bin",
    )
    http.load_model(name)
    data = np.full((1, 3), 7, np.uint8)
    np.testing.assert_array_equal(
        rf.infer_http(http, name, {"DALI_INPUT_0": data}, ["DALI_OUTPUT_0"]).as_numpy("DALI_OUTPUT_0"), data
    )


def test_dali_py_autoserialize_is_serialized_at_load(repository, http):
    name = rf.write_model(repository, rf.identity_config("autoserialized"), {"dali.py": rf.AUTOSERIALIZE_SCRIPT})
    http.load_model(name)
    data = np.array([[1, 2, 3]], np.uint8)
    result = rf.infer_http(http, name, {"DALI_INPUT_0": data}, ["DALI_OUTPUT_0"])
    np.testing.assert_array_equal(result.as_numpy("DALI_OUTPUT_0"), data * 2)


def test_missing_pipeline_names_where_it_looked(repository, http):
    name = rf.write_model(repository, rf.identity_config("no_pipeline"), {})
    message = rf.load_error(http, name)
    assert "no_pipeline/1/model.dali" in message and "no_pipeline/1/dali.py" in message, message


def test_missing_pipeline_fails_in_the_cpp_backends_words(repository, http):
    """src/dali_model.h, LoadModel."""
    name = rf.write_model(repository, rf.identity_config("no_pipeline_words"), {})
    message = rf.load_error(http, name)
    assert "Failed to load model file. The program looked in the following locations: " in message, message
    assert "Please make sure that the model exists in any of the locations and is properly serialized" in message


def test_default_model_filename_naming_a_script_is_autoserialized(repository, http):
    """src/dali_model.h: the default location is tried serialized, then autoserialized."""
    name = rf.write_model(
        repository,
        rf.identity_config("script_as_default"),
        {"pipeline.py": rf.AUTOSERIALIZE_SCRIPT},
        default_model_filename="pipeline.py",
    )
    http.load_model(name)
    data = np.array([[1, 2, 3]], np.uint8)
    result = rf.infer_http(http, name, {"DALI_INPUT_0": data}, ["DALI_OUTPUT_0"])
    np.testing.assert_array_equal(result.as_numpy("DALI_OUTPUT_0"), data * 2)


def test_unreadable_default_file_falls_back_to_dali_py(repository, http):
    name = rf.write_model(
        repository,
        rf.identity_config("fallback_after_garbage"),
        {"model.dali": b"not a pipeline", "dali.py": rf.AUTOSERIALIZE_SCRIPT},
    )
    http.load_model(name)
    data = np.array([[4]], np.uint8)
    np.testing.assert_array_equal(
        rf.infer_http(http, name, {"DALI_INPUT_0": data}, ["DALI_OUTPUT_0"]).as_numpy("DALI_OUTPUT_0"), data * 2
    )


@pytest.mark.parametrize("filename, bad", [("../1/model.dali", "/"), ("sub/model.dali", "/")])
def test_default_model_filename_with_a_path_separator_is_refused(repository, http, filename, bad):
    """src/utils/utils.h, ValidateFilename: no path from a config is followed. (A quote
    or a space is refused by `tritonstack check`, tests/test_check.py: with one in the
    name, Triton 2.51's Python backend never starts the model's stub.)"""
    name = rf.write_model(
        repository,
        rf.identity_config(f"bad_filename_{len(filename)}"),
        {"model.dali": rf.serialized(rf.identity_pipeline)},
        default_model_filename=filename,
    )
    message = rf.load_error(http, name)
    assert f"Model file name '{filename}' contains an invalid character: '{bad}'" in message, message
    assert "Allowed characters are: a-z, A-Z, 0-9, _, ., -" in message


# --- tensors: mapping and load-time validation ---------------------------------


def test_several_inputs_and_outputs_renamed_by_position(repository, http):
    config = rf.dali_config(
        "two_in_two_out",
        inputs=(Tensor("B", "FP32", (-1,)), Tensor("A", "FP32", (-1,))),  # any order: by name
        outputs=(Tensor("SUM", "FP32", (-1,)), Tensor("PRODUCT", "FP32", (-1,))),
    )
    name = rf.write_model(repository, config, {"model.dali": rf.serialized(rf.two_in_two_out_pipeline)})
    http.load_model(name)
    a, b = np.array([[1.0, 2.0]], np.float32), np.array([[3.0, 4.0]], np.float32)
    result = rf.infer_http(http, name, {"A": a, "B": b}, ["SUM", "PRODUCT"])
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    np.testing.assert_array_equal(result.as_numpy("PRODUCT"), a * b)


MISMATCHES = {
    # model name: (inputs, outputs, words the load error must contain)
    "wrong_input_type": (
        (Tensor("DALI_INPUT_0", "FP32", (-1,)),),
        (Tensor("OUT", "UINT8", (-1,)),),
        [
            "DALI_INPUT_0",
            "TYPE_FP32",
            "TYPE_UINT8",
            "data type",
            # src/config_tools/config_tools.cc ProcessDtypeConfig, as its QA compares it
            'Invalid argument: Mismatch of data_type config for "DALI_INPUT_0".\n'
            "Data type defined in config: TYPE_FP32\nData type defined in pipeline: TYPE_UINT8",
        ],
    ),
    "wrong_input_rank": (
        (Tensor("DALI_INPUT_0", "UINT8", (-1, -1)),),
        (Tensor("OUT", "UINT8", (-1,)),),
        [
            "DALI_INPUT_0",
            "rank",
            "ndim 1",
            'Invalid argument: Mismatch in number of dimensions for "DALI_INPUT_0"\n'
            "Number of dimensions defined in config: 2\nNumber of dimensions defined in pipeline: 1",
        ],
    ),
    "wrong_output_type": (
        (Tensor("DALI_INPUT_0", "UINT8", (-1,)),),
        (Tensor("OUT", "INT32", (-1,)),),
        ["OUT", "TYPE_INT32", "TYPE_UINT8"],
    ),
    "wrong_input_name": (
        (Tensor("IMAGE", "UINT8", (-1,)),),
        (Tensor("OUT", "UINT8", (-1,)),),
        [
            "IMAGE",
            "DALI_INPUT_0",
            "Configuration file contains config for IMAGE but such input is not present in the pipeline.",
        ],
    ),
    "extra_output": (
        (Tensor("DALI_INPUT_0", "UINT8", (-1,)),),
        (Tensor("OUT", "UINT8", (-1,)), Tensor("MORE", "UINT8", (-1,))),
        [
            "2 outputs",
            "the pipeline has 1",
            "The number of outputs specified in the DALI pipeline "
            "and the configuration file do not match.\nModel config outputs: 2\nPipeline outputs: 1",
        ],
    ),
}


@pytest.mark.parametrize("model", sorted(MISMATCHES))
def test_mismatched_config_fails_the_load_naming_tensor_and_values(model, repository, http):
    inputs, outputs, words = MISMATCHES[model]
    name = rf.write_model(
        repository, rf.dali_config(model, inputs, outputs), {"model.dali": rf.serialized(rf.identity_pipeline)}
    )
    message = rf.load_error(http, name)
    assert all(word in message for word in words), message


def test_partial_config_is_auto_completed(repository, http):
    # Only the backend: names, types, dims, max_batch_size and batching come from the pipeline.
    name = rf.write_model(
        repository,
        rf.dali_config("partial", max_batch_size=None),
        {"model.dali": rf.serialized(rf.two_in_two_out_pipeline, batch_size=6)},
    )
    http.load_model(name)
    config = http.get_model_config(name)
    assert {(t["name"], t["data_type"], tuple(t["dims"])) for t in config["input"]} == {
        ("A", "TYPE_FP32", (-1,)),
        ("B", "TYPE_FP32", (-1,)),
    }
    assert [(t["data_type"], tuple(t["dims"])) for t in config["output"]] == [("TYPE_FP32", (-1,))] * 2
    assert config["max_batch_size"] == 6
    assert "dynamic_batching" in config
    first_output = config["output"][0]["name"]
    a = np.array([[2.0]], np.float32)
    assert rf.infer_http(http, name, {"A": a, "B": a}, [first_output]).as_numpy(first_output)[0, 0] == 4.0


# --- batching ----------------------------------------------------------------------


def test_config_max_batch_size_overrides_the_serialized_batch_size(repository, http):
    name = rf.write_model(
        repository,
        rf.identity_config("bigger_batch", max_batch_size=16),
        {"model.dali": rf.serialized(rf.identity_pipeline, batch_size=2)},
    )
    http.load_model(name)
    data = np.arange(16 * 4, dtype=np.uint8).reshape(16, 4)
    result = rf.infer_http(http, name, {"DALI_INPUT_0": data}, ["DALI_OUTPUT_0"])
    np.testing.assert_array_equal(result.as_numpy("DALI_OUTPUT_0"), data)


def test_unbatched_model(repository, http):
    """src/config_tools/config_tools.cc add_batch_dim: an unbatched model's dims
    start with the samples' axis, one rank above the pipeline's; a request's rows
    are its samples, up to the pipeline's batch size."""
    config = rf.dali_config(
        "unbatched",
        inputs=(Tensor("DALI_INPUT_0", "UINT8", (-1, -1)),),
        outputs=(Tensor("OUT", "UINT8", (-1, -1)),),
        max_batch_size=0,
    )
    name = rf.write_model(repository, config, {"model.dali": rf.serialized(rf.identity_pipeline, batch_size=4)})
    http.load_model(name)
    data = np.arange(15, dtype=np.uint8).reshape(3, 5)
    np.testing.assert_array_equal(rf.infer_http(http, name, {"DALI_INPUT_0": data}, ["OUT"]).as_numpy("OUT"), data)
    with pytest.raises(InferenceServerException) as refused:
        rf.infer_http(http, name, {"DALI_INPUT_0": np.zeros((5, 2), np.uint8)}, ["OUT"])
    assert "5 samples, above the pipeline's batch size 4" in str(refused.value)
    rank_1 = rf.dali_config(
        "unbatched_rank_1",
        inputs=(Tensor("DALI_INPUT_0", "UINT8", (-1,)),),
        outputs=(Tensor("OUT", "UINT8", (-1, -1)),),
        max_batch_size=0,
    )
    name = rf.write_model(repository, rank_1, {"model.dali": rf.serialized(rf.identity_pipeline)})
    assert "rank mismatch" in rf.load_error(http, name)


def test_ragged_requests_merge_and_split_back(repository, http):
    config = rf.identity_config("ragged", dynamic_batching=DynamicBatching(max_queue_delay_us=200_000))
    name = rf.write_model(repository, config, {"model.dali": rf.serialized(rf.identity_pipeline)})
    http.load_model(name)
    rows = ragged_rows(3, 10, 1, 7)
    results = rf.infer_concurrently(http, name, [{"DALI_INPUT_0": row} for row in rows], ["DALI_OUTPUT_0"])
    for row, result in zip(rows, results):
        np.testing.assert_array_equal(result.as_numpy("DALI_OUTPUT_0"), row)
    # Triton records a batch's statistics after it answers: read until all four are in.
    stats = wait_for(
        lambda: (found := http.get_inference_statistics(name)["model_stats"][0])["inference_count"] >= 4 and found,
        timeout_s=10,
        what="the statistics of 4 requests",
    )
    assert stats["inference_count"] == 4
    assert stats["execution_count"] < 4, stats  # at least two requests shared one DALI batch


def test_split_along_outer_axis_turns_each_samples_rows_into_samples(repository, http):
    """dali_backend's config.md and src/dali_executor/utils/utils.h (split_outer_dim): samples of
    (2, 2) and (3, 2) leave as five samples of (2,); the config's dims lose the outer
    axis; an output not listed is left whole."""
    config = rf.dali_config(
        "split_pairs",
        inputs=(Tensor("DALI_INPUT_0", "UINT8", (-1,), allow_ragged_batch=True),),
        outputs=(Tensor("PAIRS", "UINT8", (2,)), Tensor("ROWS", "UINT8", (-1,))),
        parameters={"split_along_outer_axis": "PAIRS"},
        dynamic_batching=DynamicBatching(max_queue_delay_us=200_000),
    )
    name = rf.write_model(repository, config, {"model.dali": rf.serialized(rf.pairs_pipeline)})
    http.load_model(name)
    metadata = http.get_model_metadata(name)
    assert [output["shape"] for output in metadata["outputs"]] == [[-1, 2], [-1, -1]], metadata
    rows = np.arange(10, dtype=np.uint8).reshape(2, 5)[:, :4], np.arange(6, dtype=np.uint8).reshape(1, 6)
    for row in rows:
        result = rf.infer_http(http, name, {"DALI_INPUT_0": np.ascontiguousarray(row)}, ["PAIRS", "ROWS"])
        np.testing.assert_array_equal(result.as_numpy("PAIRS"), row.reshape(-1, 2))
        np.testing.assert_array_equal(result.as_numpy("ROWS"), row)
    # Merged by the batcher: each request gets its own samples' rows back.
    merged = rf.infer_concurrently(
        http, name, [{"DALI_INPUT_0": np.full((1, 2 * n), n, np.uint8)} for n in (1, 3, 2)], ["PAIRS"]
    )
    assert [result.as_numpy("PAIRS").shape for result in merged] == [(1, 2), (3, 2), (2, 2)]


def test_split_output_keeps_the_pipelines_rank_without_the_parameter(repository, http):
    config = rf.dali_config(
        "unsplit_pairs",
        inputs=(Tensor("DALI_INPUT_0", "UINT8", (-1,), allow_ragged_batch=True),),
        outputs=(Tensor("PAIRS", "UINT8", (2,)), Tensor("ROWS", "UINT8", (-1,))),
    )
    name = rf.write_model(repository, config, {"model.dali": rf.serialized(rf.pairs_pipeline)})
    assert "rank mismatch" in rf.load_error(http, name)


def test_num_threads_parameter_sets_dali_worker_threads(repository, http, triton):
    threads = {}
    for count in (1, 6):
        config = rf.identity_config(f"threads_{count}", parameters={"num_threads": str(count)})
        rf.write_model(repository, config, {"model.dali": rf.serialized(rf.identity_pipeline, num_threads=3)})
        http.load_model(config.name)
        threads[count] = stub_of(triton, config.name).num_threads()
    assert threads[6] - threads[1] >= 5, threads


def test_host_pool_reserve_parameter_holds_dalis_pool_from_load(repository, http, triton):
    """host_pool_reserve_bytes (ours; the C++ backend ignores the parameter): the stub
    holds the block from load, and a 16 MiB batch that fits in it takes no new memory,
    where the same batch makes a model without it reserve a block (docs/memory.md)."""
    reserve = 256 << 20
    anonymous = {}
    for name, parameters in (("pool_as_needed", {}), ("pool_reserved", {"host_pool_reserve_bytes": str(reserve)})):
        config = rf.identity_config(name, parameters=parameters)
        http.load_model(rf.write_model(repository, config, {"model.dali": rf.serialized(rf.identity_pipeline)}))
        rf.infer_http(http, name, {"DALI_INPUT_0": np.zeros((1, 64), np.uint8)}, ["DALI_OUTPUT_0"])  # warm
        anonymous[name] = [anonymous_mib(stub_of(triton, name))]
    try:
        assert anonymous["pool_reserved"][0] - anonymous["pool_as_needed"][0] >= 0.9 * (reserve >> 20), anonymous
        batch = np.ones((1, 16 << 20), np.uint8)
        for name in anonymous:
            result = rf.infer_http(http, name, {"DALI_INPUT_0": batch}, ["DALI_OUTPUT_0"])
            assert result.as_numpy("DALI_OUTPUT_0").shape == batch.shape
            anonymous[name].append(anonymous_mib(stub_of(triton, name)))
        grown = {name: after - before for name, (before, after) in anonymous.items()}
        assert grown["pool_reserved"] < 8 and grown["pool_as_needed"] >= 16, anonymous
    finally:
        for name in anonymous:
            rf.unload(http, name)


def anonymous_mib(stub: psutil.Process) -> float:
    return rss_parts_mib(stub.pid)["RssAnon"]


def stub_of(triton, model: str) -> psutil.Process:
    for child in psutil.Process(triton.process.pid).children(recursive=True):
        try:
            if any(model in part for part in child.cmdline()):
                return child
        except (psutil.ZombieProcess, psutil.NoSuchProcess):  # an unloaded model's stub, exiting
            continue
    raise AssertionError(f"no stub process for {model}")


# --- failing well ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def decoder(repository, http):
    config = rf.dali_config(
        "decoder",
        inputs=(Tensor("ENCODED", "UINT8", (-1,), allow_ragged_batch=True),),
        outputs=(Tensor("IMAGE", "UINT8", (8, 8, 3)),),
        dynamic_batching=DynamicBatching(max_queue_delay_us=200_000),
    )
    http.load_model(rf.write_model(repository, config, {"model.dali": rf.serialized(rf.decode_pipeline)}))
    return config.name


def encoded(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.uint8)[None]


def test_pipeline_error_is_http_400_naming_the_operator_then_recovers(decoder, http):
    with pytest.raises(InferenceServerException) as failure:
        rf.infer_http(http, decoder, {"ENCODED": encoded(b"\xff\xd8\xff\xe0 not a jpeg" * 4)}, ["IMAGE"])
    assert failure.value.status() == "400", failure.value
    assert "decoders.image" in failure.value.message(), failure.value
    good = rf.infer_http(http, decoder, {"ENCODED": encoded(photo_bytes("coffee.png"))}, ["IMAGE"])
    assert good.as_numpy("IMAGE").shape == (1, 8, 8, 3)


def test_pipeline_error_is_grpc_unknown(decoder, triton):
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        data = encoded(b"GIF89a broken")
        tensor = grpcclient.InferInput("ENCODED", list(data.shape), "UINT8")
        tensor.set_data_from_numpy(data)
        with pytest.raises(InferenceServerException) as failure:
            client.infer(decoder, [tensor])
    assert failure.value.status() == str(grpc.StatusCode.UNKNOWN), failure.value
    assert "decoders.image" in failure.value.message()


def test_only_the_bad_request_of_a_merged_batch_fails(decoder, http):
    inputs = [photo_bytes("coffee.png"), b"garbage" * 10, photo_bytes("rocket.jpg"), b"", photo_bytes("chelsea.png")]
    results = rf.infer_concurrently(http, decoder, [{"ENCODED": encoded(data or b"\0")} for data in inputs], ["IMAGE"])
    outcomes = [r if isinstance(r, Exception) else r.as_numpy("IMAGE").shape for r in results]
    assert outcomes[0] == outcomes[2] == outcomes[4] == (1, 8, 8, 3), outcomes
    assert all(isinstance(outcomes[i], InferenceServerException) for i in (1, 3)), outcomes
    stats = http.get_inference_statistics(decoder)["model_stats"][0]
    assert stats["execution_count"] < stats["inference_count"], stats  # requests were merged


def test_image_above_max_pixels_is_refused_from_its_header(repository, http):
    config = rf.dali_config(
        "small_images",
        inputs=(Tensor("ENCODED", "UINT8", (-1,)),),
        outputs=(Tensor("IMAGE", "UINT8", (8, 8, 3)),),
        parameters={"max_pixels": "100000"},
    )  # coffee.png is 400x600
    http.load_model(rf.write_model(repository, config, {"model.dali": rf.serialized(rf.decode_pipeline)}))
    with pytest.raises(InferenceServerException) as failure:
        rf.infer_http(http, config.name, {"ENCODED": encoded(photo_bytes("coffee.png"))}, ["IMAGE"])
    assert failure.value.status() == "400"
    assert "600x400" in failure.value.message() and "max_pixels 100000" in failure.value.message()


# --- devices and versions ----------------------------------------------------------


def test_gpu_operator_on_cpu_instance_fails_the_load(repository, http):
    config = rf.dali_config(
        "gpu_decoder", inputs=(Tensor("ENCODED", "UINT8", (-1,)),), outputs=(Tensor("IMAGE", "UINT8", (-1, -1, 3)),)
    )
    name = rf.write_model(repository, config, {"model.dali": rf.serialized(rf.gpu_decode_pipeline)})
    message = rf.load_error(http, name)
    assert "decoders__Image, device='mixed'" in message and "KIND_CPU" in message, message


def test_serializing_dali_version_differing_is_logged(repository, http, triton):
    name = rf.write_model(
        repository,
        rf.identity_config("old_pipeline"),
        {"model.dali": rf.serialized(rf.identity_pipeline), "model.dali.version": "1.0.0\n"},
    )
    http.load_model(name)
    # The stub's log lines reach Triton's log through its IPC queue: maybe after the load returned.
    wait_for(
        lambda: (
            "pipeline serialized with DALI 1.0.0, served with DALI 2.4" in triton.log_path.read_text(errors="replace")
        ),
        timeout_s=30,
        what="the version-skew warning",
    )


def test_per_model_max_input_bytes_overrides_the_launchers(repository, http, identity):
    """The launcher's limit is 64 MiB here; this model's own parameter is 100 bytes."""
    name = rf.write_model(
        repository,
        rf.identity_config("small_inputs", parameters={"max_input_bytes": "100"}),
        {"model.dali": rf.serialized(rf.identity_pipeline)},
    )
    http.load_model(name)
    fits = np.full((2, 50), 3, np.uint8)  # 100 bytes, all rows counted
    np.testing.assert_array_equal(
        rf.infer_http(http, name, {"DALI_INPUT_0": fits}, ["DALI_OUTPUT_0"]).as_numpy("DALI_OUTPUT_0"), fits
    )
    with pytest.raises(InferenceServerException) as refused:
        rf.infer_http(http, name, {"DALI_INPUT_0": np.zeros((1, 101), np.uint8)}, ["DALI_OUTPUT_0"])
    assert refused.value.status() == "400", refused.value
    assert "is 101 bytes, above this model's max_input_bytes 100" in refused.value.message(), refused.value
    # Another model on the same server keeps the launcher's limit.
    larger = np.full((1, 101), 5, np.uint8)
    np.testing.assert_array_equal(
        rf.infer_http(http, identity, {"DALI_INPUT_0": larger}, ["DALI_OUTPUT_0"]).as_numpy("DALI_OUTPUT_0"), larger
    )


def test_backend_config_reaches_the_dali_stubs(tmp_path):
    """--backend-config=dali,plugin_libs=...: a plugin that cannot be loaded is logged
    with the C++ backend's words and the model still serves (src/dali_backend.cc
    TRITONBACKEND_Initialize); release_after_unload=true lets the model unload
    (dali_backend's config.md). The launcher hands both to the stubs (tritonstack.backends.settings)."""
    from tritonstack.serve.launcher import TritonServer
    from tritonstack.serve.server_config import ServerConfig

    name = rf.write_model(tmp_path, rf.identity_config("identity"), {"model.dali": rf.serialized(rf.identity_pipeline)})
    flags = (
        "--backend-config=dali,plugin_libs=/nonexistent/libnot_a_plugin.so",
        "--backend-config",
        "dali,release_after_unload=true",
    )
    with (
        TritonServer(ServerConfig(tmp_path, extra_args=(*rf.EXPLICIT, *flags), restricted_apis=())) as server,
        httpclient.InferenceServerClient(server.http_url) as client,
    ):
        client.load_model(name)
        data = np.arange(8, dtype=np.uint8).reshape(2, 4)
        np.testing.assert_array_equal(
            rf.infer_http(client, name, {"DALI_INPUT_0": data}, ["DALI_OUTPUT_0"]).as_numpy("DALI_OUTPUT_0"), data
        )
        rf.unload(client, name)
        log = server.log_path.read_text(errors="replace")
    assert "Failed to load plugin libs: /nonexistent/libnot_a_plugin.so" in log, log[-2000:]


@pipeline_def(output_dtype=types.UINT8, output_ndim=1)
def untyped_identity_pipeline():
    return fn.external_source(name="DALI_INPUT_0", ndim=1)


@pipeline_def(output_dtype=types.UINT8, output_ndim=3)
def untyped_decoder_pipeline():
    return fn.decoders.image(fn.external_source(name="DALI_INPUT_0", ndim=1), device="cpu")


def test_string_inputs_are_taken_as_the_raw_buffer(repository, http):
    """src/utils/triton.h to_dali: BYTES reaches DALI as UINT8, Triton's buffer as it is
    (each element's 4-byte length, then its bytes). A decoder cannot read that
    (dali_backend issue #176): such a request is refused saying what to send."""

    def config(name):
        return rf.dali_config(
            name, inputs=(Tensor("DALI_INPUT_0", "STRING", (1,)),), outputs=(Tensor("DALI_OUTPUT_0", "UINT8", (-1,)),)
        )

    identity = rf.write_model(
        repository, config("string_identity"), {"model.dali": rf.serialized(untyped_identity_pipeline)}
    )
    http.load_model(identity)
    strings = np.array([[b"abc"], [b"xyz"]], dtype=np.object_)
    answer = rf.infer_http(http, identity, {"DALI_INPUT_0": strings}, ["DALI_OUTPUT_0"]).as_numpy("DALI_OUTPUT_0")
    np.testing.assert_array_equal(answer, [list(b"\x03\x00\x00\x00abc"), list(b"\x03\x00\x00\x00xyz")])

    decoder_config = replace(config("string_decoder"), outputs=(Tensor("DALI_OUTPUT_0", "UINT8", (-1, -1, 3)),))
    decoder = rf.write_model(repository, decoder_config, {"model.dali": rf.serialized(untyped_decoder_pipeline)})
    http.load_model(decoder)
    with pytest.raises(InferenceServerException) as refused:
        rf.infer_http(http, decoder, {"DALI_INPUT_0": np.array([[sample_jpeg()]], dtype=np.object_)}, ["DALI_OUTPUT_0"])
    assert "TYPE_STRING" in str(refused.value) and "TYPE_UINT8" in str(refused.value), refused.value

    typed = rf.write_model(
        repository, config("string_for_uint8_source"), {"model.dali": rf.serialized(rf.identity_pipeline)}
    )
    assert "data type mismatch" in rf.load_error(http, typed)  # the C++ backend's ValidateDtypeConfig too
