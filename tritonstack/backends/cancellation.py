"""Requests their clients gave up on cost no decode and no inference.

Triton marks a request cancelled when its gRPC client cancels it or its gRPC
deadline passes (Triton 2.51: requests sent to a model directly, and ensemble steps
scheduled after the cancellation; a step already queued is not told). A request whose
`timeout` passed while it was queued is refused by Triton's queue policy before it
reaches a backend; a Python backend sees neither a deadline nor when a request
arrived, so it cannot judge expiry itself. What it can do is look at every request
of a batch before running it: a cancelled one is answered CANCELLED at once and
left out of the batch.
"""

from __future__ import annotations

import triton_python_backend_utils as pb_utils

CANCELLED_MESSAGE = "cancelled by its client (deadline passed or call cancelled) before it ran: nothing was computed"


def is_cancelled(request) -> bool:
    # is_cancelled() came with request cancellation in Triton's Python backend (23.10).
    check = getattr(request, "is_cancelled", None)
    return bool(check and check())


def cancelled_response():
    code = getattr(pb_utils.TritonError, "CANCELLED", pb_utils.TritonError.UNAVAILABLE)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(CANCELLED_MESSAGE, code))
