"""Auto-complete skipped where it would change nothing: which configs a backend would
complete (tritonstack.rules.completion), the flag the launcher passes for them, and the
same configs served either way by a real tritonserver."""

from __future__ import annotations

from pathlib import Path

import psutil
import tritonclient.http as httpclient

from tests import repo_factory as rf
from tests.conftest import TEST_STOP_GRACE_S
from tritonstack.build.model_config import DynamicBatching, EnsembleStep, ModelConfig, Tensor
from tritonstack.rules.completion import models_to_complete
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import NO_AUTO_COMPLETE, ServerConfig

# A preprocessing step of each backend (dali, onnxruntime, python) and the ensembles
# that chain them.
SERVED_ALIKE = ("ensemble_dali_efficientnet_lite0", "ensemble_python_efficientnet_lite0", "ensemble_audio_silero_vad")

PYTHON_IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""
PYTHON_COMPLETING = PYTHON_IDENTITY.replace(
    "class TritonPythonModel:\n",
    "class TritonPythonModel:\n    @staticmethod\n    def auto_complete_config(config):\n        return config\n\n",
)


def python_config(name: str) -> ModelConfig:
    return ModelConfig(
        name=name,
        backend="python",
        inputs=(Tensor("IN", "FP32", (4,)),),
        outputs=(Tensor("OUT", "FP32", (4,)),),
        max_batch_size=8,
        instance_groups=rf.CPU,
    )


def onnx_config(name: str, listed: bool) -> ModelConfig:
    inputs, outputs = ((Tensor("X", "FP32", (4,)),), (Tensor("Y", "FP32", (4,)),)) if listed else ((), ())
    return ModelConfig(name, inputs, outputs, backend="onnxruntime", max_batch_size=8, instance_groups=rf.CPU)


def mixed_repository(root: Path) -> Path:
    """One model of each kind, complete or not."""
    identity = {"model.dali": rf.serialized(rf.identity_pipeline)}
    rf.write_model(root, rf.identity_config("dali_complete", dynamic_batching=DynamicBatching()), identity)
    rf.write_model(root, rf.identity_config("dali_no_batcher"), identity)  # gets a dynamic batcher
    rf.write_model(root, rf.dali_config("dali_partial", max_batch_size=None), identity)
    rf.write_model(root, rf.identity_config("dali_script"), {"dali.py": rf.AUTOSERIALIZE_SCRIPT})
    (root / "no_config.dali" / "1").mkdir(parents=True)
    (root / "no_config.dali" / "1" / "model.dali").write_bytes(rf.serialized(rf.identity_pipeline))
    rf.write_model(root, onnx_config("onnx_complete", listed=True), {"model.onnx": rf.add_graph()})
    rf.write_model(root, onnx_config("onnx_partial", listed=False), {"model.onnx": rf.add_graph()})
    rf.write_model(root, onnx_config("onnx_garbage", listed=True), {"model.onnx": b"\x0a\xff not a graph"})
    rf.write_model(root, python_config("python_plain"), {"model.py": PYTHON_IDENTITY})
    rf.write_model(root, python_config("python_completing"), {"model.py": PYTHON_COMPLETING})
    rf.write_model(root, python_config("python_broken"), {"model.py": "def broken(:\n"})
    chain = ModelConfig(
        name="chain",
        platform="ensemble",
        inputs=(Tensor("IN", "FP32", (4,)),),
        outputs=(Tensor("OUT", "FP32", (4,)),),
        max_batch_size=8,
        steps=(EnsembleStep("python_plain", {"IN": "IN"}, {"OUT": "OUT"}),),
    )
    rf.write_model(root, chain, {})
    rf.write_model(root, ModelConfig("torch_model", (), (), backend="pytorch", max_batch_size=8), {})
    return root


def test_the_built_repository_needs_no_auto_complete(model_repository):
    assert models_to_complete(model_repository) == {}


def test_each_config_a_backend_would_complete_is_found(tmp_path):
    found = models_to_complete(mixed_repository(tmp_path))
    assert set(found) == {
        "dali_partial",
        "dali_script",
        "dali_no_batcher",
        "no_config.dali",
        "onnx_garbage",
        "onnx_partial",
        "python_broken",
        "python_completing",
        "torch_model",
    }, found
    assert "auto_complete_config" in found["python_completing"]
    assert "dali.py" not in found["dali_partial"] and "model.dali" in found["dali_script"], found
    assert "cannot be read" in found["onnx_garbage"] and "SyntaxError" in found["python_broken"], found
    assert models_to_complete(tmp_path / "missing") == {str(tmp_path / "missing"): "not a folder"}


def test_the_flag_is_passed_only_where_the_launcher_may_skip_it(model_repository, tmp_path):
    def flags(repository, **options) -> list[str]:
        command = TritonServer(ServerConfig(repository, **options)).command(tmp_path / "backends")
        return [arg for arg in command if arg == NO_AUTO_COMPLETE]

    assert flags(model_repository) == [NO_AUTO_COMPLETE]
    assert flags(model_repository, always_auto_complete=True) == []
    assert flags(model_repository, extra_args=(NO_AUTO_COMPLETE,)) == [NO_AUTO_COMPLETE]  # the caller's, once
    assert flags(model_repository, extra_args=rf.EXPLICIT) == []  # the caller loads models: any may come later
    assert flags(mixed_repository(tmp_path / "mixed")) == []


def test_the_configs_are_served_alike_with_auto_complete_skipped(model_repository):
    """Every config Triton reports is the same whether the backends completed the
    configs or not."""
    served = {}
    for always in (True, False):
        config = ServerConfig(
            model_repository, models=SERVED_ALIKE, always_auto_complete=always, stop_grace_s=TEST_STOP_GRACE_S
        )
        with TritonServer(config) as server, httpclient.InferenceServerClient(server.http_url) as client:
            assert (NO_AUTO_COMPLETE in psutil.Process(server.process.pid).cmdline()) is not always
            names = [model["name"] for model in client.get_model_repository_index(headers=server.admin_headers())]
            served[always] = {name: client.get_model_config(name) for name in names if client.is_model_ready(name)}
    assert len(served[False]) >= 2 * len(SERVED_ALIKE), sorted(served[False])
    assert served[False] == served[True]
