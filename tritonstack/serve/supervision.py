"""Reload a model whose Python backend stub died.

Seen with Triton 2.51's Python backend (which runs our `dali` and `onnxruntime`
backends): when a model instance's stub process dies (killed, out of memory, a
crash in native code), the server stays up and ready, and every later request to
that model fails with HTTP 500 "Stub process '<instance>' is not healthy." The
backend never restarts the stub, and a plain `load_model` of an unchanged model is
a no-op. Loading it again with its own config as an override does reload it: a new
instance and stub replace the dead one (about 2 s here) and the ensembles using it
are re-linked.

The supervisor watches the stubs of one server (children of tritonserver; their
command line names the model's file: `<repository>/<model>/<version>/...`). A stub
that the backend stops (unload, reload) is reaped at once; one that died on its
own is left a zombie: the supervisor reloads that stub's model, if the model is
still READY. Needs explicit model-control mode (the launcher's default).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

import psutil
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tritonstack.processes import server_stubs

LOGGER = logging.getLogger("tritonstack.serve")


def reload_model(http_url: str, admin_headers: dict[str, str], model: str) -> bool:
    """Load a READY model again with its own config (with an override config the
    load is never skipped as "unchanged"). False when it was not ours to reload."""
    client = httpclient.InferenceServerClient(http_url, network_timeout=120)
    try:
        if not client.is_model_ready(model):
            return False  # being unloaded on purpose, or already failed
        config = client.get_model_config(model)
        LOGGER.warning("the stub of model %s died: reloading the model", model)
        client.load_model(model, config=json.dumps(config), headers=admin_headers)
        return True
    except (InferenceServerException, OSError) as error:
        LOGGER.error("reloading model %s failed: %s", model, error)
        return False
    finally:
        client.close()


class StubSupervisor(threading.Thread):
    """Watches the stubs of the server process `server_pid`; calls `reload(model)`
    for a model whose stub died (None: explicit model control is off, so it can
    only say so), and `on_new_stub(pid)` for each stub when first seen alive."""

    def __init__(self, server_pid: int, reload: Callable[[str], bool] | None, poll_s: float = 0.5,
                 on_new_stub: Callable[[int], object] | None = None):
        super().__init__(name="stub-supervisor", daemon=True)
        self.server_pid = server_pid
        self.reload = reload
        self.poll_s = poll_s
        self.on_new_stub = on_new_stub
        self.reloads: list[tuple[float, str]] = []  # (time.monotonic(), model)
        self._stopping = threading.Event()
        # Seen now, before start() returns: a stub killed right after is still caught.
        self._models: dict[int, str] = {}  # pid -> model, ever seen alive
        self._seen(server_stubs(server_pid)[0])

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(timeout=130)

    def run(self) -> None:
        handled: set[int] = set()
        while not self._stopping.wait(self.poll_s):
            try:
                live, dead = server_stubs(self.server_pid)
            except psutil.NoSuchProcess:
                return  # the server itself is gone: the launcher reports that
            self._seen(live)
            for pid in sorted(dead - handled):
                handled.add(pid)
                if pid in self._models and not self._stopping.is_set():
                    self._stub_died(self._models.pop(pid))

    def _seen(self, live: dict[int, str]) -> None:
        for pid in live.keys() - self._models.keys():
            if self.on_new_stub is not None:
                self.on_new_stub(pid)
        self._models.update(live)

    def _stub_died(self, model: str) -> None:
        if self.reload is None:
            LOGGER.error("the stub of model %s died; without explicit model-control mode it "
                         "cannot be reloaded: restart the server", model)
        elif self.reload(model):
            self.reloads.append((time.monotonic(), model))
