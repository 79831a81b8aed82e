"""Readiness that tells the truth, on a port of the launcher's own (`--health-port`).

Triton 2.51's `/v2/health/ready` stays 200 while a step's stub is dead or hung (every
request to it failing), and again once a model was unloaded (an explicitly unloaded
model does not count): a load balancer or a Kubernetes Service keeps sending such a
server traffic it can only fail. The launcher knows more, and answers:

    GET /ready  200 {"ready": true}  |  503 {"ready": false, "reason": "..."}
    GET /live   200 unless the launcher gave up restarting tritonserver (then 503)

Ready means: the launcher has started tritonserver (models loaded, laid out, warmed),
it runs and is not being restarted, its own readiness answers
200 within a second, no model is being replaced or was given up on by the supervisor
(tritonstack.serve.supervision), and every ensemble READY at the last start is READY
now. Each GET asks the server afresh (two small requests); nothing is cached.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

LOGGER = logging.getLogger("tritonstack.serve")


def not_ready_reason(server) -> str | None:
    """Why `server` (a TritonServer) should take no traffic now; None when it should."""
    restarter = server.restarter
    if restarter is not None and restarter.gave_up.is_set():
        return "tritonserver kept failing: the launcher gave up restarting it"
    if restarter is not None and restarter.restarting.is_set():
        return "tritonserver is being restarted"
    if server.process is None or server.process.poll() is not None:
        return "tritonserver is not running"
    if not server.started.is_set():
        return "starting: loading the models, laying them out, warming the ensembles"
    supervisor = server.supervisor
    if supervisor is not None and supervisor.given_up:
        model, reason = next(iter(supervisor.given_up.items()))
        return f"model {model} was unloaded for good: {reason}"
    if supervisor is not None and supervisor.replacing:
        model, reason = next(iter(supervisor.replacing.items()))
        return f"model {model} is being replaced: {reason}"
    if not server.is_ready():
        return "tritonserver's /v2/health/ready does not answer 200"
    return _unready_ensemble(server)


def _unready_ensemble(server) -> str | None:
    expected = {config["name"] for config in server.loaded if config.get("platform") == "ensemble"}
    if not expected:
        return None
    try:
        with httpclient.InferenceServerClient(server.http_url, network_timeout=2) as client:
            index = client.get_model_repository_index(headers=server.admin_headers("http"))
    except (InferenceServerException, OSError) as error:
        return f"tritonserver's model index does not answer: {error}"
    states = {entry["name"]: entry for entry in index}
    for name in sorted(expected):
        entry = states.get(name, {})
        if entry.get("state") != "READY":
            return f"ensemble {name} is {entry.get('state', 'unknown')} {entry.get('reason', '')}".rstrip()
    return None


class HealthEndpoint:
    """The /ready and /live endpoint of one TritonServer, served from a thread."""

    def __init__(self, server, host: str, port: int):
        self.server = server
        handler = type("Handler", (_Handler,), {"launcher": server})
        self._http = ThreadingHTTPServer((host, port), handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, name="health-endpoint", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HealthEndpoint:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()


class _Handler(BaseHTTPRequestHandler):
    launcher = None  # the TritonServer, set on the subclass

    def do_GET(self) -> None:
        if self.path == "/ready":
            reason = not_ready_reason(self.launcher)
            self._answer(reason is None, {"ready": reason is None, **({"reason": reason} if reason else {})})
        elif self.path == "/live":
            restarter = self.launcher.restarter
            gave_up = restarter is not None and restarter.gave_up.is_set()
            self._answer(not gave_up, {"live": not gave_up})
        else:
            self._answer(False, {"error": f"no such endpoint {self.path}: /ready or /live"}, status=404)

    def _answer(self, ok: bool, body: dict, status: int | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status or (200 if ok else 503))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        pass  # a probe every few seconds is no news
