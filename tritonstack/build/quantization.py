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
in the graph, each of the 17 pads ran in float between a DequantizeLinear and a
QuantizeLinear: in process (batch 8, 2 threads) pads and those conversions took 47 %
of the INT8 model's time, and the INT8 model ran at 1.17x the FP32 one; folded, it
runs at 2.1-2.3x, and agrees with FP32 more often: top-1 on 86 % of the 216 images
of parity.crop_images() against 68 % (docs/performance.md).

Three operators stay in float (common practice, and measured here): the final
softmax, whose probabilities quantized to 8 bits would come in steps of 1/256 and
collapse near-ties in the top 5; the classifier head (Gemm), which sets the ranking;
and the first convolution, which sees the normalized pixels with only 3 input
channels and costs little. Percentile or entropy calibration, 54 calibration images
instead of 9, the last convolution in float or INT8 activations moved the crop
corpus's agreement by at most 1.3 points either way: not taken.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import sys
from pathlib import Path

import numpy as np

from tritonstack.build.classifiers import Classifier, export_onnx
from tritonstack.samples import PHOTOS, photo_bytes

# The project's photos (samples.PHOTOS) and scikit-image's other colour photos of
# real scenes: more images give steadier activation ranges.
CALIBRATION_PHOTOS = (*PHOTOS, "motorcycle_right.png", "coins.png", "camera.png", "hubble_deep_field.jpg")


def calibration_tensors(classifier: Classifier) -> np.ndarray:
    """The calibration photos through the DALI pipeline the build serializes for
    this classifier's preprocessing (decode, resize, crop, normalize)."""
    from tritonstack.build.pipelines import run_pipeline, serialize_pipeline

    encoded = [photo_bytes(name) for name in CALIBRATION_PHOTOS]
    return run_pipeline(serialize_pipeline(classifier.preprocessing, max_batch_size=len(encoded), num_threads=1),
                        encoded)


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
            self._feeds = iter([{classifier.input_name: tensors[index:index + 1]} for index in range(len(tensors))])

        def get_next(self):
            return next(self._feeds, None)

    prepared_path = int8_path.with_name(f".{int8_path.name}.prepared")
    try:
        quant_pre_process(str(fp32_path), str(prepared_path))  # folds the pads into the convolutions
        graph = onnx.load(str(prepared_path), load_external_data=False).graph
        kept_in_float = [node.name for node in graph.node if node.op_type in ("Softmax", "Gemm", "MatMul")]
        kept_in_float += [node.name for node in graph.node if node.op_type == "Conv"][:1]
        quantize_static(
            str(prepared_path), str(int8_path), Photos(),
            quant_format=QuantFormat.QDQ, per_channel=True,
            weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8,
            calibrate_method=CalibrationMethod.MinMax, nodes_to_exclude=kept_in_float,
            calibration_providers=["CPUExecutionProvider"],
        )
    finally:
        prepared_path.unlink(missing_ok=True)


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
