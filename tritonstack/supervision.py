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
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

if TYPE_CHECKING:
    from tritonstack.server import TritonServer

LOGGER = logging.getLogger("tritonstack.supervision")
STUB_NAME = "triton_python_backend_stub"


def server_stubs(server_pid: int) -> tuple[dict[int, str], set[int]]:
    """The Python backend stubs of a server: live ones (pid -> model name) and dead
    ones. The backend reaps a stub it stops; one that died on its own stays a zombie."""
    live, dead = {}, set()
    for child in psutil.Process(server_pid).children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                dead.add(child.pid)
            elif child.name().startswith(STUB_NAME[:15]):  # Linux may truncate names
                # argv[1] is the model file: <repository>/<model>/<version>/<file>
                live[child.pid] = Path(child.cmdline()[1]).parent.parent.name
        except (psutil.NoSuchProcess, psutil.ZombieProcess, IndexError):
            continue
    return live, dead


class StubSupervisor(threading.Thread):
    def __init__(self, server: "TritonServer", poll_s: float = 0.5):
        super().__init__(name="stub-supervisor", daemon=True)
        self.server = server
        self.poll_s = poll_s
        self.reloads: list[tuple[float, str]] = []  # (time.monotonic(), model)
        self._stopping = threading.Event()
        # Seen now, before start() returns: a stub killed right after is still caught.
        self._models: dict[int, str] = server_stubs(server.process.pid)[0]  # pid -> model, ever seen alive

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(timeout=130)

    def run(self) -> None:
        handled: set[int] = set()
        while not self._stopping.wait(self.poll_s):
            try:
                live, dead = server_stubs(self.server.process.pid)
            except psutil.NoSuchProcess:
                return  # the server itself is gone: the launcher reports that
            self._models.update(live)
            for pid in sorted(dead - handled):
                handled.add(pid)
                if pid in self._models and not self._stopping.is_set():
                    self._reload(self._models.pop(pid))

    def _reload(self, model: str) -> None:
        if not self.server.explicit_model_control:
            LOGGER.error("the stub of model %s died; without explicit model-control mode it "
                         "cannot be reloaded: restart the server", model)
            return
        client = httpclient.InferenceServerClient(self.server.http_url, network_timeout=120)
        headers = self.server.admin_headers("http")
        try:
            if not client.is_model_ready(model):
                return  # being unloaded on purpose, or already failed: not ours to load
            config = client.get_model_config(model)
            LOGGER.warning("the stub of model %s died: reloading the model", model)
            # With an override config the load is never skipped as "unchanged".
            client.load_model(model, config=json.dumps(config), headers=headers)
            self.reloads.append((time.monotonic(), model))
        except (InferenceServerException, OSError) as error:
            LOGGER.error("reloading model %s failed: %s", model, error)
        finally:
            client.close()
