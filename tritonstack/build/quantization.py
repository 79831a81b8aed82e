"""INT8 classifiers: ONNX Runtime static quantization of an FP32 export.

QDQ format (QuantizeLinear/DequantizeLinear pairs around each quantized operator,
which ONNX Runtime's CPU provider fuses into integer kernels), weights INT8 per
output channel, activations UINT8 per tensor, their ranges calibrated (min/max) on
the project's photos preprocessed by the DALI pipeline itself, so that the ranges
are those of the tensors the served model will get. The graph's input and output
stay FP32: the ensemble and the backends see the same tensors as for the FP32 model.

Before quantizing, ONNX Runtime's own quantization pre-processing
(`quant_pre_process`: shape inference and its basic graph optimizations) folds the
export's explicit zero `Pad` before each strided convolution (TensorFlow's "same"
padding, as the EfficientNet-Lite port writes it) into the convolution's pads. Left
in the graph, each pad runs in float between a DequantizeLinear and a QuantizeLinear,
which costs most of INT8's speed and some of its agreement with FP32
(docs/decisions.md#int8-folds-the-pads-and-bounds-neighbouring-weights).

Weights are INT8 and activations UINT8 (ONNX Runtime's U8S8), with one bound that
makes the model compute the same integers on every x86 CPU: see
`bound_neighbouring_weights`.

Three operators stay in float (common practice): the final softmax, whose
probabilities quantized to 8 bits would come in steps of 1/256 and collapse near-ties
in the top 5; the classifier head (Gemm), which sets the ranking; and the first
convolution, which sees the normalized pixels with only 3 input channels and costs
little. The other calibration choices tried changed the agreement too little to take
(docs/performance.md#int8-preset-dali_efficientnet_lite0_int8).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import sys
from pathlib import Path

import numpy as np

from tritonstack.build.classifiers import Classifier, export_onnx
from tritonstack.samples.photos import PHOTOS, photo_bytes

# The project's photos (samples.PHOTOS) and scikit-image's other colour photos of
# real scenes: more images give steadier activation ranges.
CALIBRATION_PHOTOS = (*PHOTOS, "motorcycle_right.png", "coins.png", "camera.png", "hubble_deep_field.jpg")


def calibration_tensors(classifier: Classifier) -> np.ndarray:
    """The calibration photos through the DALI pipeline the build serializes for
    this classifier's preprocessing (decode, resize, crop, normalize)."""
    from tritonstack.build.pipelines import run_pipeline, serialize_pipeline

    encoded = [photo_bytes(name) for name in CALIBRATION_PHOTOS]
    return run_pipeline(
        serialize_pipeline(classifier.preprocessing, max_batch_size=len(encoded), num_threads=1), encoded
    )


def quantize_int8(classifier: Classifier, fp32_path: Path, int8_path: Path) -> None:
    """Write the INT8 (QDQ, per-channel) version of `fp32_path` to `int8_path`."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_static,
    )

    tensors = calibration_tensors(classifier)

    class Photos(CalibrationDataReader):
        def __init__(self):
            self._feeds = iter([{classifier.input_name: tensors[index : index + 1]} for index in range(len(tensors))])

        def get_next(self):
            return next(self._feeds, None)

    prepared_path = int8_path.with_name(f".{int8_path.name}.prepared")
    try:
        quant_pre_process(str(fp32_path), str(prepared_path))  # folds the pads into the convolutions
        graph = onnx.load(str(prepared_path), load_external_data=False).graph
        kept_in_float = [node.name for node in graph.node if node.op_type in ("Softmax", "Gemm", "MatMul")]
        kept_in_float += [node.name for node in graph.node if node.op_type == "Conv"][:1]
        quantize_static(
            str(prepared_path),
            str(int8_path),
            Photos(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            weight_type=QuantType.QInt8,
            activation_type=QuantType.QUInt8,
            calibrate_method=CalibrationMethod.MinMax,
            nodes_to_exclude=kept_in_float,
            calibration_providers=["CPUExecutionProvider"],
        )
        bound_neighbouring_weights(prepared_path, int8_path)
    finally:
        prepared_path.unlink(missing_ok=True)


# The sum VPMADDUBSW may hold: 255 x 128 = 32640 <= 32767.
PAIR_BOUND = 128


def bound_neighbouring_weights(float_path: Path, int8_path: Path) -> None:
    """Requantize each 1x1 convolution's INT8 weights so that no two neighbouring
    input channels of the same sign sum to more than PAIR_BOUND in magnitude.

    Why: on x86 CPUs without VNNI (AVX2; AVX-512 without VNNI) ONNX Runtime multiplies
    UINT8 activations by INT8 weights with VPMADDUBSW, which adds each two neighbouring
    products into a saturating int16; 255 x (127 + 127) overflows it. The results then
    depend on the serving CPU (AVX-512 VNNI does not saturate). ONNX Runtime's
    documented remedies, reduce_range and U8U8, cost more agreement or speed here
    (docs/performance.md#int8-preset-dali_efficientnet_lite0_int8). Bounding the pairs
    keeps every product sum within int16 on every CPU, and costs precision only on
    channels whose two largest weights are neighbours.
    Depthwise convolutions widen to 16 bits before multiplying and need no bound.

    The per-output-channel scale becomes the larger of max|w| / 127 and the largest
    same-sign neighbour sum / PAIR_BOUND (nudged up where rounding overshoots); the
    INT32 bias is requantized with it, since ONNX Runtime fuses a QDQ convolution into
    an integer kernel only when the bias scale is input scale x weight scale."""
    import onnx
    from onnx import numpy_helper

    floats = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(float_path)).graph.initializer}
    model = onnx.load(str(int8_path))
    initializers = {t.name: t for t in model.graph.initializer}
    producers = {output: node for node in model.graph.node for output in node.output}

    def replace(name: str, array: np.ndarray) -> None:
        initializers[name].CopyFrom(numpy_helper.from_array(array, name))

    for node in model.graph.node:
        weight_dq = producers.get(node.input[1]) if node.op_type == "Conv" else None
        if weight_dq is None or weight_dq.op_type != "DequantizeLinear":
            continue
        quantized = numpy_helper.to_array(initializers[weight_dq.input[0]])
        if quantized.dtype != np.int8 or quantized.shape[2:] != (1, 1) or quantized.shape[1] < 2:
            continue
        weights = floats[weight_dq.input[0].removesuffix("_quantized")].reshape(quantized.shape[0], -1)
        scale, integers = pair_bounded_quantization(weights)
        replace(weight_dq.input[0], integers.reshape(quantized.shape))
        replace(weight_dq.input[1], scale)
        if len(node.input) > 2:
            bias_dq = producers[node.input[2]]
            input_scale = numpy_helper.to_array(initializers[producers[node.input[0]].input[1]])
            bias_scale = (input_scale * scale).astype(np.float32)
            bias = floats[bias_dq.input[0].removesuffix("_quantized")]
            replace(bias_dq.input[0], np.round(bias / bias_scale).astype(np.int32))
            replace(bias_dq.input[1], bias_scale)
    onnx.save(model, str(int8_path))


def neighbour_sums(integers: np.ndarray) -> np.ndarray:
    """Per output channel (rows), the largest |a| + |b| over neighbouring input
    channels (2j, 2j + 1) of the same sign: what VPMADDUBSW adds for 255-valued inputs."""
    if integers.shape[1] % 2:
        integers = np.pad(integers, ((0, 0), (0, 1)))
    even, odd = integers[:, 0::2], integers[:, 1::2]
    same_sign = np.sign(even) == np.sign(odd)
    return np.where(same_sign, np.abs(even) + np.abs(odd), 0).max(axis=1)


def pair_bounded_quantization(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row INT8 quantization of [out, in] weights whose neighbouring
    same-sign pairs stay within PAIR_BOUND: (scale, integers)."""
    weights = weights.astype(np.float32)
    scale = np.maximum(np.abs(weights).max(axis=1) / 127, neighbour_sums(weights) / PAIR_BOUND)
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    while True:
        integers = np.clip(np.round(weights / scale[:, None]), -127, 127).astype(np.int8)
        over = neighbour_sums(integers.astype(np.int32)) > PAIR_BOUND
        if not over.any():
            return scale, integers
        scale = np.where(over, scale * np.float32(1.002), scale).astype(np.float32)


def fingerprint(classifier: Classifier) -> str:
    """The FP32 export's fingerprint, and what the quantization depends on: ONNX
    Runtime, DALI, this module, the preprocessing and the calibration photos."""
    import nvidia.dali
    import onnxruntime

    digest = hashlib.sha256(classifier.fingerprint().encode())
    digest.update(f"int8 {onnxruntime.__version__} {nvidia.dali.__version__} {classifier.preprocessing}".encode())
    digest.update(inspect.getsource(sys.modules[__name__]).encode())
    for name in CALIBRATION_PHOTOS:
        digest.update(photo_bytes(name))
    return digest.hexdigest()


def export_int8(classifier: Classifier, path: Path) -> None:
    """The FP32 export of the classifier, quantized into `path`."""
    fp32_path = path.with_name(f".{path.name}.fp32")
    try:
        export_onnx(dataclasses.replace(classifier, int8=False, derived_from=""), fp32_path)
        quantize_int8(classifier, fp32_path, path)
    finally:
        fp32_path.unlink(missing_ok=True)
