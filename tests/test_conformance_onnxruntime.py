"""Our `onnxruntime` backend against the C++ onnxruntime_backend's contract, on a
real tritonserver in explicit model-control mode, with tiny ONNX graphs."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from tests import repo_factory as rf
from tritonstack.build.model_config import DynamicBatching, ModelConfig, Tensor
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.process_tree import processes_by_role
from tritonstack.serve.server_config import ServerConfig


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return tmp_path_factory.mktemp("onnxruntime_conformance")


@pytest.fixture(scope="module")
def triton(repository):
    with rf.explicit_server(repository) as running:
        yield running


@pytest.fixture(scope="module")
def http(triton):
    with httpclient.InferenceServerClient(triton.http_url, concurrency=4) as client:
        yield client


def ort_config(name, inputs=(), outputs=(), max_batch_size=8, **fields) -> ModelConfig:
    return ModelConfig(
        name=name,
        backend="onnxruntime",
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        max_batch_size=max_batch_size,
        instance_groups=rf.CPU,
        **fields,
    )


@pytest.mark.parametrize(
    "onnx_type, triton_type, numpy_type",
    [
        (TensorProto.FLOAT, "TYPE_FP32", np.float32),
        (TensorProto.FLOAT16, "TYPE_FP16", np.float16),
        (TensorProto.INT64, "TYPE_INT64", np.int64),
    ],
)
def test_partial_config_is_auto_completed_from_the_graph(onnx_type, triton_type, numpy_type, repository, http):
    name = rf.write_model(
        repository, ort_config(f"auto_{triton_type.lower()}", max_batch_size=0), {"model.onnx": rf.add_graph(onnx_type)}
    )
    http.load_model(name)
    config = http.get_model_config(name)
    inputs = [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"]]
    assert inputs == [("X", triton_type, [4])]
    assert [t["name"] for t in config["output"]] == ["Y"]
    assert config["max_batch_size"] == 4  # dynamic first axis: batching, the C++ default size
    assert "dynamic_batching" in config
    data = np.arange(8).reshape(2, 4).astype(numpy_type)
    np.testing.assert_array_equal(rf.infer_http(http, name, {"X": data}, ["Y"]).as_numpy("Y"), data + data)


# Every element type the backend maps (tritonstack.contract), through an Identity
# graph: auto-completed name, type and dims, then a round trip where numpy has the type.
ALL_TYPES = [
    (TensorProto.FLOAT, "TYPE_FP32", np.float32),
    (TensorProto.FLOAT16, "TYPE_FP16", np.float16),
    (TensorProto.DOUBLE, "TYPE_FP64", np.float64),
    (TensorProto.BFLOAT16, "TYPE_BF16", None),
    (TensorProto.INT8, "TYPE_INT8", np.int8),
    (TensorProto.INT16, "TYPE_INT16", np.int16),
    (TensorProto.INT32, "TYPE_INT32", np.int32),
    (TensorProto.INT64, "TYPE_INT64", np.int64),
    (TensorProto.UINT8, "TYPE_UINT8", np.uint8),
    (TensorProto.UINT16, "TYPE_UINT16", np.uint16),
    (TensorProto.UINT32, "TYPE_UINT32", np.uint32),
    (TensorProto.UINT64, "TYPE_UINT64", np.uint64),
    (TensorProto.BOOL, "TYPE_BOOL", np.bool_),
    (TensorProto.STRING, "TYPE_STRING", np.object_),
]


def type_model_name(triton_type: str) -> str:
    return f"all_{triton_type.lower()}"


@pytest.fixture(scope="module")
def every_type_served(tmp_path_factory):
    """A server of one Identity model per element type, loaded together at its start
    (Triton loads them side by side; one by one, each load and unload took 2.5 s)."""
    repository = tmp_path_factory.mktemp("onnxruntime_types")
    for onnx_type, triton_type, _ in ALL_TYPES:
        config = ort_config(type_model_name(triton_type), max_batch_size=0)
        rf.write_model(repository, config, {"model.onnx": rf.identity_graph(onnx_type)})
    with (
        TritonServer(ServerConfig(repository, restricted_apis=())) as server,
        httpclient.InferenceServerClient(server.http_url) as client,
    ):
        yield client


@pytest.mark.parametrize("onnx_type, triton_type, numpy_type", ALL_TYPES, ids=[t[1] for t in ALL_TYPES])
def test_every_element_type_is_auto_completed(onnx_type, triton_type, numpy_type, every_type_served):
    http, name = every_type_served, type_model_name(triton_type)
    config = http.get_model_config(name)
    tensors = [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in (*config["input"], *config["output"])]
    assert tensors == [("X", triton_type, [4]), ("Y", triton_type, [4])]
    assert config["max_batch_size"] == 4
    if numpy_type is not None:
        data = (
            np.array([[b"a", b"bc", b"", b"d"]], np.object_)
            if numpy_type is np.object_
            else (np.arange(4).reshape(1, 4) % 2).astype(numpy_type)
        )
        np.testing.assert_array_equal(rf.infer_http(http, name, {"X": data}, ["Y"]).as_numpy("Y"), data)


def test_thread_parameters_and_merged_batches(repository, http):
    config = ort_config(
        "threaded",
        inputs=(Tensor("X", "FP32", (4,)),),
        outputs=(Tensor("Y", "FP32", (4,)),),
        parameters={"intra_op_thread_count": "1", "inter_op_thread_count": "1"},
        dynamic_batching=DynamicBatching(max_queue_delay_us=200_000),
    )
    http.load_model(rf.write_model(repository, config, {"model.onnx": rf.add_graph()}))
    rows = [np.full((1, 4), value, np.float32) for value in range(4)]
    results = rf.infer_concurrently(http, config.name, [{"X": row} for row in rows], ["Y"])
    for row, result in zip(rows, results):
        np.testing.assert_array_equal(result.as_numpy("Y"), row * 2)
    stats = http.get_inference_statistics(config.name)["model_stats"][0]
    assert stats["execution_count"] < stats["inference_count"] == 4, stats


def test_memory_parameters_of_the_cpp_backend(repository, http):
    """enable_mem_arena / enable_mem_pattern as the C++ backend reads them: the
    model loads and serves with both off; an unreadable value fails the load
    naming the parameter."""
    io = {"inputs": (Tensor("X", "FP32", (4,)),), "outputs": (Tensor("Y", "FP32", (4,)),)}
    config = ort_config("arena_off", parameters={"enable_mem_arena": "false", "enable_mem_pattern": "FALSE"}, **io)
    http.load_model(rf.write_model(repository, config, {"model.onnx": rf.add_graph()}))
    result = rf.infer_http(http, config.name, {"X": np.ones((3, 4), np.float32)}, ["Y"])
    np.testing.assert_array_equal(result.as_numpy("Y"), np.full((3, 4), 2, np.float32))

    unreadable = ort_config("arena_maybe", parameters={"enable_mem_arena": "maybe"}, **io)
    message = rf.load_error(http, rf.write_model(repository, unreadable, {"model.onnx": rf.add_graph()}))
    assert "enable_mem_arena" in message and "'maybe'" in message and "boolean" in message, message


def stub_rss_mib(server, model: str) -> float:
    return processes_by_role(server.pid)[f"stub:{model}"].memory_info().rss / 2**20


def test_arena_shrinkage_of_the_cpp_backend(repository, triton, http):
    """memory.enable_memory_arena_shrinkage "cpu:0" (a run option in the C++ backend
    too): a run's 64 MiB intermediate goes back to the system after the run; without
    it, ONNX Runtime's arena keeps it. "gpu:0" entries are dropped on the CPU."""
    io = {"inputs": (Tensor("X", "FP32", (1,)),), "outputs": (Tensor("Y", "FP32", (1,)),)}
    batch, width = 8, 2**21  # 8 x 2M floats: a 64 MiB tensor between the two nodes
    grown = {}
    for name, parameters in (
        ("arena_keeps", {}),
        ("arena_shrinks", {"memory.enable_memory_arena_shrinkage": "gpu:0;cpu:0"}),
    ):
        config = ort_config(name, parameters=parameters, **io)
        http.load_model(rf.write_model(repository, config, {"model.onnx": rf.tile_sum_graph(width)}))
        # A batch of one first: ONNX Runtime never frees the arena's first region.
        rf.infer_http(http, name, {"X": np.ones((1, 1), np.float32)}, ["Y"])
        before = stub_rss_mib(triton, name)
        result = rf.infer_http(http, name, {"X": np.ones((batch, 1), np.float32)}, ["Y"])
        np.testing.assert_array_equal(result.as_numpy("Y"), np.full((batch, 1), width, np.float32))
        grown[name] = stub_rss_mib(triton, name) - before
    assert grown["arena_keeps"] > 48, grown
    assert grown["arena_shrinks"] < 16, grown

    for value, expected in (("cpu", "not a ';'-separated list"), ("cpu:0", "which enable_mem_arena turns off")):
        parameters = {"memory.enable_memory_arena_shrinkage": value, "enable_mem_arena": "false"}
        config = ort_config(f"shrink_{len(value)}", parameters=parameters, **io)
        message = rf.load_error(http, rf.write_model(repository, config, {"model.onnx": rf.tile_sum_graph(4)}))
        assert "memory.enable_memory_arena_shrinkage" in message and expected in message, message


def test_unreadable_boolean_parameter_is_a_load_problem():
    from tritonstack.rules.onnxruntime import bool_parameter, onnx_problems

    assert [bool_parameter({"k": {"string_value": v}}, "k") for v in ("true", "1", "False", "0")] == [
        True,
        True,
        False,
        False,
    ]
    assert bool_parameter({}, "k") is None
    problems = onnx_problems(
        {"name": "m", "parameters": {"enable_mem_pattern": {"string_value": "yes please"}}}, [], []
    )
    assert [(p.field, p.tensor) for p in problems] == [("parameters", "enable_mem_pattern")], problems
    for value, problem_count in (("cpu:0", 0), ("gpu:0;cpu:0", 0), ("cpu", 1), ("cpu:0;", 1), ("tpu:0", 1)):
        config = {"name": "m", "parameters": {"memory.enable_memory_arena_shrinkage": {"string_value": value}}}
        assert len(onnx_problems(config, [], [])) == problem_count, value


MISMATCHES = {
    "ort_wrong_type": ((Tensor("X", "INT32", (4,)),), ["'X'", "TYPE_INT32", "TYPE_FP32"]),
    "ort_wrong_shape": ((Tensor("X", "FP32", (5,)),), ["'X'", "shape", "[5]", "[-1, 4]"]),
    "ort_wrong_rank": ((Tensor("X", "FP32", (2, 2)),), ["'X'", "shape", "[2, 2]"]),
    "ort_wrong_name": ((Tensor("INPUT", "FP32", (4,)),), ["'INPUT'", "not in the ONNX graph", "X"]),
}


@pytest.mark.parametrize("model", sorted(MISMATCHES))
def test_mismatched_config_fails_the_load_naming_tensor_and_values(model, repository, http):
    inputs, words = MISMATCHES[model]
    config = ort_config(model, inputs=inputs, outputs=(Tensor("Y", "FP32", (4,)),))
    message = rf.load_error(http, rf.write_model(repository, config, {"model.onnx": rf.add_graph()}))
    assert all(word in message for word in words), message


def test_data_the_graph_refuses_is_http_400(repository, http):
    # The config allows any width; the graph wants 4: ONNX Runtime refuses 5.
    config = ort_config("loose_config", inputs=(Tensor("X", "FP32", (-1,)),), outputs=(Tensor("Y", "FP32", (-1,)),))
    http.load_model(rf.write_model(repository, config, {"model.onnx": rf.add_graph()}))
    with pytest.raises(InferenceServerException) as failure:
        rf.infer_http(http, config.name, {"X": np.zeros((1, 5), np.float32)}, ["Y"])
    assert failure.value.status() == "400", failure.value
    assert "X" in failure.value.message() and "Expected: 4" in failure.value.message(), failure.value
    good = rf.infer_http(http, config.name, {"X": np.ones((1, 4), np.float32)}, ["Y"])
    np.testing.assert_array_equal(good.as_numpy("Y"), np.full((1, 4), 2, np.float32))
