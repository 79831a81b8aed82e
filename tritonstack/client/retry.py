"""When to call Triton again, and how long to wait first.

Only a server that cannot answer right now is worth a second try: connection
refused or reset (restart, crash) and UNAVAILABLE (HTTP 503, gRPC UNAVAILABLE;
gRPC CANCELLED from a server shutting down).
A request the server rejected (HTTP 4xx, gRPC INVALID_ARGUMENT, NOT_FOUND, or
UNKNOWN from an undecodable image) fails the same way every time, and a timed-out
request may still be running: neither is retried.

Clients do not amplify an overload (the SRE book's "Handling Overload"):
- a refusal by a queue that is full (Triton's queue policy, written by
  `tritonstack build`) is retried only within a retry budget, gRPC's retry
  throttling (`RetryThrottle`): at most about one retry per ten requests that
  succeed, none while refusals outnumber that;
- a request whose deadline passed ("Request timeout expired" from the server, or
  the client's own deadline) is never retried, and no retry starts that could not
  finish before the caller's deadline;
- waits grow exponentially with jitter, so that clients refused together do not
  come back together;
- a client that the server keeps refusing refuses some requests itself, before
  sending them (tritonstack.client.throttle).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError
from tritonclient.utils import InferenceServerException

from tritonstack import cli
from tritonstack.client.throttle import ClientThrottledError
from tritonstack.contract import BATCH_PRIORITY

T = TypeVar("T")

# InferenceServerException.status(): "503" over HTTP, "StatusCode.UNAVAILABLE" over gRPC.
# CANCELLED too: a server shutting down cancels the gRPC calls it still holds (as one
# killed after its grace does); this client never cancels its
# own calls (its timeouts are DEADLINE_EXCEEDED), and classifying again is harmless.
_UNAVAILABLE = {"503", "StatusCode.UNAVAILABLE", "StatusCode.CANCELLED"}
_TIMED_OUT = {"StatusCode.DEADLINE_EXCEEDED"}
# A known model with no version loaded right now: a server shutting down (it
# unloads models first) or a model being reloaded. Triton says NOT_FOUND / 400,
# but the same request succeeds once the model is back. (An unknown model name
# reads "... is not found" instead, and is not retried.)
_MODEL_BETWEEN_VERSIONS = "has no available versions"
# Triton's queue policy (dynamic_batching.default_queue_policy): a full queue, and a
# request that waited past its timeout. Both arrive as HTTP 503 / gRPC UNAVAILABLE.
QUEUE_FULL = "Exceeds maximum queue size"
DEADLINE_EXPIRED = "Request timeout expired"
# Triton's answer to an admin call without the launcher's key (tritonstack.serve.security).
_RESTRICTED = "This protocol is restricted"
# What gRPC says when the port answers HTTP/1 (Triton's HTTP port): a wrong port
# does not heal, so it is not retried.
_GRPC_ON_HTTP_PORT = "Failed parsing HTTP/2"
# Triton 2.51 refuses (an INTERNAL error) to unregister a shared-memory region
# that a request still holds, and a request lets go of its regions only a moment
# after its answer reached the client: on a busy server 1 unregister in 20 to 100 sent
# right after an answer was refused, and accepted again a few ms later.
_REGION_IN_USE = "it is currently in use"


class ServerUnavailableError(ConnectionError):
    """No Triton server answers at the address, or it is not ready."""


def is_refusal(error: BaseException) -> bool:
    """Refused at once, by a full queue or by the client's own throttle: the server is
    overloaded, try later (within a budget)."""
    if isinstance(error, ClientThrottledError):
        return True
    return isinstance(error, InferenceServerException) and QUEUE_FULL in str(error.message())


def is_expired(error: BaseException) -> bool:
    """The request's own timeout passed while it waited in the server's queue."""
    return isinstance(error, InferenceServerException) and DEADLINE_EXPIRED in str(error.message())


def is_retryable(error: BaseException) -> bool:
    if isinstance(error, InferenceServerException):
        message = str(error.message())
        if _RESTRICTED in message or _GRPC_ON_HTTP_PORT in message:  # UNAVAILABLE, but it will not change
            return False
        if DEADLINE_EXPIRED in message:  # its deadline passed: an answer now is no use
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


def is_region_in_use(error: BaseException) -> bool:
    """The server refused to unregister a region that a request still holds: soon
    released (a request just answered), or when a request given up on ends."""
    return isinstance(error, InferenceServerException) and _REGION_IN_USE in str(error.message())


def is_worth_releasing_again(error: BaseException) -> bool:
    """An unregister on close: worth another try while the server holds the region or
    cannot answer right now."""
    return is_region_in_use(error) or is_retryable(error)


def is_overloaded(error: BaseException) -> bool:
    """The server did not take the request in time: refused, expired in its queue, or
    no answer by the deadline (what the client-side throttle counts against it)."""
    return is_refusal(error) or is_timeout(error)


def is_timeout(error: BaseException) -> bool:
    """The deadline passed: at the client, or in the server's queue."""
    if isinstance(error, InferenceServerException):
        return str(error.status()) in _TIMED_OUT or is_expired(error)
    return isinstance(error, (TimeoutError, asyncio.TimeoutError, aiohttp.ServerTimeoutError))


def describe_error(error: BaseException, timeout_s: float | None = None) -> str:
    """One line that says what went wrong, for a result line or a log."""
    if is_expired(error):
        return (
            "refused: it waited in the server's queue past the server's latency objective or its own timeout "
            "(the server is overloaded); retry later with backoff, send it as a batch request (priority "
            f"{BATCH_PRIORITY}) if it can wait, or add capacity"
        )
    if is_timeout(error):
        return f"timed out after {timeout_s:g} s" if timeout_s else "timed out"
    if isinstance(error, ClientThrottledError):
        return str(error)
    if is_refusal(error):
        return (
            "refused at once: the server's queue is full (overloaded); retry later with backoff, "
            "or add capacity (more replicas)"
        )
    if isinstance(error, InferenceServerException):
        message = " ".join((error.message() or "").split())
        return f"{error.status()}: {message}" if error.status() else message
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class RetryThrottle:
    """A client's retry budget, gRPC's retry throttling (gRFC A6): a bucket of
    `max_tokens` tokens; a success adds `token_ratio`, a refusal takes one away, and a
    refused request is retried only while more than half the bucket is left. Under a
    steady overload the bucket empties after a few refusals and refills by successes
    only: at most about one retry per 1 / `token_ratio` successes (10 % more load).
    Thread-safe: one throttle per client, shared by its threads or tasks."""

    def __init__(self, max_tokens: float = 10.0, token_ratio: float = 0.1):
        self.max_tokens, self.token_ratio = max_tokens, token_ratio
        self.tokens = max_tokens
        self.retries = 0  # spent so far, for a caller's report
        self._lock = threading.Lock()

    def on_success(self) -> None:
        with self._lock:
            self.tokens = min(self.max_tokens, self.tokens + self.token_ratio)

    def allows_retry(self) -> bool:
        """Take the refusal into account; whether a retry may be sent."""
        with self._lock:
            self.tokens = max(0.0, self.tokens - 1)
            allowed = self.tokens > self.max_tokens / 2
            self.retries += allowed
            return allowed


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter: the n-th wait is drawn from
    [d/2, d] with d = min(max_delay_s, base_delay_s * 2**n), so clients that
    failed together do not all come back at the same instant.

    `call` and `acall` take a RetryThrottle (refusals by a full queue are retried
    only within its budget) and a deadline (time.monotonic()): no retry starts whose
    wait would end past it. `retry_if` says which errors are worth another try
    (by default those of a server that cannot answer right now)."""

    retries: int = cli.option(
        3,
        "--retries",
        type=cli.non_negative_int,
        metavar="N",
        help="retries when the server is unreachable or unavailable (backoff with jitter)",
    )
    base_delay_s: float = 0.25
    max_delay_s: float = 4.0

    def delays(self) -> Iterator[float]:
        for attempt in range(self.retries):
            ceiling = min(self.max_delay_s, self.base_delay_s * 2**attempt)
            yield random.uniform(ceiling / 2, ceiling)

    def call(
        self,
        attempt: Callable[[], T],
        on_retry: Callable[[BaseException], None] | None = None,
        throttle: RetryThrottle | None = None,
        deadline: float | None = None,
        retry_if: Callable[[BaseException], bool] = is_retryable,
    ) -> T:
        for delay in self.delays():
            try:
                return _succeeded(attempt(), throttle)
            except Exception as error:
                if not _worth_retrying(error, delay, throttle, deadline, retry_if):
                    raise
                if on_retry:
                    on_retry(error)
            time.sleep(delay)
        return _succeeded(attempt(), throttle)

    async def acall(
        self,
        attempt: Callable[[], Awaitable[T]],
        on_retry: Callable[[BaseException], None] | None = None,
        throttle: RetryThrottle | None = None,
        deadline: float | None = None,
        retry_if: Callable[[BaseException], bool] = is_retryable,
    ) -> T:
        for delay in self.delays():
            try:
                return _succeeded(await attempt(), throttle)
            except Exception as error:
                if not _worth_retrying(error, delay, throttle, deadline, retry_if):
                    raise
                if on_retry:
                    on_retry(error)
            await asyncio.sleep(delay)
        return _succeeded(await attempt(), throttle)


def _succeeded(result: T, throttle: RetryThrottle | None) -> T:
    if throttle is not None:
        throttle.on_success()
    return result


def _worth_retrying(
    error: BaseException,
    delay: float,
    throttle: RetryThrottle | None,
    deadline: float | None,
    retry_if: Callable[[BaseException], bool],
) -> bool:
    if not retry_if(error):
        return False
    if deadline is not None and time.monotonic() + delay >= deadline:
        return False  # the answer would come after the caller stopped waiting
    return throttle is None or not is_refusal(error) or throttle.allows_retry()


NO_RETRY = RetryPolicy(retries=0)

# Unregistering a shared-memory region: soon again while a request still holds it (a
# few ms after its answer), for 3 to 6 s in all, about what a request given up on
# just before needs to end. Whatever the client's own policy: a region left
# registered keeps its memory mapped in the server.
RELEASE_RETRY = RetryPolicy(retries=12, base_delay_s=0.01, max_delay_s=1.0)


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
