"""Whether the stub's tritonserver is still there, for calls that wait on its answer.

Triton's Python backend stub notices a dead server between requests and leaves. But a
stub blocked in a call that waits for its server's answer (a custom metric's update)
waits for an answer that cannot come, holding its memory, its shared-memory region
and the interpreter's lock (a launcher SIGKILLed during the warmup leaves such stubs:
tests/test_launcher_cli.py). Such a call is made only
while `server_alive()`: the kernel hands an orphan to init (or a subreaper) once its
parent process has exited, so a changed parent means the server is gone, and a live
server is never mistaken for a dead one. The check is one getppid() call."""

from __future__ import annotations

import os

_SERVER = os.getppid()  # the stub's parent at import, during its model's initialize


def server_alive() -> bool:
    return os.getppid() == _SERVER
