"""The client's retry policy: what is retried (UNAVAILABLE / 503, a model between
versions, a connection refused), what is not (timeouts, rejected requests), and the
backoff schedule. The model-between-versions and timeout cases run against a real
tritonserver; the status classes use tritonclient's own exception type."""

from __future__ import annotations

import random

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import repo_factory as rf
from tritonstack.client.retry import RetryPolicy, is_retryable, is_timeout
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import ServerConfig

MODEL = "retry_identity"
QUICK = RetryPolicy(retries=4, base_delay_s=0.01, max_delay_s=0.05)


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    repository = tmp_path_factory.mktemp("retry")
    rf.write_model(repository, rf.identity_config(MODEL), {"model.dali": rf.serialized(rf.identity_pipeline)})
    with TritonServer(ServerConfig(repository, restricted_apis=())) as running:
        yield running


def identity_http(client, data):
    return rf.infer_http(client, MODEL, {"DALI_INPUT_0": data}, ["DALI_OUTPUT_0"]).as_numpy("DALI_OUTPUT_0")


def test_backoff_schedule_doubles_to_the_ceiling_with_jitter():
    policy = RetryPolicy(retries=6, base_delay_s=0.25, max_delay_s=4.0)
    ceilings = [0.25, 0.5, 1.0, 2.0, 4.0, 4.0]
    random.seed(0)
    draws = [list(policy.delays()) for _ in range(300)]
    assert all(len(delays) == 6 for delays in draws)
    for attempt, ceiling in enumerate(ceilings):
        column = [delays[attempt] for delays in draws]
        assert all(ceiling / 2 <= delay <= ceiling for delay in column), (attempt, min(column), max(column))
        # Jitter spreads the waits over the whole [ceiling/2, ceiling] range.
        assert min(column) < ceiling * 0.55 and max(column) > ceiling * 0.95, (attempt, min(column), max(column))


@pytest.mark.parametrize("status", ["503", "StatusCode.UNAVAILABLE", "StatusCode.CANCELLED"])
def test_unavailable_is_retried_until_it_succeeds(status):
    failures = [InferenceServerException("Server is not ready", status=status)] * 2
    retried = []

    def attempt():
        if failures:
            raise failures.pop()
        return "answered"

    assert QUICK.call(attempt, on_retry=retried.append) == "answered"
    assert len(retried) == 2 and all(is_retryable(error) for error in retried)


@pytest.mark.parametrize(
    "status", ["400", "StatusCode.INVALID_ARGUMENT", "StatusCode.UNKNOWN", "StatusCode.DEADLINE_EXCEEDED"]
)
def test_rejections_and_timeouts_are_raised_at_once(status):
    calls = []

    def attempt():
        calls.append(1)
        raise InferenceServerException("refused", status=status)

    with pytest.raises(InferenceServerException):
        QUICK.call(attempt)
    assert len(calls) == 1


def test_retries_exhausted_raise_the_last_error():
    calls = []

    def attempt():
        calls.append(1)
        raise InferenceServerException("Server is not ready", status="503")

    with pytest.raises(InferenceServerException):
        QUICK.call(attempt)
    assert len(calls) == QUICK.retries + 1


def test_a_model_between_versions_is_retried_until_it_is_back(triton):
    client = httpclient.InferenceServerClient(triton.http_url)
    data = np.arange(6, dtype=np.uint8)[None]
    try:
        client.unload_model(MODEL)
        retried = []

        def reload_on_retry(error):
            retried.append(error)
            client.load_model(MODEL)  # the model comes back while the client waits

        result = QUICK.call(lambda: identity_http(client, data), on_retry=reload_on_retry)
    finally:
        client.load_model(MODEL)
        client.close()
    np.testing.assert_array_equal(result, data)
    assert len(retried) == 1, retried
    assert "has no available versions" in retried[0].message(), retried[0].message()


def test_an_unknown_model_is_not_retried(triton):
    client = httpclient.InferenceServerClient(triton.http_url)
    calls = []

    def attempt():
        calls.append(1)
        return rf.infer_http(client, "no_such_model", {"DALI_INPUT_0": np.zeros((1, 1), np.uint8)}, ["X"])

    try:
        with pytest.raises(InferenceServerException) as failure:
            QUICK.call(attempt)
    finally:
        client.close()
    assert len(calls) == 1 and "not found" in failure.value.message(), failure.value


def test_timed_out_requests_are_not_retried(triton):
    """A timed-out request may still run on the server: sending it again could
    run it twice. Both protocols, a real deadline that cannot be met."""
    data = np.zeros((1, 4_000_000), np.uint8)
    calls = []
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        tensor = grpcclient.InferInput("DALI_INPUT_0", list(data.shape), "UINT8")
        tensor.set_data_from_numpy(data)

        def grpc_attempt():
            calls.append("grpc")
            return client.infer(MODEL, [tensor], client_timeout=0.000_001)

        with pytest.raises(InferenceServerException) as failure:
            QUICK.call(grpc_attempt)
    assert failure.value.status() == "StatusCode.DEADLINE_EXCEEDED", failure.value

    client = httpclient.InferenceServerClient(triton.http_url, network_timeout=0.000_001)
    try:

        def http_attempt():
            calls.append("http")
            return identity_http(client, data)

        with pytest.raises(Exception) as http_failure:
            QUICK.call(http_attempt)
    finally:
        client.close()
    assert is_timeout(http_failure.value) and not is_retryable(http_failure.value), repr(http_failure.value)
    assert calls == ["grpc", "http"]
