"""A request's samples as the pipeline will take them, refused before the pipeline
runs when they are too large (max_input_bytes, the decode budget) or certain not to
decode (tritonstack.decodable)."""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonstack.decodable import undecodable_reason
from tritonstack.decode_budget import BudgetError, DecodeBudget

__all__ = ["BudgetError", "InputError", "UndecodableError", "check_size", "samples_of"]


class InputError(Exception):
    """A request's data was refused before it reached the pipeline."""


class UndecodableError(InputError):
    """An encoded image the decoder is certain to refuse, refused before it runs:
    its failure would cost a pipeline rebuild (tritonstack.decodable)."""


def samples_of(request, input_names: list[str], decoded_inputs: list[str], itemsizes: dict[str, int],
               max_input_bytes: int, batched: bool, budget: DecodeBudget) -> tuple[dict[str, np.ndarray], int]:
    """A request's inputs (each row of a batched input is one sample) and the
    pixels its images declare."""
    tensors = {name: pb_utils.get_input_tensor_by_name(request, name) for name in input_names}
    for name, tensor in tensors.items():
        check_size(name, tensor.shape(), itemsizes[name], max_input_bytes)
    feed = {name: tensor.as_numpy() for name, tensor in tensors.items()}
    if not batched:
        feed = {name: array[np.newaxis] for name, array in feed.items()}
    pixels = sum(budget.request_pixels((sample.data for sample in feed[name]), name) for name in decoded_inputs)
    for name in decoded_inputs:
        for row, sample in enumerate(feed[name]):
            reason = undecodable_reason(sample.data)
            if reason:
                raise UndecodableError(f"input '{name}' sample {row} cannot be decoded: {reason}; refused "
                                       "before the pipeline's image decoder (decoders.image) ran")
    return feed, pixels


def check_size(name: str, shape, itemsize: int, max_bytes: int) -> None:
    """From the tensor's shape: nothing has read or copied its data yet."""
    size = int(np.prod(shape, dtype=np.int64)) * itemsize
    if size > max_bytes:
        raise InputError(f"input '{name}' is {size} bytes, above this model's max_input_bytes "
                         f"{max_bytes}: send smaller images or fewer per request")
