"""Small model repositories built on the fly for the conformance suites: DALI
pipelines and ONNX graphs of a few operators, configs from the typed
`tritonstack.build.model_config` objects, and a server per module in explicit
model-control mode so models load (or fail to load) one by one."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import tritonclient.http as httpclient
from nvidia.dali import fn, pipeline_def, types
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.conftest import MODEL_REPOSITORY
from tests.processes import wait_for
from tritonstack.build.model_config import InstanceGroup, ModelConfig, Tensor
from tritonstack.build.model_files import write_model_folder
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import ServerConfig

VERSION = "1"
CPU = (InstanceGroup(count=1, kind="KIND_CPU"),)
EXPLICIT = ("--model-control-mode=explicit",)


def explicit_server(repository: Path, **options) -> TritonServer:
    """A server (not yet started) of `repository` in explicit model-control mode with
    every API open: a suite loads its models one by one and reads their statistics.
    `options`: ServerConfig's fields."""
    return TritonServer(ServerConfig(repository, extra_args=EXPLICIT, restricted_apis=(), **options))


def seed_lite0_export(out: Path) -> None:
    """Copy the built Lite0 export (and its fingerprint) into `out`, so that
    building a Lite0 preset there skips the export (and torch)."""
    folder = out / "efficientnet_lite0" / VERSION
    folder.mkdir(parents=True, exist_ok=True)
    for file in ("model.onnx", ".model.onnx.fingerprint"):
        shutil.copy2(MODEL_REPOSITORY / folder.relative_to(out) / file, folder / file)


# --- DALI pipelines, serialized ------------------------------------------------


@pipeline_def(output_dtype=types.UINT8, output_ndim=1)
def identity_pipeline():
    return fn.external_source(name="DALI_INPUT_0", dtype=types.UINT8, ndim=1)


@pipeline_def(output_dtype=[types.FLOAT, types.FLOAT], output_ndim=[1, 1])
def two_in_two_out_pipeline():
    """OUT 0 = A + B, OUT 1 = A * B: outputs are told apart by their values."""
    a = fn.external_source(name="A", dtype=types.FLOAT, ndim=1)
    b = fn.external_source(name="B", dtype=types.FLOAT, ndim=1)
    return a + b, a * b


@pipeline_def(output_dtype=[types.UINT8, types.UINT8], output_ndim=[2, 1])
def pairs_pipeline():
    """A row of 2k values as (k, 2) pairs, and the row itself."""
    row = fn.external_source(name="DALI_INPUT_0", dtype=types.UINT8, ndim=1)
    return fn.reshape(row, shape=[-1, 2]), row


@pipeline_def
def decode_pipeline():
    encoded = fn.external_source(name="ENCODED", dtype=types.UINT8, ndim=1)
    return fn.resize(fn.decoders.image(encoded, device="cpu"), size=(8, 8))


@pipeline_def
def gpu_decode_pipeline():
    encoded = fn.external_source(name="ENCODED", dtype=types.UINT8, ndim=1)
    return fn.decoders.image(encoded, device="mixed")


def serialized(pipeline, batch_size: int = 4, num_threads: int = 1) -> bytes:
    return pipeline(batch_size=batch_size, num_threads=num_threads, device_id=None).serialize()


# An @autoserialize dali.py as a user ships it: serialized by the serving DALI.
AUTOSERIALIZE_SCRIPT = """
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.plugin.triton import autoserialize


@autoserialize
@pipeline_def(batch_size=4, num_threads=1, device_id=None, output_dtype=types.UINT8, output_ndim=1)
def doubled():
    doubled = fn.external_source(name="DALI_INPUT_0", dtype=types.UINT8, ndim=1) * 2
    return fn.cast(doubled, dtype=types.UINT8)
"""


# --- ONNX graphs -------------------------------------------------------------


def checked_model(graph, opset: int = 17) -> bytes:
    """An ONNX model of `graph` (IR version 8, which our ONNX Runtime reads), checked."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def add_graph(dtype=TensorProto.FLOAT, width: int | str = 4, batch: str | int = "batch") -> bytes:
    """Y = X + X, shapes [batch, width]."""
    shape = [batch, width]
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "X"], ["Y"])],
        "add",
        [helper.make_tensor_value_info("X", dtype, shape)],
        [helper.make_tensor_value_info("Y", dtype, shape)],
    )
    return checked_model(graph)


def tile_sum_graph(width: int) -> bytes:
    """Y = the sum of X repeated `width` times, shapes [batch, 1]: an intermediate
    tensor of batch x width floats, for memory tests."""
    repeats = helper.make_tensor("repeats", TensorProto.INT64, [2], [1, width])
    graph = helper.make_graph(
        [
            helper.make_node("Tile", ["X", "repeats"], ["T"]),
            helper.make_node("ReduceSum", ["T"], ["Y"], keepdims=1, axes=[1]),
        ],
        "tile_sum",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 1])],
        initializer=[repeats],
    )
    return checked_model(graph, opset=11)


def identity_graph(dtype, width: int = 4) -> bytes:
    """Y = X for any ONNX element type, shapes [batch, width]."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])],
        "identity",
        [helper.make_tensor_value_info("X", dtype, ["batch", width])],
        [helper.make_tensor_value_info("Y", dtype, ["batch", width])],
    )
    return checked_model(graph)


def lookup_graph(table: tuple[float, ...]) -> bytes:
    """Y = TABLE[X]: X is INT64 [batch, 1], Y FP32 [batch, 1]. An index outside
    the table is data ONNX Runtime refuses at run time (Gather's bounds check)."""
    table_tensor = helper.make_tensor("TABLE", TensorProto.FLOAT, [len(table)], list(table))
    graph = helper.make_graph(
        [helper.make_node("Gather", ["TABLE", "X"], ["Y"], axis=0)],
        "lookup",
        [helper.make_tensor_value_info("X", TensorProto.INT64, ["batch", 1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 1])],
        initializer=[table_tensor],
    )
    return checked_model(graph)


# --- repository writing ------------------------------------------------------


def write_model(
    repository: Path, config: ModelConfig, files: dict[str, bytes | str], default_model_filename: str | None = None
) -> str:
    """config.pbtxt plus `files` (names relative to the version folder)."""
    if default_model_filename:
        config = replace(config, default_model_filename=default_model_filename)
    write_model_folder(repository, config, files, VERSION)
    return config.name


def dali_config(name: str, inputs=(), outputs=(), max_batch_size: int = 8, **fields) -> ModelConfig:
    return ModelConfig(
        name=name,
        backend="dali",
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        max_batch_size=max_batch_size,
        instance_groups=CPU,
        **fields,
    )


def identity_config(name: str, max_batch_size: int = 8, **fields) -> ModelConfig:
    return dali_config(
        name,
        inputs=(Tensor("DALI_INPUT_0", "UINT8", (-1,), allow_ragged_batch=True),),
        outputs=(Tensor("DALI_OUTPUT_0", "UINT8", (-1,)),),
        max_batch_size=max_batch_size,
        **fields,
    )


def load_error(client: httpclient.InferenceServerClient, name: str) -> str:
    """Load a model expected to fail; return the server's message."""
    try:
        client.load_model(name)
    except InferenceServerException as error:
        return str(error)
    raise AssertionError(f"model {name} loaded, expected a load failure")


def unload(client: httpclient.InferenceServerClient, name: str, timeout_s: float = 60) -> None:
    """Unload a model and return once Triton has finished. Its unload API answers before
    the instances are finalized; a suite that loaded the next model meanwhile saw
    tritonserver 2.51 die of SIGSEGV during that load (once, on a loaded CI machine)."""
    client.unload_model(name)
    wait_for(
        lambda: all(
            entry.get("state") == "UNAVAILABLE"
            for entry in client.get_model_repository_index()
            if entry["name"] == name
        ),
        timeout_s,
        interval_s=0.05,
        what=f"model {name} unloaded",
    )


def infer_http(client, model: str, arrays: dict[str, np.ndarray], outputs: list[str], version: str = "", **options):
    """One request; `options` are tritonclient's infer() keywords (e.g. priority)."""
    return client.infer(model, model_version=version, **_http_request(arrays, outputs), **options)


def infer_concurrently(client, model: str, requests: list[dict[str, np.ndarray]], outputs: list[str]):
    """Send all requests at once (the HTTP client's own async pool: it is not
    thread-safe) so the dynamic batcher can merge them; results or exceptions."""
    pending = [client.async_infer(model, **_http_request(arrays, outputs)) for arrays in requests]
    outcomes = []
    for request in pending:
        try:
            outcomes.append(request.get_result())
        except InferenceServerException as error:
            outcomes.append(error)
    return outcomes


def _http_request(arrays: dict[str, np.ndarray], outputs: list[str]):
    tensors = []
    for name, array in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), _triton_type(array))
        tensor.set_data_from_numpy(array, binary_data=True)
        tensors.append(tensor)
    requested = [httpclient.InferRequestedOutput(name, binary_data=True) for name in outputs]
    return {"inputs": tensors, "outputs": requested}


def _triton_type(array: np.ndarray) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return np_to_triton_dtype(array.dtype)
