"""A server that answers rightly: a known photo classified as its label. What the
fault and hostile suites wait for after a kill, a crash or a flood."""

from __future__ import annotations

import time

from tritonstack.client.classifier import ClassifierClient
from tritonstack.client.retry import NO_RETRY
from tritonstack.samples.photos import photo_bytes
from tritonstack.serve.launcher import TritonServer


def classify_coffee(server: TritonServer) -> str:
    """The top-1 label of the coffee photo (espresso when the server is itself)."""
    with ClassifierClient(server.http_url, retry=NO_RETRY) as client:
        return client.classify([photo_bytes("coffee.png")], top_k=1)[0][0].label


def wait_until_it_answers(server: TritonServer, deadline: float) -> float:
    """Polls until the coffee photo is classified right; the time (time.monotonic) it was.
    Fails at `deadline` with the server's log tail."""
    while time.monotonic() < deadline:
        try:
            if classify_coffee(server) == "espresso":
                return time.monotonic()
        except Exception:  # refused connection, 503 while loading or healing: not back yet
            pass
        time.sleep(0.2)
    raise AssertionError(f"no right answer by the deadline:\n{server.log_tail()}")
