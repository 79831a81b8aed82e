"""The INT8 preset (ONNX Runtime static quantization of Lite0): its ensemble serves
and gives the FP32 ensemble's top-1 class for the project's photos. A correctness
check of the quantized model, not a performance or accuracy measurement."""

import numpy as np
import onnx

from tritonstack.build.presets import preset_named
from tritonstack.client.classifier import ClassifierClient
from tritonstack.samples import PHOTOS, photo_bytes

INT8 = preset_named("dali_efficientnet_lite0_int8")


def test_int8_ensemble_serves_and_agrees_on_top1_with_fp32(server):
    images = [photo_bytes(name) for name in PHOTOS]
    with ClassifierClient(server.grpc_url, protocol="grpc", model="ensemble_dali_efficientnet_lite0") as fp32, \
            ClassifierClient(server.grpc_url, protocol="grpc", model=INT8.ensemble_name) as int8:
        expected, served = fp32.probabilities(images), int8.probabilities(images)
        ranked = int8.classify(images, top_k=3)
    assert served.shape == (len(images), 1000)
    np.testing.assert_allclose(served.sum(axis=1), 1.0, atol=1e-4)  # the softmax stayed in float
    assert served.argmax(axis=1).tolist() == expected.argmax(axis=1).tolist(), list(PHOTOS)
    for (name, classes), top in zip(PHOTOS.items(), ranked):
        if classes:
            assert {prediction.label for prediction in top} & classes, (name, top)


def test_int8_model_is_quantized_per_channel_in_qdq_format(model_repository):
    graph = onnx.load(str(model_repository / INT8.classifier.name / "1" / "model.onnx")).graph
    operators = {node.op_type for node in graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "Softmax"} <= operators
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    weight_scales = [initializers[node.input[1]] for node in graph.node
                     if node.op_type == "DequantizeLinear" and node.input[0] in initializers
                     and initializers[node.input[0]].data_type == onnx.TensorProto.INT8]
    assert weight_scales and all(len(scale.dims) == 1 and scale.dims[0] > 1 for scale in weight_scales[:5])
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_int8_model_has_no_float_pads_between_quantized_convolutions(model_repository):
    """The export's explicit zero pads are folded into the convolutions before
    quantization; left in, each ran in float between a Dequantize and a Quantize
    and the INT8 model was barely faster than FP32 (tritonstack/build/quantization.py)."""
    graph = onnx.load(str(model_repository / INT8.classifier.name / "1" / "model.onnx")).graph
    assert [node.name for node in graph.node if node.op_type == "Pad"] == []
    assert sum(node.op_type == "Conv" for node in graph.node) == 49
