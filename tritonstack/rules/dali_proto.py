"""Read a serialized DALI pipeline (`model.dali`) without building it, so that a
GPU pipeline can be inspected on a machine without a GPU. The one reader of
`model.dali`: the `dali` backend (load checks, auto-complete) and
`build_pipelines.py check` both use it, through tritonstack.rules. It needs
neither DALI nor a GPU.

`model.dali` is DALI's `PipelineDef` protobuf (dali/pipeline/proto/dali.proto);
its Python module is not shipped in the wheel, so the few fields needed are read
from the protobuf wire format (the C++ backend reads the same fields through
DALI's C API):
PipelineDef.max_batch_size = 2, op = 5, pipe_outputs = 7; OpDef.name = 1, input = 2, output = 3,
arg = 4; InputOutput.name = 1, device = 2, dtype = 5, ndim = 6;
Argument.name = 1, ints = 4, strings = 5.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonstack.contract import DALI_TO_TRITON

_BATCH_SIZE, _OP, _PIPE_OUTPUT = 2, 5, 7
_OP_NAME, _OP_INPUT, _OP_OUTPUT, _OP_ARG = 1, 2, 3, 4
_IO_NAME, _IO_DEVICE, _IO_DTYPE, _IO_NDIM = 1, 2, 5, 6
_ARG_NAME, _ARG_INTS, _ARG_STRINGS = 1, 4, 5
_UNKNOWN = (1 << 64) - 1  # -1 as a protobuf varint: type or ndim not declared

EXTERNAL_SOURCES = {"ExternalSource", "_ExternalSource"}
# Operators whose first input is an encoded clip (fn.decoders.video and its older name).
VIDEO_DECODERS = {"decoders__Video", "experimental__decoders__Video"}
# Input operators: a pipeline input fed once per request, then run until it is
# consumed, each run a response of its own (a decoupled model). fn.experimental.inputs.video
# takes one encoded clip and gives its frames in sequences, `batch_size` sequences a run.
INPUT_OPERATORS = {"experimental__inputs__Video", "inputs__Video"}
# Operators whose first input is an encoded audio clip (fn.decoders.audio and its older name).
AUDIO_DECODERS = {"decoders__Audio", "AudioDecoder"}
# Operators whose first input is an encoded image.
DECODERS = {
    "decoders__Image",
    "decoders__ImageCrop",
    "decoders__ImageSlice",
    "decoders__ImageRandomCrop",
    "ImageDecoder",
    "ImageDecoderCrop",
    "ImageDecoderSlice",
    "ImageDecoderRandomCrop",
}


@dataclass(frozen=True)
class Port:
    """A pipeline input (external source) or output."""

    name: str
    dtype: str | None  # Triton type name ("TYPE_UINT8"), None when not declared
    ndim: int | None
    device: str


@dataclass(frozen=True)
class Operator:
    name: str  # DALI's schema name, e.g. "decoders__Image"
    display_name: str  # the name the pipeline code used, e.g. "image"
    device: str  # "cpu", "gpu" or "mixed"


@dataclass(frozen=True)
class PipelineSpec:
    inputs: tuple[Port, ...]  # the external sources, in definition order
    outputs: tuple[Port, ...]
    operators: tuple[Operator, ...]
    decoded_inputs: frozenset[str]  # external sources that feed an image decoder
    max_batch_size: int | None = None  # the batch size it was serialized with
    video_inputs: frozenset[str] = frozenset()  # external sources that feed a video decoder
    # The frames a video decoder gives per clip (its sequence_length), None: every frame;
    # for an input operator, the frames of one of its sequences.
    clip_frames: int | None = None
    streamed_inputs: frozenset[str] = frozenset()  # input operators' names (fn.experimental.inputs.video)
    audio_inputs: frozenset[str] = frozenset()  # external sources that feed an audio decoder

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(port.name for port in self.inputs)

    @property
    def gpu_operators(self) -> tuple[str, ...]:
        """Operators placed on "gpu" or "mixed", as "image(mixed)"."""
        return tuple(f"{op.display_name}({op.device})" for op in self.operators if op.device != "cpu")


def parse_pipeline(serialized: bytes) -> PipelineSpec:
    """What a serialized pipeline declares; ValueError when it is not one."""
    pipeline = _fields(serialized)
    inputs, operators, decoded, videos, streamed, clip_frames = [], [], set(), set(), set(), None
    audio = set()
    for op in (_fields(data) for number, data in pipeline if number == _OP):
        name = _string(op, _OP_NAME)
        args = {_string(_fields(arg), _ARG_NAME): _fields(arg) for number, arg in op if number == _OP_ARG}
        device = _string(args.get("device", []), _ARG_STRINGS) or "cpu"
        operators.append(Operator(name, _string(args.get("_display_name", []), _ARG_STRINGS) or name, device))
        if name in EXTERNAL_SOURCES:
            output = _string(_fields(_first(op, _OP_OUTPUT)), _IO_NAME)
            # DALI infers a source's rank from its layout ("HWC": 3) when ndim is not given.
            ndim = _int(args.get("ndim", []), _ARG_INTS)
            layout = _string(args.get("layout", []), _ARG_STRINGS)
            inputs.append(
                Port(
                    output,
                    _triton_dtype(_int(args.get("dtype", []), _ARG_INTS)),
                    ndim if ndim is not None or not layout else len(layout),
                    device,
                )
            )
        elif name in INPUT_OPERATORS:  # encoded clips: one dimension of bytes
            output = _string(_fields(_first(op, _OP_OUTPUT)), _IO_NAME)
            inputs.append(Port(output, "TYPE_UINT8", 1, device))
            videos.add(output)
            streamed.add(output)
            clip_frames = _int(args.get("sequence_length", []), _ARG_INTS)
        elif name in DECODERS:
            decoded.add(_string(_fields(_first(op, _OP_INPUT)), _IO_NAME))
        elif name in AUDIO_DECODERS:
            audio.add(_string(_fields(_first(op, _OP_INPUT)), _IO_NAME))
        elif name in VIDEO_DECODERS:
            videos.add(_string(_fields(_first(op, _OP_INPUT)), _IO_NAME))
            clip_frames = _int(args.get("sequence_length", []), _ARG_INTS)
    outputs = tuple(
        Port(
            _string(output, _IO_NAME),
            _triton_dtype(_int(output, _IO_DTYPE)),
            _int(output, _IO_NDIM),
            _string(output, _IO_DEVICE),
        )
        for output in (_fields(data) for number, data in pipeline if number == _PIPE_OUTPUT)
    )
    if not outputs:
        raise ValueError("no pipeline outputs found")
    sources = {port.name for port in inputs}
    return PipelineSpec(
        tuple(inputs),
        outputs,
        tuple(operators),
        frozenset(decoded & sources),
        _int(pipeline, _BATCH_SIZE),
        frozenset(videos & sources),
        clip_frames,
        frozenset(streamed),
        frozenset(audio & sources),
    )


def _triton_dtype(value: int | None) -> str | None:
    if value is None:
        return None
    return DALI_TO_TRITON.get(value, f"TYPE_INVALID({value})")


def _first(fields, number: int) -> bytes:
    found = next((value for n, value in fields if n == number), None)
    if found is None:
        raise ValueError(f"operator without field {number}")
    return found


def _int(fields, number: int) -> int | None:
    found = [value for n, value in fields if n == number]
    return None if not found or found[0] == _UNKNOWN else int(found[0])


def _string(fields, number: int) -> str:
    return next((value.decode() for n, value in fields if n == number and isinstance(value, bytes)), "")


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """Top-level (field number, value) pairs of one protobuf message."""
    if not isinstance(data, bytes):
        raise ValueError("a protobuf message was expected, found a number")
    fields, position = [], 0
    try:
        while position < len(data):
            key, position = _varint(data, position)
            number, wire_type = key >> 3, key & 7
            if wire_type == 0:
                value, position = _varint(data, position)
            elif wire_type == 2:
                length, position = _varint(data, position)
                value, position = data[position : position + length], position + length
            elif wire_type in (1, 5):
                width = 8 if wire_type == 1 else 4
                value, position = data[position : position + width], position + width
            else:
                raise ValueError(f"unexpected protobuf wire type {wire_type}")
            fields.append((number, value))
    except IndexError:
        raise ValueError("truncated protobuf data") from None
    return fields


def _varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, position
