"""Your audio classifier as a served model: a clip's log-mel frames in, the clip's class
probabilities (the mean over its patches) and each patch's out, in one ONNX Runtime call.

Audio taggers (YAMNet and its kind) score fixed patches of a log-mel spectrogram:
`patch_frames` frames, `patch_hop` apart. The patching goes in front of the user's graph
and a softmax (for logits) and the mean behind it, so that the served model takes what
DALI's features step gives:

    features [1, T, mel_bins] FP32
      -> padded with the log of silence to at least patch_frames frames
      -> P = 1 + (T - patch_frames) // patch_hop patches [P, patch_frames, mel_bins]
      -> laid out as the classifier's input: [P, frames, mels], [P, 1, frames, mels]
         or [P, frames, mels, 1]
      -> the classifier -> [P, C] (-> softmax)
      -> clip_probabilities [1, C] (mean over patches), patch_probabilities [1, P, C]

The input's layout and sizes are read from the graph; a user's names never clash with
the added ones (prefixed `tritonstack_`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

FEATURES_INPUT = "log_mel"
CLIP_OUTPUT = "clip_probabilities"
PATCHES_OUTPUT = "patch_probabilities"
LAYOUTS = {"NTM": "[N, frames, mels]", "NCTM": "[N, 1, frames, mels]", "NTMC": "[N, frames, mels, 1]"}
_P = "tritonstack_"


@dataclass(frozen=True)
class AudioClassifierGraph:
    input_name: str
    layout: str  # a key of LAYOUTS
    patch_frames: int
    mel_bins: int
    output_name: str
    classes: int | None


def read_audio_classifier(path: Path) -> AudioClassifierGraph:
    """What the graph says of its input (a batch of log-mel patches) and its output."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {tensor.name for tensor in graph.initializer}
    (model_input,) = [value for value in graph.input if value.name not in initializers]
    dims = [dim.dim_value or -1 for dim in model_input.type.tensor_type.shape.dim]
    layout, frames, mels = _layout(path, model_input.name, dims)
    output = graph.output[0]
    classes = [dim.dim_value or None for dim in output.type.tensor_type.shape.dim][-1]
    return AudioClassifierGraph(model_input.name, layout, frames, mels, output.name, classes)


def _layout(path: Path, name: str, dims: list[int]) -> tuple[str, int, int]:
    if len(dims) == 3:
        layout, (frames, mels) = "NTM", dims[1:]
    elif len(dims) == 4 and dims[1] == 1:
        layout, (frames, mels) = "NCTM", dims[2:]
    elif len(dims) == 4 and dims[3] == 1:
        layout, (frames, mels) = "NTMC", dims[1:3]
    else:
        raise ValueError(
            f"{path}: input {name!r} has dims {dims}; an audio classifier takes a batch of log-mel patches, "
            f"one of {', '.join(LAYOUTS.values())}"
        )
    if frames <= 0 or mels <= 0:
        raise ValueError(f"{path}: input {name!r} has dims {dims}: its frames and mel bins must be fixed sizes")
    return layout, frames, mels


def servable_audio_classifier(
    path: Path, graph: AudioClassifierGraph, classes: int, patch_hop: int, silence: float, softmax: bool
) -> bytes:
    """The user's graph with the patching in front and softmax and mean behind (above);
    `silence`: the features' value for no sound, log(log_offset), that pads a short clip."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path))
    body = model.graph
    opset = next(entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx"))
    if opset < 13:
        raise ValueError(f"{path}: opset {opset}; convert it to opset 13 or newer (onnx.version_converter)")
    nodes = [*_patching(graph), *body.node, *_answers(graph, softmax, opset)]
    del body.node[:]
    body.node.extend(nodes)
    body.initializer.extend(_constants(graph, classes, patch_hop, silence))
    del body.input[:]
    body.input.append(helper.make_tensor_value_info(FEATURES_INPUT, TensorProto.FLOAT, [1, "frames", graph.mel_bins]))
    del body.output[:]
    body.output.extend(
        [
            helper.make_tensor_value_info(CLIP_OUTPUT, TensorProto.FLOAT, [1, classes]),
            helper.make_tensor_value_info(PATCHES_OUTPUT, TensorProto.FLOAT, [1, "patches", classes]),
        ]
    )
    del body.value_info[:]
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _constants(graph: AudioClassifierGraph, classes: int, patch_hop: int, silence: float) -> list:
    from onnx import numpy_helper

    def int64(name, values):
        return numpy_helper.from_array(np.asarray(values, np.int64), _P + name)

    input_shape = {"NTM": [-1, graph.patch_frames, graph.mel_bins], "NCTM": [-1, 1, graph.patch_frames, graph.mel_bins]}
    return [
        int64("zero", [0]),
        int64("one", [1]),
        int64("axis0", [0]),
        int64("patch_frames", [graph.patch_frames]),
        int64("patch_hop", [patch_hop]),
        int64("offsets", np.arange(graph.patch_frames)[None, :]),
        int64("input_shape", input_shape.get(graph.layout, [-1, graph.patch_frames, graph.mel_bins, 1])),
        int64("answer_shape", [1, -1, classes]),
        int64("flat_shape", [-1, classes]),
        numpy_helper.from_array(np.asarray(silence, np.float32), _P + "silence"),
    ]


def _patching(graph: AudioClassifierGraph) -> list:
    """features [1, T, M] -> the classifier's input [P, ...] (the module's docstring)."""
    from onnx import helper

    def node(op, inputs, outputs, **attributes):
        return helper.make_node(op, [_P + name for name in inputs], [_P + name for name in outputs], **attributes)

    return [
        helper.make_node("Squeeze", [FEATURES_INPUT, _P + "axis0"], [_P + "frames"]),
        node("Shape", ["frames"], ["frames_shape"]),
        node("Slice", ["frames_shape", "zero", "one"], ["frame_count"]),
        # pad to at least one patch: max(0, patch_frames - T) frames of silence at the end
        node("Sub", ["patch_frames", "frame_count"], ["missing"]),
        node("Max", ["missing", "zero"], ["pad_frames"]),
        node("Concat", ["zero", "zero", "pad_frames", "zero"], ["pads"], axis=0),
        node("Pad", ["frames", "pads", "silence"], ["padded"]),
        node("Add", ["frame_count", "pad_frames"], ["padded_count"]),
        # P = 1 + (T - patch_frames) // patch_hop; patch p starts at p * patch_hop
        node("Sub", ["padded_count", "patch_frames"], ["spare"]),
        node("Div", ["spare", "patch_hop"], ["extra_patches"]),
        node("Add", ["extra_patches", "one"], ["patch_count"]),
        node("Squeeze", ["patch_count", "axis0"], ["patch_count_scalar"]),
        node("Squeeze", ["zero", "axis0"], ["zero_scalar"]),
        node("Squeeze", ["one", "axis0"], ["one_scalar"]),
        node("Range", ["zero_scalar", "patch_count_scalar", "one_scalar"], ["patch_numbers"]),
        node("Mul", ["patch_numbers", "patch_hop"], ["starts"]),
        node("Unsqueeze", ["starts", "one"], ["start_column"]),
        node("Add", ["start_column", "offsets"], ["frame_indices"]),
        node("Gather", ["padded", "frame_indices"], ["patches"], axis=0),
        helper.make_node("Reshape", [_P + "patches", _P + "input_shape"], [graph.input_name]),
    ]


def _answers(graph: AudioClassifierGraph, softmax: bool, opset: int) -> list:
    """[P, C] scores -> probabilities -> their mean over patches, and every patch's."""
    from onnx import helper

    flat = _P + "scores"
    nodes = [helper.make_node("Reshape", [graph.output_name, _P + "flat_shape"], [flat])]
    if softmax:
        nodes.append(helper.make_node("Softmax", [flat], [_P + "probabilities"], axis=-1))
        flat = _P + "probabilities"
    # ReduceMean takes its axes as an input from opset 18, as an attribute before.
    mean = (
        helper.make_node("ReduceMean", [flat, _P + "axis0"], [CLIP_OUTPUT], keepdims=1)
        if opset >= 18
        else helper.make_node("ReduceMean", [flat], [CLIP_OUTPUT], axes=[0], keepdims=1)
    )
    nodes += [
        mean,
        helper.make_node("Reshape", [flat, _P + "answer_shape"], [PATCHES_OUTPUT]),
    ]
    return nodes
