"""Read a serialized DALI pipeline (`model.dali`) without building it, so that a
GPU pipeline can be inspected on a machine without a GPU.

`model.dali` is DALI's `PipelineDef` protobuf (dali/pipeline/proto/dali.proto);
its Python module is not shipped in the wheel, so the few fields needed are read
from the protobuf wire format: operators (field 5: name 1, outputs 3, arguments 4),
each argument (name 1, strings 5), each output (name 1, device 2), and the
pipeline outputs (field 7).
"""

from __future__ import annotations

from dataclasses import dataclass

_OP, _PIPE_OUTPUT = 5, 7
_OP_NAME, _OP_OUTPUT, _OP_ARG = 1, 3, 4
_IO_NAME, _IO_DEVICE = 1, 2
_ARG_NAME, _ARG_STRINGS = 1, 5


@dataclass(frozen=True)
class PipelineSummary:
    input_names: tuple[str, ...]  # the external sources' names, in definition order
    outputs: tuple[tuple[str, str], ...]  # (name, device) of each pipeline output
    gpu_operators: tuple[str, ...]  # operators placed on "gpu" or "mixed"


def parse_pipeline(serialized: bytes) -> PipelineSummary:
    inputs, gpu_operators = [], []
    fields = _fields(serialized)
    for op in (value for number, value in fields if number == _OP):
        op_fields = _fields(op)
        op_name = _string(op_fields, _OP_NAME)
        arguments = {_string(_fields(arg), _ARG_NAME): _string(_fields(arg), _ARG_STRINGS)
                     for number, arg in op_fields if number == _OP_ARG}
        if arguments.get("device") in ("gpu", "mixed"):
            gpu_operators.append(f"{arguments.get('_display_name') or op_name}({arguments['device']})")
        if op_name == "ExternalSource":
            output = next(value for number, value in op_fields if number == _OP_OUTPUT)
            inputs.append(_string(_fields(output), _IO_NAME))
    outputs = tuple(
        (_string(_fields(value), _IO_NAME), _string(_fields(value), _IO_DEVICE))
        for number, value in fields if number == _PIPE_OUTPUT
    )
    if not outputs:
        raise ValueError("no pipeline outputs found")
    return PipelineSummary(tuple(inputs), outputs, tuple(gpu_operators))


def _string(fields, number: int) -> str:
    return next((value.decode() for n, value in fields if n == number and isinstance(value, bytes)), "")


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """Top-level (field number, value) pairs of one protobuf message."""
    fields, position = [], 0
    try:
        while position < len(data):
            key, position = _varint(data, position)
            number, wire_type = key >> 3, key & 7
            if wire_type == 0:
                value, position = _varint(data, position)
            elif wire_type == 2:
                length, position = _varint(data, position)
                value, position = data[position:position + length], position + length
            elif wire_type in (1, 5):
                width = 8 if wire_type == 1 else 4
                value, position = data[position:position + width], position + width
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
