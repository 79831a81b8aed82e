"""Silero VAD as a served model: the whole clip's samples in, a speech probability per
32 ms frame out, in one ONNX Runtime call.

silero-vad (MIT) ships `silero_vad_16k_sequence.onnx`: frames of 576 samples (64 of
context, the previous frame's tail, then 512 new ones) with the LSTM's state `h`, `c`
as inputs, equal to the streaming model run frame by frame (silero_vad/sequence_vad.py).
This module puts the framing in front of that graph and the zero state inside it, so
that the served model takes what DALI's decoder gives:

    samples [1, T] FP32, 16 kHz mono
      -> zero-padded to n = max(1, ceil(T / 512)) frames of 512
      -> each frame prefixed with the 64 samples before it (zeros for the first)
      -> the sequence model, state starting at zero
      -> frame_probabilities [1, n] FP32,  sample_count [1, 1] INT64 (T)

Exactly silero's own framing (`frame_blocks`): tests/test_audio.py compares the two on
real speech. A clip too short for one frame is padded to one, whose silence gives no
segment. The server keeps no state between requests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
FRAME_SAMPLES = 512  # 32 ms at 16 kHz
CONTEXT_SAMPLES = 64
STATE_SIZE = 128
SAMPLES_INPUT = "samples"
PROBABILITIES_OUTPUT = "frame_probabilities"
SAMPLE_COUNT_OUTPUT = "sample_count"
SEQUENCE_MODEL = "silero_vad_16k_sequence.onnx"
_SEQUENCE_INPUT, _SEQUENCE_OUTPUT = "input", "speech_probs"


def sequence_model_path() -> Path:
    """The weights the silero-vad wheel installs (no download at run time)."""
    import silero_vad

    return Path(silero_vad.__file__).parent / "data" / SEQUENCE_MODEL


def served_vad_onnx(sequence_model: Path | None = None) -> bytes:
    """The sequence model with the framing in front and the state inside (above)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(sequence_model or sequence_model_path()))
    graph = model.graph
    state = {value.name for value in graph.input if value.name != _SEQUENCE_INPUT}
    graph.initializer.extend(
        numpy_helper.from_array(np.zeros((1, 1, STATE_SIZE), np.float32), name) for name in sorted(state)
    )
    del graph.input[:]
    graph.input.append(helper.make_tensor_value_info(SAMPLES_INPUT, TensorProto.FLOAT, ["batch", "samples"]))
    graph.initializer.extend(_framing_constants())
    answers = [
        helper.make_node("Unsqueeze", [_SEQUENCE_OUTPUT, "axis0"], [PROBABILITIES_OUTPUT]),
        helper.make_node("Reshape", ["clip_length", "count_shape"], [SAMPLE_COUNT_OUTPUT]),
    ]
    nodes = [*_framing_nodes(), *graph.node, *answers]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.output[:]
    graph.output.extend(
        [
            helper.make_tensor_value_info(PROBABILITIES_OUTPUT, TensorProto.FLOAT, ["batch", "frames"]),
            helper.make_tensor_value_info(SAMPLE_COUNT_OUTPUT, TensorProto.INT64, ["batch", 1]),
        ]
    )
    del graph.value_info[:]
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _int64(name: str, values: list[int]):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _framing_constants() -> list:
    from onnx import numpy_helper

    return [
        _int64("frame_samples", [FRAME_SAMPLES]),
        _int64("one", [1]),
        _int64("zero", [0]),
        _int64("axis0", [0]),
        _int64("axis1", [1]),
        _int64("context_start", [FRAME_SAMPLES - CONTEXT_SAMPLES]),
        _int64("context_end", [FRAME_SAMPLES]),
        _int64("count_shape", [1, 1]),
        numpy_helper.from_array(np.zeros((1, FRAME_SAMPLES), np.float32), "silent_frame"),
    ]


def _framing_nodes() -> list:
    """samples [1, T] -> the sequence model's input [n, 576] (the module's docstring)."""
    from onnx import helper

    return [
        helper.make_node("Squeeze", ["samples", "axis0"], ["clip"]),
        helper.make_node("Shape", ["clip"], ["clip_length"]),
        # n = max(1, ceil(T / 512)), as (T + 511) / 512 in integers
        helper.make_node("Add", ["clip_length", "frame_samples"], ["length_plus_frame"]),
        helper.make_node("Sub", ["length_plus_frame", "one"], ["length_rounded_up"]),
        helper.make_node("Div", ["length_rounded_up", "frame_samples"], ["frames_needed"]),
        helper.make_node("Max", ["frames_needed", "one"], ["frame_count"]),
        helper.make_node("Mul", ["frame_count", "frame_samples"], ["padded_length"]),
        helper.make_node("Sub", ["padded_length", "clip_length"], ["tail"]),
        helper.make_node("Concat", ["zero", "tail"], ["pads"], axis=0),
        helper.make_node("Pad", ["clip", "pads"], ["padded"]),
        helper.make_node("Concat", ["frame_count", "frame_samples"], ["frames_shape"], axis=0),
        helper.make_node("Reshape", ["padded", "frames_shape"], ["frames"]),
        # each frame's context: the tail of the frame before it (a silent frame before the first)
        helper.make_node("Concat", ["silent_frame", "frames"], ["with_silence"], axis=0),
        helper.make_node("Slice", ["with_silence", "zero", "frame_count", "axis0"], ["previous"]),
        helper.make_node("Slice", ["previous", "context_start", "context_end", "axis1"], ["context"]),
        helper.make_node("Concat", ["context", "frames"], [_SEQUENCE_INPUT], axis=1),
    ]
