"""Repositories we did not write, in the shapes users of NVIDIA's C++ backends write
them by hand (config.pbtxt text, dali.py files, ONNX graphs): each must load and
answer as the C++ backend's code and QA say, and serving them changes no byte.

References (triton-inference-server on GitHub):
- dali_backend src/config_tools/config_tools.cc: AutofillConfig and friends (the merge),
  src/dali_model.h: ReadMBSFromPBtxt/Batched (a stated `max_batch_size: 0`),
  FindDevice/InstantiateDaliPipeline (KIND_CPU instances run on CPU_ONLY_DEVICE_ID);
- dali_backend qa/L0_autoconfig: client.py (the expected configs), model_repository/
  {full_autoconfig, partial_autoconfig, no_config_file.dali}; our pipelines are their
  CPU twins (the QA ones move data to the GPU);
- onnxruntime_backend src/onnxruntime.cc: AutoCompleteConfig, AutoCompleteMaxBatch,
  AutoCompleteIO;
- Triton's model configuration docs: version_policy.

One server in explicit model-control mode for the module; each test loads its model.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests import repo_factory as rf
from tests.conftest import TEST_STOP_GRACE_S

# qa/L0_autoconfig's pipelines with CPU operators only: two FP16 inputs, outputs
# declared FP16 and FP32, device_id=0 as written for the GPU container.
QA_PIPELINE = """
import nvidia.dali as dali
import nvidia.dali.fn as fn
from nvidia.dali.plugin.triton import autoserialize


@autoserialize
@dali.pipeline_def(batch_size={batch_size}, num_threads=1, device_id=0,
                   output_dtype=[dali.types.FLOAT16, dali.types.FLOAT], output_ndim=[1, 1])
def pipeline():
    inp1 = fn.external_source(device="cpu", name="DALI_INPUT_0", {input0_dtype}ndim=1)
    inp2 = fn.external_source(device="cpu", name="DALI_INPUT_1", dtype=dali.types.FLOAT16, ndim=1)
    as_float = dali.types.FLOAT  # CPU arithmetic has no FLOAT16
    return (fn.cast(fn.cast(inp1, dtype=as_float) / 2, dtype=dali.types.FLOAT16, name="DALI_OUTPUT_0"),
            fn.cast(fn.cast(inp2, dtype=as_float) * 3, dtype=as_float, name="DALI_OUTPUT_1"))
"""
# Written for the GPU container: device_id=0 and an operator on the GPU.
GPU_DECODER_PIPELINE = """
import nvidia.dali as dali
import nvidia.dali.fn as fn
from nvidia.dali.plugin.triton import autoserialize


@autoserialize
@dali.pipeline_def(batch_size=8, num_threads=1, device_id=0)
def pipeline():
    encoded = fn.external_source(name="DALI_INPUT_0", dtype=dali.types.UINT8, ndim=1)
    return fn.decoders.image(encoded, device="mixed")
"""
# qa/L0_video_split's shape: a sample of 2k values reshaped to (k, 2), split into k samples.
PAIRS_PIPELINE = """
import nvidia.dali as dali
import nvidia.dali.fn as fn
from nvidia.dali.plugin.triton import autoserialize


@autoserialize
@dali.pipeline_def(batch_size=4, num_threads=1, device_id=0, output_dtype=dali.types.UINT8, output_ndim=[2, 1])
def pipeline():
    row = fn.external_source(name="IN", dtype=dali.types.UINT8, ndim=1)
    return fn.reshape(row, shape=[-1, 2], name="PAIRS"), fn.copy(row, name="ROW")
"""
SCALE_PIPELINE = """
import nvidia.dali as dali
import nvidia.dali.fn as fn
from nvidia.dali.plugin.triton import autoserialize


@autoserialize
@dali.pipeline_def(batch_size=4, num_threads=1, device_id=0, output_dtype=dali.types.FLOAT, output_ndim=1)
def pipeline():
    return fn.external_source(name="X", dtype=dali.types.FLOAT, ndim=1) * {factor}
"""
PYTHON_IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        outputs = [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()) for r in requests]
        return [pb_utils.InferenceResponse([output]) for output in outputs]
"""
HEADER = 'backend: "{backend}"\n'


LAYOUT_PIPELINE = """
import nvidia.dali as dali
import nvidia.dali.fn as fn
from nvidia.dali.plugin.triton import autoserialize


@autoserialize
@dali.pipeline_def(batch_size=8, num_threads=1, device_id=0, output_dtype=[dali.types.UINT8], output_ndim=[3])
def pipeline():
    image = fn.external_source(device="cpu", name="DALI_INPUT_0", layout="HWC", dtype=dali.types.UINT8)
    return fn.flip(image, name="DALI_OUTPUT_0")
"""


def qa_pipeline(batch_size: int = 256, input0_dtype: bool = True) -> str:
    dtype = "dtype=dali.types.FLOAT16, " if input0_dtype else ""
    return QA_PIPELINE.format(batch_size=batch_size, input0_dtype=dtype)


def scalar_per_sample_graph() -> bytes:
    """Y = X + X on shape [batch]: one scalar per sample."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "X"], ["Y"])],
        "scalar",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def non_batching_graph() -> bytes:
    """Y = X + X on a fixed [2, 4]: the first axis is not a batch axis."""
    return rf.add_graph(width=4, batch=2)


# model folder -> {relative path: content}; config.pbtxt text as a user writes it.
MODELS: dict[str, dict[str, str | bytes]] = {
    # qa/L0_autoconfig/model_repository/full_autoconfig: only the backend.
    "full_autoconfig": {"config.pbtxt": 'name: "full_autoconfig"\nbackend: "dali"\n', "1/dali.py": qa_pipeline()},
    # qa/L0_autoconfig/model_repository/partial_autoconfig: the input's type stated
    # (the pipeline leaves it undeclared), outputs named only, a tuned batcher.
    "partial_autoconfig": {
        "config.pbtxt": """name: "partial_autoconfig"
backend: "dali"
max_batch_size: 32
input [ { name: "DALI_INPUT_0" data_type: TYPE_FP16 allow_ragged_batch: true } ]
output [ { name: "DALI_OUTPUT_0" } ]
output [ { name: "DALI_OUTPUT_1" } ]
dynamic_batching { preferred_batch_size: [ 32 ] max_queue_delay_microseconds: 500 }
""",
        "1/dali.py": qa_pipeline(input0_dtype=False),
    },
    # qa/L0_autoconfig/model_repository/no_config_file.dali: no config.pbtxt.
    "no_config_file.dali": {"1/dali.py": qa_pipeline()},
    # qa/L0_img_proc's img_proc.dali: no config, a source with a layout but no ndim.
    "layout_only.dali": {"1/dali.py": LAYOUT_PIPELINE},
    # Outputs renamed by position, dims stated only for one of them; an input stating dims only.
    "renamed_outputs": {
        "config.pbtxt": """backend: "dali"
max_batch_size: 8
input [ { name: "DALI_INPUT_1" dims: [ -1 ] } ]
output [ { name: "HALF" dims: [ -1 ] }, { name: "TRIPLE" data_type: TYPE_FP32 } ]
""",
        "1/dali.py": qa_pipeline(batch_size=8),
    },
    # A stated type the pipeline contradicts: config_tools.cc ProcessDtypeConfig refuses it.
    "wrong_type": {
        "config.pbtxt": 'backend: "dali"\noutput [ { name: "O" data_type: TYPE_INT32 } ]\n',
        "1/dali.py": qa_pipeline(),
    },
    # An input the pipeline does not have: ValidateAgainstTooManyInputs refuses it.
    "unknown_input": {
        "config.pbtxt": 'backend: "dali"\ninput [ { name: "IMAGE" } ]\n',
        "1/dali.py": qa_pipeline(),
    },
    # Undeclared input type, nothing stated: the C++ backend fills TYPE_INVALID and
    # Triton refuses; ours says what to add.
    "undeclared_type": {"config.pbtxt": 'backend: "dali"\n', "1/dali.py": qa_pipeline(input0_dtype=False)},
    # `max_batch_size: 0` stated: unbatched (dali_model.h Batched()).
    "unbatched": {
        "config.pbtxt": 'backend: "dali"\nmax_batch_size: 0\ninstance_group [ { kind: KIND_CPU } ]\n',
        "1/dali.py": qa_pipeline(),
    },
    # qa/L0_video_split's config: only the parameter; the split output's dims lose an axis.
    "split_autoconfig": {
        "config.pbtxt": 'backend: "dali"\nparameters [ { key: "split_along_outer_axis" '
        'value: { string_value: "PAIRS" } } ]\n',
        "1/dali.py": PAIRS_PIPELINE,
    },
    # GPU-written, CPU operators only, served on KIND_CPU instances.
    "gpu_written_cpu_pipeline": {
        "config.pbtxt": 'backend: "dali"\ninstance_group [ { kind: KIND_CPU count: 1 } ]\n',
        "1/dali.py": SCALE_PIPELINE.format(factor=5),
    },
    "gpu_operator_on_cpu": {
        "config.pbtxt": 'backend: "dali"\ninstance_group [ { kind: KIND_CPU } ]\n',
        "1/dali.py": GPU_DECODER_PIPELINE,
    },
    # Three versions, two served (version_policy specific); version N scales by N.
    "versioned": {
        "config.pbtxt": 'backend: "dali"\nversion_policy: { specific: { versions: [ 1, 2 ] } }\n',
        **{f"{n}/dali.py": SCALE_PIPELINE.format(factor=n) for n in (1, 2, 3)},
    },
    # onnxruntime: only the backend (AutoCompleteIO fills both lists, batching from the graph).
    "onnx_bare": {"config.pbtxt": 'backend: "onnxruntime"\n', "1/model.onnx": rf.add_graph()},
    # onnxruntime: a scalar per sample: dims [1] reshaped to [] (AutoCompleteIO).
    "onnx_scalar": {"config.pbtxt": 'backend: "onnxruntime"\n', "1/model.onnx": scalar_per_sample_graph()},
    # onnxruntime: inputs listed, outputs left out: the outputs come from the graph.
    "onnx_inputs_only": {
        "config.pbtxt": 'backend: "onnxruntime"\nmax_batch_size: 2\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n',
        "1/model.onnx": rf.add_graph(),
    },
    # onnxruntime: both lists, a type left out: the C++ backend completes nothing.
    "onnx_listed_untyped": {
        "config.pbtxt": 'backend: "onnxruntime"\nmax_batch_size: 2\ninput [ { name: "X" dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n',
        "1/model.onnx": rf.add_graph(),
    },
    # onnxruntime: a graph that cannot batch, with a max_batch_size (AutoCompleteMaxBatch refuses).
    "onnx_cannot_batch": {
        "config.pbtxt": 'backend: "onnxruntime"\nmax_batch_size: 8\n',
        "1/model.onnx": non_batching_graph(),
    },
    # Triton's own Python backend: its model.py is imported from the repository.
    "python_identity": {
        "config.pbtxt": 'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]\n',
        "1/model.py": PYTHON_IDENTITY,
    },
}


def fingerprint(repository: Path) -> dict[str, str]:
    """Every file and folder under the repository, with a hash of every byte."""
    return {
        str(path.relative_to(repository)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        for path in sorted(repository.rglob("*"))
    }


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("foreign")
    for model, files in MODELS.items():
        for relative, content in files.items():
            path = root / model / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


@pytest.fixture(scope="module")
def before(repository) -> dict[str, str]:
    return fingerprint(repository)


@pytest.fixture(scope="module")
def triton(repository, before):
    # A short grace: Triton's shutdown otherwise waits 30 s on the refused models.
    with rf.explicit_server(repository, stop_grace_s=TEST_STOP_GRACE_S) as running:
        yield running


@pytest.fixture(scope="module")
def http(triton):
    with httpclient.InferenceServerClient(triton.http_url, concurrency=4) as client:
        yield client


def loaded_config(http, name: str) -> dict:
    http.load_model(name)
    return http.get_model_config(name)


def tensors(config: dict, kind: str) -> list[tuple]:
    return [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config[kind]]


def infer(http, model: str, arrays: dict[str, np.ndarray], outputs: list[str], version: str = "") -> dict:
    result = rf.infer_http(http, model, arrays, outputs, version)
    return {name: result.as_numpy(name) for name in outputs}


# --- dali: qa/L0_autoconfig -------------------------------------------------------------


def assert_qa_config(config: dict, batch_size: int, output_names: list[str]) -> None:
    """qa/L0_autoconfig/client.py check_config, item for item."""
    assert config["max_batch_size"] == batch_size
    assert tensors(config, "input") == [("DALI_INPUT_0", "TYPE_FP16", [-1]), ("DALI_INPUT_1", "TYPE_FP16", [-1])]
    assert [t["allow_ragged_batch"] for t in config["input"]] == [True, True]
    assert tensors(config, "output") == [(output_names[0], "TYPE_FP16", [-1]), (output_names[1], "TYPE_FP32", [-1])]


def assert_qa_answers(http, model: str, config: dict) -> None:
    a = np.array([[2, 4, 6]], np.float16)
    b = np.array([[1, 2]], np.float16)
    names = [t["name"] for t in config["output"]]
    answers = infer(http, model, {"DALI_INPUT_0": a, "DALI_INPUT_1": b}, names)
    np.testing.assert_array_equal(answers[names[0]], a / 2)
    np.testing.assert_array_equal(answers[names[1]], (b * 3).astype(np.float32))


def test_full_autoconfig(http):
    config = loaded_config(http, "full_autoconfig")
    assert_qa_config(config, 256, ["DALI_OUTPUT_0", "DALI_OUTPUT_1"])  # the pipeline's output names
    assert "dynamic_batching" in config
    assert_qa_answers(http, "full_autoconfig", config)


def test_partial_autoconfig_keeps_what_the_config_states(http):
    config = loaded_config(http, "partial_autoconfig")
    assert_qa_config(config, 32, ["DALI_OUTPUT_0", "DALI_OUTPUT_1"])
    assert config["dynamic_batching"]["preferred_batch_size"] == [32]
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 500
    assert_qa_answers(http, "partial_autoconfig", config)


def test_model_folder_without_config(http):
    config = loaded_config(http, "no_config_file.dali")
    assert config["backend"] == "dali"
    assert_qa_config(config, 256, ["DALI_OUTPUT_0", "DALI_OUTPUT_1"])
    assert_qa_answers(http, "no_config_file.dali", config)


def test_ragged_requests_of_an_auto_completed_model_merge(http):
    """allow_ragged_batch came from auto-complete: requests of different lengths
    may share a batch, and each gets its own rows back."""
    http.load_model("full_autoconfig")
    lengths = (1, 3, 5, 7)
    requests = [
        {"DALI_INPUT_0": np.full((1, n), 2, np.float16), "DALI_INPUT_1": np.full((1, n), 1, np.float16)}
        for n in lengths
    ]
    results = rf.infer_concurrently(http, "full_autoconfig", requests, ["DALI_OUTPUT_0"])
    for n, result in zip(lengths, results):
        np.testing.assert_array_equal(result.as_numpy("DALI_OUTPUT_0"), np.ones((1, n), np.float16))


# --- dali: partial configs of every kind ---------------------------------------------


def test_outputs_renamed_by_position_and_fields_merged(http):
    config = loaded_config(http, "renamed_outputs")
    assert config["max_batch_size"] == 8
    # the listed input keeps its place; the other is appended with allow_ragged_batch
    assert tensors(config, "input") == [("DALI_INPUT_1", "TYPE_FP16", [-1]), ("DALI_INPUT_0", "TYPE_FP16", [-1])]
    assert [t["allow_ragged_batch"] for t in config["input"]] == [False, True]
    assert tensors(config, "output") == [("HALF", "TYPE_FP16", [-1]), ("TRIPLE", "TYPE_FP32", [-1])]
    b = np.array([[1, 2]], np.float16)
    answers = infer(http, "renamed_outputs", {"DALI_INPUT_0": b, "DALI_INPUT_1": b}, ["HALF", "TRIPLE"])
    np.testing.assert_array_equal(answers["TRIPLE"], (b * 3).astype(np.float32))


@pytest.mark.parametrize(
    "model, words",
    [
        ("wrong_type", ["O", "TYPE_INT32", "TYPE_FP16"]),
        ("unknown_input", ["IMAGE", "DALI_INPUT_0", "DALI_INPUT_1"]),
        ("undeclared_type", ["DALI_INPUT_0", "declares no type", "set data_type"]),
    ],
)
def test_what_the_cpp_backend_refuses_is_refused_naming_the_fix(http, model, words):
    message = rf.load_error(http, model)
    assert all(word in message for word in words), message


def test_stated_zero_max_batch_size_is_unbatched(http):
    """src/dali_model.h Batched(); config_tools.cc add_batch_dim: the filled dims
    start with the samples' axis, and a request's rows are its samples."""
    config = loaded_config(http, "unbatched")
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
    assert [[int(d) for d in t["dims"]] for t in config["input"]] == [[-1, -1], [-1, -1]]
    a, b = np.array([[2, 4], [6, 8], [1, 3]], np.float16), np.ones((3, 1), np.float16)
    answers = infer(http, "unbatched", {"DALI_INPUT_0": a, "DALI_INPUT_1": b}, ["DALI_OUTPUT_0"])
    np.testing.assert_array_equal(answers["DALI_OUTPUT_0"], a / 2)


def test_split_output_is_auto_completed_without_its_outer_axis(http):
    """src/dali_model.h ReadPipelineProperties: the declared shape loses its outer axis."""
    config = loaded_config(http, "split_autoconfig")
    assert tensors(config, "output") == [("PAIRS", "TYPE_UINT8", [-1]), ("ROW", "TYPE_UINT8", [-1])]
    row = np.arange(6, dtype=np.uint8)[np.newaxis]
    answers = infer(http, "split_autoconfig", {"IN": row}, ["PAIRS", "ROW"])
    np.testing.assert_array_equal(answers["PAIRS"], row.reshape(3, 2))


# --- dali: devices and versions ------------------------------------------------------


def test_gpu_written_cpu_pipeline_serves_on_cpu_instances(http):
    """device_id=0 in pipeline_def: DALI refuses it where there is no CUDA; the
    container runs such a pipeline on KIND_CPU instances, and so do we."""
    config = loaded_config(http, "gpu_written_cpu_pipeline")
    x = np.array([[1, 2, 3]], np.float32)
    out = config["output"][0]["name"]
    np.testing.assert_array_equal(infer(http, "gpu_written_cpu_pipeline", {"X": x}, [out])[out], x * 5)


def test_gpu_operator_on_cpu_instances_is_refused(http):
    message = rf.load_error(http, "gpu_operator_on_cpu")
    assert "KIND_CPU" in message and "device='mixed'" in message, message


def test_version_policy_serves_the_versions_it_names(http):
    config = loaded_config(http, "versioned")
    out = config["output"][0]["name"]
    x = np.array([[1, 2]], np.float32)
    for version in ("1", "2"):
        answer = infer(http, "versioned", {"X": x}, [out], version=version)[out]
        np.testing.assert_array_equal(answer, x * int(version))
    assert not http.is_model_ready("versioned", "3")
    with pytest.raises(InferenceServerException):
        infer(http, "versioned", {"X": x}, [out], version="3")


# --- onnxruntime -----------------------------------------------------------------------


def test_onnx_bare_config_is_completed_from_the_graph(http):
    config = loaded_config(http, "onnx_bare")
    assert tensors(config, "input") == [("X", "TYPE_FP32", [4])]
    assert tensors(config, "output") == [("Y", "TYPE_FP32", [4])]
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config  # default-max-batch-size


def test_onnx_scalar_per_sample_is_reshaped(http):
    config = loaded_config(http, "onnx_scalar")
    assert tensors(config, "input") == [("X", "TYPE_FP32", [1])]
    assert [int(d) for d in config["input"][0]["reshape"].get("shape", [])] == []
    x = np.array([[1], [2], [3]], np.float32)
    np.testing.assert_array_equal(infer(http, "onnx_scalar", {"X": x}, ["Y"])["Y"], x * 2)


def test_onnx_missing_output_list_is_filled(http):
    config = loaded_config(http, "onnx_inputs_only")
    assert config["max_batch_size"] == 2
    assert tensors(config, "output") == [("Y", "TYPE_FP32", [4])]
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(infer(http, "onnx_inputs_only", {"X": x}, ["Y"])["Y"], x * 2)


def test_onnx_listed_tensor_without_type_is_refused_naming_the_graphs(http):
    message = rf.load_error(http, "onnx_listed_untyped")
    assert "'X'" in message and "set data_type: TYPE_FP32" in message, message


def test_onnx_graph_that_cannot_batch_refuses_a_max_batch_size(http):
    message = rf.load_error(http, "onnx_cannot_batch")
    assert "max_batch_size" in message and "cannot batch" in message, message


# --- the user's files ------------------------------------------------------------------


def test_python_backend_model_serves(http):
    http.load_model("python_identity")
    x = np.array([[1, 2]], np.float32)
    np.testing.assert_array_equal(infer(http, "python_identity", {"IN": x}, ["OUT"])["OUT"], x)


def test_a_sources_rank_comes_from_its_layout(http):
    """DALI infers an external source's ndim from its layout ("HWC": 3); auto-complete
    fills the input's dims from it (qa/L0_img_proc, a folder without config.pbtxt)."""
    config = loaded_config(http, "layout_only.dali")
    assert tensors(config, "input") == [("DALI_INPUT_0", "TYPE_UINT8", [-1, -1, -1])]
    image = np.arange(2 * 3 * 4 * 3, dtype=np.uint8).reshape(2, 3, 4, 3)
    answers = infer(http, "layout_only.dali", {"DALI_INPUT_0": image}, ["DALI_OUTPUT_0"])
    np.testing.assert_array_equal(answers["DALI_OUTPUT_0"], image[:, :, ::-1])


def test_serving_changed_no_byte_of_the_repository(repository, before, triton, http):
    """Runs last: every model above was loaded (or refused) and most were asked.
    Our backends write nothing there; Triton's own Python backend writes model.py's
    bytecode, which the launcher removes when it stops."""
    for name in ("full_autoconfig", "no_config_file.dali", "python_identity", "versioned"):
        assert http.is_model_ready(name)
    assert [p for p in fingerprint(repository) if "__pycache__" not in p] == list(before)
    assert fingerprint(repository) != before  # python_identity/1/__pycache__, for now
    triton.stop()
    assert fingerprint(repository) == before
