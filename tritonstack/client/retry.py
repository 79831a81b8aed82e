"""When to call Triton again, and how long to wait first.

Only a server that cannot answer right now is worth a second try: connection
refused or reset (restart, crash) and UNAVAILABLE (HTTP 503, gRPC UNAVAILABLE;
gRPC CANCELLED from a server shutting down).
A request the server rejected (HTTP 4xx, gRPC INVALID_ARGUMENT, NOT_FOUND, or
UNKNOWN from an undecodable image) fails the same way every time, and a timed-out
request may still be running: neither is retried.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError
from tritonclient.utils import InferenceServerException

T = TypeVar("T")

# InferenceServerException.status(): "503" over HTTP, "StatusCode.UNAVAILABLE" over gRPC.
# CANCELLED too: a server shutting down cancels the gRPC calls it still holds (seen when a
# restart's first server outlived its grace and was killed); this client never cancels its
# own calls (its timeouts are DEADLINE_EXCEEDED), and classifying again is harmless.
_UNAVAILABLE = {"503", "StatusCode.UNAVAILABLE", "StatusCode.CANCELLED"}
_TIMED_OUT = {"StatusCode.DEADLINE_EXCEEDED"}
# A known model with no version loaded right now: a server shutting down (it
# unloads models first) or a model being reloaded. Triton says NOT_FOUND / 400,
# but the same request succeeds once the model is back. (An unknown model name
# reads "... is not found" instead, and is not retried.)
_MODEL_BETWEEN_VERSIONS = "has no available versions"
# Triton's answer to an admin call without the launcher's key (tritonstack.serve.security).
_RESTRICTED = "This protocol is restricted"
# What gRPC says when the port answers HTTP/1 (Triton's HTTP port): a wrong port
# does not heal, so it is not retried.
_GRPC_ON_HTTP_PORT = "Failed parsing HTTP/2"


class ServerUnavailableError(ConnectionError):
    """No Triton server answers at the address, or it is not ready."""


def is_retryable(error: BaseException) -> bool:
    if isinstance(error, InferenceServerException):
        message = str(error.message())
        if _RESTRICTED in message or _GRPC_ON_HTTP_PORT in message:  # UNAVAILABLE, but it will not change
            return False
        return str(error.status()) in _UNAVAILABLE or _MODEL_BETWEEN_VERSIONS in message
    if isinstance(error, (TimeoutError, asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return False
    # HTTPConnectionClosed: the server went away before answering (shutdown, crash);
    # classifying again is harmless.
    return isinstance(error, (ConnectionError, HTTPConnectionClosed, aiohttp.ClientConnectionError))


def is_lost_region(error: BaseException) -> bool:
    """The server does not know a shared-memory region the client registered: a
    new server after a restart. Registering again fixes it."""
    return isinstance(error, InferenceServerException) and "Unable to find shared memory region" in str(error.message())


def is_timeout(error: BaseException) -> bool:
    if isinstance(error, InferenceServerException):
        return str(error.status()) in _TIMED_OUT
    return isinstance(error, (TimeoutError, asyncio.TimeoutError, aiohttp.ServerTimeoutError))


def describe_error(error: BaseException, timeout_s: float | None = None) -> str:
    """One line that says what went wrong, for a result line or a log."""
    if is_timeout(error):
        return f"timed out after {timeout_s:g} s" if timeout_s else "timed out"
    if isinstance(error, InferenceServerException):
        message = " ".join((error.message() or "").split())
        return f"{error.status()}: {message}" if error.status() else message
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter: the n-th wait is drawn from
    [d/2, d] with d = min(max_delay_s, base_delay_s * 2**n), so clients that
    failed together do not all come back at the same instant."""

    retries: int = 3
    base_delay_s: float = 0.25
    max_delay_s: float = 4.0

    def delays(self) -> Iterator[float]:
        for attempt in range(self.retries):
            ceiling = min(self.max_delay_s, self.base_delay_s * 2**attempt)
            yield random.uniform(ceiling / 2, ceiling)

    def call(self, attempt: Callable[[], T], on_retry: Callable[[BaseException], None] | None = None) -> T:
        for delay in self.delays():
            try:
                return attempt()
            except Exception as error:
                if not is_retryable(error):
                    raise
                if on_retry:
                    on_retry(error)
            time.sleep(delay)
        return attempt()

    async def acall(
        self,
        attempt: Callable[[], Awaitable[T]],
        on_retry: Callable[[BaseException], None] | None = None,
    ) -> T:
        for delay in self.delays():
            try:
                return await attempt()
            except Exception as error:
                if not is_retryable(error):
                    raise
                if on_retry:
                    on_retry(error)
            await asyncio.sleep(delay)
        return await attempt()


NO_RETRY = RetryPolicy(retries=0)


def unavailable_message(url: str, protocol: str, reason: BaseException | str) -> str:
    return f"no Triton server at {url} ({protocol}): start one with `make serve` ({reason})"


PROTOCOL_NAMES = {"http": "HTTP", "grpc": "gRPC"}


def wrong_protocol_message(url: str, protocol: str, error: BaseException | None) -> str | None:
    """What to say when something answers at `url`, but not in `protocol`: the
    HTTP client on Triton's gRPC port, or the other way round (error None: the
    caller found out itself). None when the error does not show it."""
    if (
        error is None
        or (isinstance(error, HTTPParseError) and protocol == "http")
        or (isinstance(error, InferenceServerException) and _GRPC_ON_HTTP_PORT in str(error.message()))
    ):
        other = "grpc" if protocol == "http" else "http"
    else:
        return None
    name, other_name = PROTOCOL_NAMES[protocol], PROTOCOL_NAMES[other]
    return (
        f"{url} does not answer {name}: is it Triton's {other_name} port? Use {other}://{url} "
        f"(or --protocol {other}), or the {name} port (`make serve`: HTTP 8000, gRPC 8001)"
    )


def explain_unreachable(url: str, protocol: str, error: BaseException) -> str:
    """One line for a server that could not be asked anything."""
    return wrong_protocol_message(url, protocol, error) or unavailable_message(url, protocol, describe_error(error))
