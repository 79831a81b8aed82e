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

but with none while the server has refused fewer than MIN_REFUSALS of the window's
requests (none at all once an overload has passed; a sparse refusal of a client sending
a request a second is no overload). Below capacity nothing is refused here: that takes
the server refusing more than 1 - 1/ratio of the requests. Past it, the requests that
reach the server settle at about `ratio` times what it accepts: a refusal made here
costs neither the upload of the image nor the server's work to take it in and refuse
it, and on a machine that the client shares with the server (or a server whose network
is its limit) that work is capacity. A request refused here fails at once, as the
server's refusal would, with ClientThrottledError, and is never retried.

The last rule is ours, for a client that lives through an overload: by the formula
alone the requests refused here keep counting against the server after the overload
has passed, and the share sent grows back by only `ratio` a window (at 1.25, five
windows from a third). With it a long-lived client sends everything again one window
after the server's last refusal.
"""

from __future__ import annotations

import collections
import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator

# What reaches an overloaded server: 1.25 times what it accepts (the SRE book's 2
# left 4 % less of a 2-core machine, shared by client and server, to the requests
# answered at 3x the capacity), over a window short enough that an overload is
# forgotten within seconds of its end (the book counts two minutes). Figures:
# docs/performance.md#client-side-throttling.
DEFAULT_RATIO = 1.25
WINDOW_S = 3.0
# Fewer of the server's refusals in a window is no overload, whatever their share.
MIN_REFUSALS = 3
BUCKETS_PER_WINDOW = 10


class ClientThrottledError(Exception):
    """Refused by the client itself: the server refused many of its recent requests."""

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
        # [start, requests, accepts, refused there], oldest first: the window's counts in buckets.
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
            requests, accepts, refused_there = self._counts()
            if random.random() < self.rejection_probability(requests, accepts, refused_there):
                self._bucket()[1] += 1  # a request, neither accepted nor refused there
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
                bucket[3] += not accepted

    def rejection_probability(self, requests: float, accepts: float, refused_there: float) -> float:
        """The SRE book's probability, and none while the server refused fewer than
        MIN_REFUSALS in the window: the requests refused here would otherwise keep counting
        against it after an overload, and the share sent grow back by only `ratio` a window."""
        if refused_there < MIN_REFUSALS:
            return 0.0
        return max(0.0, (requests - self.ratio * accepts) / (requests + 1))

    def _counts(self) -> tuple[float, float, float]:
        """The window's requests, accepts and requests the server refused."""
        horizon = self._clock() - self.window_s
        while self._buckets and self._buckets[0][0] < horizon:
            self._buckets.popleft()
        return tuple(sum(bucket[i] for bucket in self._buckets) for i in (1, 2, 3))

    def _bucket(self) -> list[float]:
        bucket_s = self.window_s / BUCKETS_PER_WINDOW
        start = self._clock() // bucket_s * bucket_s
        if not self._buckets or self._buckets[-1][0] != start:
            self._buckets.append([start, 0, 0, 0])
        return self._buckets[-1]
