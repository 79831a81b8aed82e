"""A loopback OTLP/HTTP trace receiver: what an OpenTelemetry collector would get from
tritonserver (`tritonstack serve --trace-otlp URL`), decoded with the opentelemetry-proto
package.

    with OtlpReceiver() as receiver:             # http://127.0.0.1:<free port>/v1/traces
        ...                                      # a server exporting to receiver.url
        spans = receiver.wait_for_spans(lambda spans: len(spans) >= 3, timeout_s=10)

OTLP/HTTP carries an ExportTraceServiceRequest as protobuf (application/x-protobuf)
or as its JSON mapping (application/json: what Triton 2.51's exporter sends); both are
read into the opentelemetry-proto message, anything else is answered 415. Bounded: it
keeps at most `max_spans`.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tritonstack.serve.network import LOOPBACK

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"


@dataclass(frozen=True)
class Span:
    """One received span, with the attributes a test or a reader needs."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: dict = field(default_factory=dict)
    events: tuple[str, ...] = ()
    service: str = ""

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(any_value) -> object:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _ids_as_base64(message: dict) -> dict:
    """OTLP's JSON mapping writes trace and span ids in hex where protobuf's JSON
    mapping of bytes is base64 (opentelemetry-proto's specification, "JSON Protobuf
    Encoding"): rewrite them so that protobuf's own parser reads them."""
    for resource_spans in message.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return message


def decode(body: bytes, content_type: str = PROTOBUF) -> list[Span]:
    request = ExportTraceServiceRequest()
    if content_type.startswith(JSON):
        json_format.ParseDict(_ids_as_base64(json.loads(body)), request, ignore_unknown_fields=True)
    else:
        request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    Span(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        name=span.name,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        events=tuple(event.name for event in span.events),
                        service=str(resource.get("service.name", "")),
                    )
                )
    return spans


class OtlpReceiver:
    def __init__(self, host: str = LOOPBACK, port: int = 0, max_spans: int = 100_000):
        self.max_spans = max_spans
        self.spans: list[Span] = []
        self.requests = 0
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                content_type = self.headers.get("Content-Type", "")
                if self.path != TRACES_PATH or not content_type.startswith((PROTOBUF, JSON)):
                    self.send_error(415 if self.path == TRACES_PATH else 404)
                    return
                receiver.add(decode(body, content_type))
                response = ExportTraceServiceResponse()
                as_json = content_type.startswith(JSON)
                answer = json_format.MessageToJson(response).encode() if as_json else response.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", JSON if as_json else PROTOBUF)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):  # quiet: a test's output is its own
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}{TRACES_PATH}"

    def add(self, spans: list[Span]) -> None:
        with self._changed:
            self.requests += 1
            self.spans.extend(spans[: max(0, self.max_spans - len(self.spans))])
            self._changed.notify_all()

    def wait_for_spans(self, enough: Callable[[list[Span]], bool], timeout_s: float) -> list[Span]:
        """The spans received once `enough(spans)` holds, or all of them at the timeout."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not enough(self.spans) and time.monotonic() < deadline:
                self._changed.wait(timeout=max(0.0, deadline - time.monotonic()))
            return list(self.spans)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
