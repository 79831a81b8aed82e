"""What a classifier's ONNX graph says about itself, and the two edits the build may
make so that it serves as the project's classifiers do.

    graph = read_graph(Path("mobilenet.onnx"))
    graph.layout, graph.size, graph.input_type, graph.fixed_batch   # "NHWC", 224, "fp32", True
    servable_onnx(Path("mobilenet.onnx"), softmax=True, dynamic_batch=True)   # bytes

Read from the graph, as Triton's onnxruntime backend reads it to complete a config: the
input's layout (where its 3 channels are), side, element type and batch axis, and the
output's class count. What a graph cannot say (channel order, scale, resize) is the
build's options; a check on real photos (build/photo_check.py) catches a wrong guess.

The edits: a quantized (UINT8 or INT8) output scaled back to FP32 with its own scale, a
softmax head when the graph ends in logits (the ensemble answers probabilities), and a
batch axis made dynamic when the exporter fixed it at 1 (Triton batches requests through
the classifier). Each is checked by running the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ONNX_TYPES = {1: "fp32", 2: "uint8"}  # onnx.TensorProto.FLOAT, UINT8
QUANTIZED_TYPES = (2, 3)  # UINT8, INT8: an integer output, from a QuantizeLinear
SERVED_OUTPUT = "probabilities"
BATCH_AXIS = "batch"


@dataclass(frozen=True)
class ClassifierGraph:
    input_name: str
    layout: str | None  # None: the graph does not say (its 3 channels are on both sides, or nowhere)
    size: int | None  # None: any side (dynamic spatial axes)
    input_type: str
    fixed_batch: bool  # the exporter fixed the batch axis at 1
    output_name: str
    classes: int | None  # None: dynamic
    quantized_output: bool = False  # integer scores from a QuantizeLinear (a quantized TFLite's)
    ends_in_softmax: bool = False  # the scores are a Softmax's (quantized or not): probabilities


def read_graph(path: Path) -> ClassifierGraph:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {tensor.name for tensor in graph.initializer}
    inputs = [tensor for tensor in graph.input if tensor.name not in initializers]
    if len(inputs) != 1 or len(graph.output) != 1:
        raise ValueError(
            f"{path}: a classifier takes one input and gives one output; found "
            f"{[t.name for t in inputs]} -> {[t.name for t in graph.output]}"
        )
    image, scores = inputs[0], graph.output[0]
    dims = _dims(image)
    if len(dims) != 4:
        raise ValueError(f"{path}: input {image.name!r} has shape {dims}; an image batch has 4 axes")
    elem_type = image.type.tensor_type.elem_type
    if elem_type not in ONNX_TYPES:
        raise ValueError(
            f"{path}: input {image.name!r} is {onnx.TensorProto.DataType.Name(elem_type)}; FLOAT or UINT8 images only"
        )
    if dims[0] not in (-1, 1):
        raise ValueError(f"{path}: input {image.name!r} fixes its batch at {dims[0]}; only 1 or a dynamic batch")
    output_dims = _dims(scores)
    if len(output_dims) != 2:
        raise ValueError(f"{path}: output {scores.name!r} has shape {output_dims}; a classifier gives [batch, classes]")
    layout, size = _layout_and_size(path, image.name, dims[1:])
    quantized = scores.type.tensor_type.elem_type in QUANTIZED_TYPES
    if quantized and _quantizer_of(graph, scores.name) is None:
        raise ValueError(f"{path}: output {scores.name!r} is an integer with no QuantizeLinear to scale it back")
    return ClassifierGraph(
        input_name=image.name,
        layout=layout,
        size=size,
        input_type=ONNX_TYPES[elem_type],
        fixed_batch=dims[0] == 1,
        output_name=scores.name,
        classes=output_dims[1] if output_dims[1] > 0 else None,
        quantized_output=quantized,
        ends_in_softmax=_ends_in_softmax(graph, scores.name),
    )


def _ends_in_softmax(graph, name: str) -> bool:
    """Whether the output is a Softmax's, through any (de)quantizing (tf2onnx writes a
    quantized TFLite's softmax as Softmax, QuantizeLinear, DequantizeLinear, QuantizeLinear)."""
    producers = {output: node for node in graph.node for output in node.output}
    node = producers.get(name)
    while node is not None and node.op_type in ("QuantizeLinear", "DequantizeLinear"):
        node = producers.get(node.input[0])
    return node is not None and node.op_type == "Softmax"


def _quantizer_of(graph, name: str):
    """The QuantizeLinear node whose output is `name`, if one is."""
    return next((node for node in graph.node if node.op_type == "QuantizeLinear" and name in node.output), None)


def _dims(value_info) -> list[int]:
    """-1 for an axis with no fixed size."""
    return [dim.dim_value or -1 for dim in value_info.type.tensor_type.shape.dim]


def _layout_and_size(path: Path, name: str, axes: list[int]) -> tuple[str | None, int | None]:
    channels_first, channels_last = axes[0] == 3, axes[2] == 3
    if channels_first == channels_last:
        return None, (axes[1] if axes[1] > 0 else None)
    spatial = axes[1:] if channels_first else axes[:2]
    if spatial[0] != spatial[1]:
        raise ValueError(f"{path}: input {name!r} is {spatial[0]} x {spatial[1]}; square images only")
    return ("NCHW" if channels_first else "NHWC"), (spatial[0] if spatial[0] > 0 else None)


def servable_onnx(path: Path, softmax: bool, dynamic_batch: bool, dequantize: bool = False) -> bytes:
    """The graph with its quantized output scaled back to FP32 and/or a softmax head (its
    output then named SERVED_OUTPUT) and/or its batch axis made dynamic; the file's own
    bytes when none is asked."""
    if not (softmax or dynamic_batch or dequantize):
        return Path(path).read_bytes()
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    if dynamic_batch:
        initializers = {tensor.name for tensor in graph.initializer}
        for value in [*(t for t in graph.input if t.name not in initializers), *graph.output]:
            value.type.tensor_type.shape.dim[0].dim_param = BATCH_AXIS
        del graph.value_info[:]  # shapes inferred for batch 1: ONNX Runtime infers them again
        _reshapes_keep_the_batch(graph)
    if dequantize:  # with the output's own scale and zero point
        quantizer = _quantizer_of(graph, graph.output[0].name)
        _append_head(graph, "DequantizeLinear", quantizer.input[1:], "dequantized" if softmax else SERVED_OUTPUT)
    if softmax:
        _append_head(graph, "Softmax", [], SERVED_OUTPUT, axis=-1)
    return model.SerializeToString()


def _append_head(graph, op: str, other_inputs, output: str, **attributes) -> None:
    """A node after the graph's output, whose FP32 result becomes the output."""
    import onnx
    from onnx import helper

    _free_name(graph, output)
    scores = graph.output[0]
    graph.node.append(helper.make_node(op, [scores.name, *other_inputs], [output], **attributes))
    served = onnx.ValueInfoProto()
    served.CopyFrom(scores)
    served.name = output
    served.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    graph.output.pop()
    graph.output.append(served)


def _free_name(graph, name: str) -> None:
    """A tensor of the graph already called `name` (a softmax's output named like the
    served one) renamed, so that the head's output can take the name."""
    renamed = f"{name}_in_graph"
    for node in graph.node:
        node.input[:] = [renamed if tensor == name else tensor for tensor in node.input]
        node.output[:] = [renamed if tensor == name else tensor for tensor in node.output]
    for value in [*graph.output, *graph.value_info]:
        if value.name == name:
            value.name = renamed


def _reshapes_keep_the_batch(graph) -> None:
    """Exporters that trace at batch 1 (tf2onnx on a TF1 graph) fold it into Reshape
    targets: [1, 1024, 1, 1]. A leading 1 there becomes 0, ONNX's "this axis as in the
    input", so the batch passes through. Checked by running a batch against single runs
    (build/photo_check.py): a graph where that 1 was not the batch is refused there."""
    from onnx import numpy_helper

    targets = {node.input[1] for node in graph.node if node.op_type == "Reshape" and len(node.input) > 1}
    for tensor in graph.initializer:
        if tensor.name in targets:
            shape = numpy_helper.to_array(tensor).copy()
            if shape.ndim == 1 and shape.size > 1 and shape[0] == 1:
                shape[0] = 0
                tensor.CopyFrom(numpy_helper.from_array(shape, tensor.name))
