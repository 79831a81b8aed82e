"""An open loop of Poisson arrivals in which every request has a deadline, sent by our
client (the deadline also sent as Triton's `timeout`) or by Triton's stock asyncio clients
(only a client-side timeout), and how each request ended (`Outcomes`). What `tritonstack
overload` and its soak (tritonstack.experiments.goodput, .overload_soak) load the server with."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio

from tritonstack.client.aio import AsyncClassifierClient
from tritonstack.client.retry import NO_RETRY, is_expired, is_refusal, is_timeout
from tritonstack.client.throttle import ClientThrottledError
from tritonstack.contract import ENSEMBLE_INPUT, pad_batch


@dataclass
class Outcomes:
    """How the requests of one open loop ended; latencies from the scheduled send."""

    deadline_s: float
    answered_s: list[float] = field(default_factory=list)  # every answer, in time or late
    refused_by_server_s: list[float] = field(default_factory=list)  # before the deadline
    refused_by_client: int = 0  # our client's throttle: never sent, refused at once
    gave_up: int = 0  # no answer, nor refusal, before the deadline: the client stopped waiting
    failed: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # a few kinds, for the report

    @property
    def in_time(self) -> int:
        return sum(latency <= self.deadline_s for latency in self.answered_s)

    @property
    def late(self) -> int:
        """No answer before the deadline: an answer after it, or none at all."""
        return len(self.answered_s) - self.in_time + self.gave_up

    @property
    def sent(self) -> int:
        """Every request the loop made, our client's self-refusals included."""
        refused = len(self.refused_by_server_s) + self.refused_by_client
        return len(self.answered_s) + refused + self.gave_up + self.failed

    def record(self, latency_s: float, error: BaseException | None) -> None:
        if error is None:
            self.answered_s.append(latency_s)
        elif isinstance(error, ClientThrottledError):
            self.refused_by_client += 1
        elif (is_refusal(error) or is_expired(error)) and latency_s <= self.deadline_s:
            self.refused_by_server_s.append(latency_s)
        elif is_refusal(error) or is_expired(error) or is_timeout(error):
            self.gave_up += 1  # a refusal after the deadline reaches nobody who still waits
        else:
            self.failed += 1
            kind = f"{type(error).__name__}: {str(error)[:80]}"
            self.failures[kind] = self.failures.get(kind, 0) + 1


def poisson_offsets(rate: float, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Send times (seconds from the start) of Poisson arrivals at `rate` for `seconds`."""
    gaps = rng.exponential(1 / rate, max(int(rate * seconds), 1))
    return np.cumsum(gaps) - gaps[0]


async def on_schedule(offsets: np.ndarray, request) -> float:
    """Starts `request(index, scheduled)` at each offset from now (loop.time()), an
    open loop: a late answer delays no later send. Waits for them all; returns the
    loop's time of the last send."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    for index, offset in enumerate(offsets):
        scheduled = start + float(offset)
        await asyncio.sleep(max(0.0, scheduled - loop.time()))
        tasks.append(asyncio.create_task(request(index, scheduled)))
    last_send = loop.time()
    await asyncio.gather(*tasks)
    return last_send


async def deadline_open_loop(
    url: str,
    protocol: str,
    model: str,
    images: list[bytes],
    rate: float,
    seconds: float,
    deadline_s: float,
    seed: int,
    clients: str = "ours",
) -> tuple[Outcomes, float]:
    """Poisson arrivals at `rate` for `seconds`, each request with `deadline_s`; the
    outcomes and the loop's time of the last send (loop.time())."""
    outcomes = Outcomes(deadline_s)
    offsets = poisson_offsets(rate, seconds, np.random.default_rng(seed))
    opener = stock_client if clients == "stock" else our_client
    async with opener(url, protocol, model, deadline_s, in_flight_bound(rate, deadline_s)) as classify:
        loop = asyncio.get_running_loop()

        async def one(index: int, scheduled: float) -> None:
            error = None
            try:
                await asyncio.wait_for(classify(images[index % len(images)]), deadline_s + 0.5)
            except Exception as raised:  # every outcome is counted, none raised
                error = raised
            outcomes.record(loop.time() - scheduled, error)

        last_send = await on_schedule(offsets, one)
    return outcomes, last_send


@contextlib.asynccontextmanager
async def our_client(url: str, protocol: str, model: str, deadline_s: float, connections: int):
    """The project's client: the deadline goes to the server as the request's timeout too."""
    async with AsyncClassifierClient(
        url, protocol, model, retry=NO_RETRY, timeout_s=deadline_s, max_connections=connections
    ) as client:
        yield lambda image: client.probabilities([image])


@contextlib.asynccontextmanager
async def stock_client(url: str, protocol: str, model: str, deadline_s: float, connections: int):
    """Triton's own asyncio clients as a user calls them: the deadline is the client's
    alone (gRPC `client_timeout`, the HTTP session's total timeout), never sent as
    Triton's `timeout` parameter."""
    if protocol == "grpc":
        client = grpcaio.InferenceServerClient(url)
        call = functools.partial(client.infer, client_timeout=deadline_s)
        make_input = grpcaio.InferInput
    else:
        client = httpaio.InferenceServerClient(url, conn_limit=connections, conn_timeout=deadline_s)
        call, make_input = client.infer, httpaio.InferInput

    async def classify(image: bytes):
        batch = pad_batch([image])
        tensor = make_input(ENSEMBLE_INPUT, list(batch.shape), "UINT8")
        tensor.set_data_from_numpy(batch)
        return await call(model, [tensor])

    try:
        yield classify
    finally:
        await client.close()


def in_flight_bound(rate: float, wait_s: float) -> int:
    """Connections an open loop may need: every request in flight its own (HTTP)."""
    return int(rate * wait_s * 2) + 16
