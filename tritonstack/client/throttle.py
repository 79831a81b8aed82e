"""Client-side throttling: a client that the server keeps refusing refuses some of its
own requests before sending them (the SRE book, "Handling Overload": adaptive
throttling).

    throttle = AdaptiveThrottle()
    with throttle.admitted(is_overloaded):   # raises ClientThrottledError, or:
        answer = send(request)              # an error that is_overloaded() counts against the server

Over the last `window_s` seconds the client counts the requests that ended (refused here,
or sent and answered) and those the server accepted (answered, rather than refused as
overloaded), and refuses a new request itself with probability

    max(0, (requests - ratio * accepts) / (requests + 1))

Below capacity nothing is refused here: that takes the server refusing more than
1 - 1/ratio of the requests. Past it, the requests that reach the server settle at
about `ratio` times what it accepts: a refusal made here costs neither the upload of
the image nor the server's work to take it in and refuse it, and on a machine that the
client shares with the server (or a server whose network is its limit) that work is
capacity. A request refused here fails at once, as the server's refusal would, with
ClientThrottledError, and is never retried.
"""

from __future__ import annotations

import collections
import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator

# The SRE book's multiplier: the server gets up to twice what it accepts. Lower is
# more aggressive (docs/performance.md#client-side-throttling has the figures).
DEFAULT_RATIO = 2.0
WINDOW_S = 10.0
_BUCKET_S = 1.0


class ClientThrottledError(Exception):
    """Refused by the client itself: the server refused most of its recent requests."""

    def __init__(self, requests: int, accepts: int):
        self.requests, self.accepts = requests, accepts
        super().__init__(
            f"refused by this client before sending: the server accepted {accepts} of its last {requests} "
            "requests (overloaded); client-side throttling, retry later with backoff or add capacity"
        )


class AdaptiveThrottle:
    """One client's adaptive throttle, shared by its threads or tasks; `ratio` 0 turns
    it off."""

    def __init__(self, ratio: float = DEFAULT_RATIO, window_s: float = WINDOW_S, clock=time.monotonic):
        if ratio < 0:
            raise ValueError(f"the throttle's ratio must be >= 0 (0: off), not {ratio}")
        self.ratio, self.window_s, self._clock = ratio, window_s, clock
        # (second, requests, accepts), oldest first: the counts of the window in buckets.
        self._buckets: collections.deque[list[float]] = collections.deque()
        self.refused = 0  # refused here so far, for a caller's report
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def admitted(self, overloaded: Callable[[BaseException], bool]) -> Iterator[None]:
        """Around one request: refuses it (ClientThrottledError), or counts what the
        server did with it: accepted, unless it raised an error `overloaded` says
        is the server's refusal (or no answer in time)."""
        self.admit()
        try:
            yield
        except Exception as error:
            self.record(accepted=not overloaded(error))
            raise
        self.record(accepted=True)

    def admit(self) -> None:
        """Refuse a request about to be sent (ClientThrottledError), or let it go."""
        if not self.ratio:
            return
        with self._lock:
            requests, accepts = self._counts()
            if random.random() < self.rejection_probability(requests, accepts):
                self._bucket()[1] += 1  # a request, and not accepted
                self.refused += 1
                raise ClientThrottledError(int(requests), int(accepts))

    def record(self, accepted: bool) -> None:
        """What the server did with an admitted request: accepted it (an answer, or
        an error about the request itself), or refused it as overloaded. A request
        counts once it has ended: requests still in flight (at a client's start, all of
        them) are neither refused nor accepted yet."""
        if self.ratio:
            with self._lock:
                bucket = self._bucket()
                bucket[1] += 1
                bucket[2] += accepted

    def rejection_probability(self, requests: float, accepts: float) -> float:
        return max(0.0, (requests - self.ratio * accepts) / (requests + 1))

    def _counts(self) -> tuple[float, float]:
        horizon = self._clock() - self.window_s
        while self._buckets and self._buckets[0][0] < horizon:
            self._buckets.popleft()
        return sum(b[1] for b in self._buckets), sum(b[2] for b in self._buckets)

    def _bucket(self) -> list[float]:
        second = self._clock() // _BUCKET_S * _BUCKET_S
        if not self._buckets or self._buckets[-1][0] != second:
            self._buckets.append([second, 0, 0])
        return self._buckets[-1]
