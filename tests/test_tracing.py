"""OpenTelemetry traces: `tritonstack serve --trace-otlp URL` has tritonserver export
its traces over OTLP/HTTP; a loopback receiver decodes them with opentelemetry-proto.
Each traced request is one trace: the request's span, its ensemble's under it, each
step's under the ensemble's, every span naming its model."""

from __future__ import annotations

import pytest

from tritonstack.client.classifier import ClassifierClient
from tritonstack.commands import serve
from tritonstack.contract import DEFAULT_MODEL
from tritonstack.diagnostics.otlp_receiver import OtlpReceiver
from tritonstack.samples.photos import PHOTOS, photo_bytes
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import TRACE_SERVICE_NAME, ServerConfig, otlp_trace_flags
from tritonstack.serve.supervision import Supervision

STEPS = {"preprocess_dali_efficientnet_lite0", "efficientnet_lite0"}
REQUESTS = 3
# Export every 200 ms instead of Triton's 5 s batches: the test waits less.
QUICK_EXPORT = ("--trace-config=opentelemetry,bsp_schedule_delay=200",)


@pytest.fixture(scope="module")
def traced(lite0_repository):
    """A receiver, and a server tracing every request to it (rate 1)."""
    with OtlpReceiver() as receiver:
        config = ServerConfig(lite0_repository, trace_otlp_url=receiver.url, trace_rate=1, extra_args=QUICK_EXPORT)
        with TritonServer(config, Supervision(warmup_s=0)) as server:
            yield server, receiver


def ensemble_spans(spans) -> list:
    return [span for span in spans if span.attributes.get("triton.model_name") == DEFAULT_MODEL]


def _traced_with_parents(spans, count: int) -> bool:
    """`count` ensemble spans have arrived, and each one's parent: the request's span
    ends after the answer is sent, so Triton may export it in a later batch."""
    ensembles = ensemble_spans(spans)
    received = {span.span_id for span in spans}
    return len(ensembles) >= count and all(span.parent_span_id in received for span in ensembles)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_each_request_is_a_trace_of_its_ensemble_and_steps(traced, protocol):
    server, receiver = traced
    already = len(ensemble_spans(receiver.spans))
    url = server.grpc_url if protocol == "grpc" else server.http_url
    with ClassifierClient(url, protocol, DEFAULT_MODEL) as client:
        for _ in range(REQUESTS):
            assert client.classify([photo_bytes("coffee.png")], top_k=1)[0][0].label in PHOTOS["coffee.png"]
    spans = receiver.wait_for_spans(lambda spans: _traced_with_parents(spans, already + REQUESTS), timeout_s=30)
    ensembles = ensemble_spans(spans)[already:]
    assert len(ensembles) == REQUESTS, f"{len(ensembles)} ensemble spans received"
    by_id = {span.span_id: span for span in spans}
    for ensemble in ensembles:
        trace = [span for span in spans if span.trace_id == ensemble.trace_id]
        steps = [span for span in trace if span.parent_span_id == ensemble.span_id]
        assert {span.attributes["triton.model_name"] for span in steps} == STEPS, [s.name for s in trace]
        # The request's own span (the protocol's receive and send) holds the ensemble's.
        root = by_id[ensemble.parent_span_id]
        assert root.parent_span_id == "" and root.start_ns <= ensemble.start_ns <= ensemble.end_ns <= root.end_ns
        for step in steps:
            assert ensemble.start_ns <= step.start_ns <= step.end_ns <= ensemble.end_ns
            assert "QUEUE_START" in step.events
        assert {span.service for span in trace} == {TRACE_SERVICE_NAME}


def test_serve_traces_to_the_url_at_the_rate_asked(model_repository):
    args = serve.parser().parse_args(["--trace-otlp", "http://127.0.0.1:4318/v1/traces", "--trace-rate", "50"])
    config = serve.serve_options(args).config
    assert (config.trace_otlp_url, config.trace_rate) == ("http://127.0.0.1:4318/v1/traces", 50)
    rendered = config.args(model_repository, lambda flag: False)
    assert otlp_trace_flags("http://127.0.0.1:4318/v1/traces", 50) == [a for a in rendered if a.startswith("--trace")]
    untraced = serve.serve_options(serve.parser().parse_args([])).config.args(model_repository, lambda flag: False)
    assert not any(arg.startswith("--trace") for arg in untraced)


def test_serve_refuses_an_endpoint_that_is_not_a_url(capsys):
    assert serve.main(["--trace-otlp", "127.0.0.1:4318"]) == 2
    assert "must be an http:// or https:// URL" in capsys.readouterr().err
