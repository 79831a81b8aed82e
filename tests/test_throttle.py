"""The client-side throttle (the SRE book's adaptive throttling): nothing is refused
while the server accepts, a client the server keeps refusing sends about `ratio` times
what it accepts, a request refused here never runs and is never retried, and the
window forgets an overload that has passed. A clock the test moves; no server (the
clients' throttle under a real server is in test_overload.py)."""

from __future__ import annotations

import random

import pytest
from tritonclient.utils import InferenceServerException

from tritonstack.client.protocol import worth_splitting
from tritonstack.client.retry import (
    QUEUE_FULL,
    RetryPolicy,
    RetryThrottle,
    describe_error,
    is_overloaded,
    is_refusal,
    is_retryable,
)
from tritonstack.client.throttle import WINDOW_S, AdaptiveThrottle, ClientThrottledError


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def server_refusal() -> InferenceServerException:
    return InferenceServerException(f"{QUEUE_FULL} (model 'x')", status="StatusCode.UNAVAILABLE")


def send(throttle: AdaptiveThrottle, server_accepts: bool) -> str:
    """One request through the throttle: "throttled", "accepted" or "refused"."""
    try:
        with throttle.admitted(is_overloaded):
            if not server_accepts:
                raise server_refusal()
    except ClientThrottledError:
        return "throttled"
    except InferenceServerException:
        return "refused"
    return "accepted"


def test_nothing_is_refused_here_while_the_server_accepts():
    throttle = AdaptiveThrottle(clock=Clock())
    assert {send(throttle, server_accepts=True) for _ in range(1000)} == {"accepted"}
    assert throttle.refused == 0


def test_a_sparse_refusal_does_not_throttle_a_slow_client():
    """A request a second, every third refused (a stall, a recycled stub): the window
    holds one refusal at a time, no overload. Ten a second, all refused, is one."""
    clock = Clock()
    throttle = AdaptiveThrottle(clock=clock)
    outcomes = []
    for second in range(60):
        clock.now += 1.0
        outcomes.append(send(throttle, server_accepts=second % 3 != 0))
    assert "throttled" not in outcomes
    outcomes = []
    for _ in range(600):
        clock.now += 0.1
        outcomes.append(send(throttle, server_accepts=False))
    assert outcomes.count("throttled") > 300


def test_requests_in_flight_are_not_held_against_the_server():
    """A client's first requests, all sent before any answer (a closed loop of 16, an
    open loop's first second): none is refused here, however many are in flight."""
    throttle = AdaptiveThrottle(clock=Clock())
    for _ in range(1000):
        throttle.admit()  # sent; no answer yet
    assert throttle.refused == 0


def test_the_server_that_refuses_most_gets_about_ratio_times_what_it_accepts():
    """A server that takes 100 requests/s and refuses the rest, offered 400/s: with
    ratio 2, what reaches it settles at about twice what it accepts, and the client
    keeps more than 40 % of the requests to itself (the server here has no queue, so
    it accepts less than its capacity)."""
    random.seed(1)
    clock = Clock()
    throttle = AdaptiveThrottle(ratio=2.0, clock=clock)
    reached = accepted = 0
    free_at = clock.now
    for _ in range(8000):  # 20 s
        clock.now += 0.0025
        accepts = clock.now >= free_at
        outcome = send(throttle, server_accepts=accepts)
        if outcome == "accepted":
            free_at = clock.now + 0.01
        reached += outcome != "throttled"
        accepted += outcome == "accepted"
    assert 1.7 < reached / accepted < 2.4, (reached, accepted)
    assert throttle.refused / 8000 > 0.4, throttle.refused  # kept here: neither sent nor refused there


def test_an_overload_that_passed_is_forgotten():
    clock = Clock()
    throttle = AdaptiveThrottle(clock=clock)
    for _ in range(200):
        send(throttle, server_accepts=False)
    assert throttle.rejection_probability(*throttle._counts()) > 0.9
    clock.now += WINDOW_S + 1.5
    assert {send(throttle, server_accepts=True) for _ in range(100)} == {"accepted"}


def test_a_client_stops_refusing_itself_a_window_after_the_server_last_refused():
    """The default throttle, offered 300 requests/s by a server that takes 100/s for
    10 s, then 50/s that it takes all of: a long-lived client sends everything again
    once the server's last refusal has left the window. By the SRE book's formula alone
    the requests refused here would keep counting against the server, and the share
    sent would grow back by only `ratio` a window (ratio 1.25: about 15 s here, and half
    of the requests after the overload kept to itself, against about an eighth with it)."""
    random.seed(2)
    clock = Clock()
    throttle = AdaptiveThrottle(clock=clock)
    free_at = clock.now
    for _ in range(3000):  # 10 s at 300/s against 100/s
        clock.now += 1 / 300
        if send(throttle, server_accepts=clock.now >= free_at) == "accepted":
            free_at = clock.now + 0.01
    assert throttle.refused > 1500  # it was throttling
    ended = clock.now
    after = []
    for _ in range(1000):  # 20 s at 50/s, all accepted
        clock.now += 1 / 50
        after.append((clock.now - ended, send(throttle, server_accepts=True)))
    throttled = [t for t, outcome in after if outcome == "throttled"]
    assert throttled, "nothing throttled right after the overload: the test no longer tests recovery"
    assert max(throttled) < WINDOW_S + 0.05, throttled[-5:]


def test_a_request_refused_here_never_runs_and_is_not_retried():
    clock = Clock()
    throttle = AdaptiveThrottle(clock=clock)
    for _ in range(50):
        send(throttle, server_accepts=False)
    ran = 0
    refused = []
    for _ in range(50):
        try:
            with throttle.admitted(is_overloaded):
                ran += 1
        except ClientThrottledError as error:
            refused.append(error)
    assert len(refused) > 25 and ran + len(refused) == 50
    error = refused[0]
    assert is_refusal(error) and is_overloaded(error) and not is_retryable(error)
    assert "refused by this client" in describe_error(error) and "retry later" in describe_error(error)
    assert not worth_splitting(error, batch_size=4)  # no image of it is to blame
    calls = []

    def attempt():
        calls.append(1)
        raise error

    with pytest.raises(ClientThrottledError):
        RetryPolicy(retries=3, base_delay_s=0.001, max_delay_s=0.002).call(attempt, throttle=RetryThrottle())
    assert len(calls) == 1


def test_errors_about_the_request_itself_count_as_accepted():
    """A bad image is the request's fault, not an overload: it does not throttle."""
    throttle = AdaptiveThrottle(clock=Clock())
    for _ in range(100):
        with pytest.raises(InferenceServerException):
            with throttle.admitted(is_overloaded):
                raise InferenceServerException("unable to decode the image", status="StatusCode.INVALID_ARGUMENT")
    assert throttle.rejection_probability(*throttle._counts()) == 0.0


def test_ratio_zero_turns_it_off_and_a_negative_ratio_is_refused():
    throttle = AdaptiveThrottle(ratio=0, clock=Clock())
    assert {send(throttle, server_accepts=False) for _ in range(200)} == {"refused"}
    with pytest.raises(ValueError, match="ratio must be >= 0"):
        AdaptiveThrottle(ratio=-1)
