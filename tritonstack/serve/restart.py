"""Start tritonserver again when it dies while it should run.

Triton 2.51 can be killed from outside by a single request (a JSON body nested
~150,000 levels deep: SIGSEGV, nothing in its log; see docs/reliability.md), and
like any process by the kernel's out-of-memory killer. Without this the service is
gone until a person restarts it. The restarter watches the launcher's process; when
it exits with any code or signal while no stop was asked for, it logs the cause and
the log's last error lines, then relaunches on the same ports with exponential
backoff (tenacity), a bounded number of attempts per death, and a bounded number of
deaths per window, so that a server that crashes at every start is given up on
(`gave_up` is set) instead of looping forever.

A tritonserver that lives but hangs (SIGSTOP, a deadlock: its health endpoint and every
request time out) is treated as dead: when `/v2/health/live` has not answered for
`hang_s`, the restarter kills its process group and starts it again the same way,
within the same bounds (systemd's watchdog, for a server that has none of its own).

In Kubernetes the liveness probe plays this role for the pod; this is for
`make serve`, tests and any host without an orchestrator.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable

import tenacity

from tritonstack.serve import process

LOGGER = logging.getLogger("tritonstack.serve")


def describe_exit(returncode: int) -> str:
    """'killed by SIGSEGV' or 'exit code 1' (Popen gives a signal as -signum)."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class ServerRestarter(threading.Thread):
    """Watches `server.process`; relaunches with `relaunch()` (spawn and wait until
    ready, raising on failure) when it dies. `deaths` and `restarts` record when
    (time.monotonic()) for tests and logs."""

    def __init__(
        self,
        server,
        relaunch: Callable[[], None],
        attempts: int = 5,
        first_wait_s: float = 1.0,
        max_wait_s: float = 30.0,
        max_deaths: int = 10,
        window_s: float = 600.0,
        poll_s: float = 0.2,
        hang_s: float | None = None,
        live_every_s: float = 1.0,
    ):
        super().__init__(name="server-restarter", daemon=True)
        self.server = server
        self.relaunch = relaunch
        self.attempts = attempts
        self.first_wait_s = first_wait_s
        self.max_wait_s = max_wait_s
        self.max_deaths = max_deaths
        self.window_s = window_s
        self.poll_s = poll_s
        self.hang_s = hang_s  # None: a hang is not watched for
        self.live_every_s = live_every_s
        self._unanswered_since: float | None = None  # since when liveness has not answered
        self._next_check = 0.0
        self.deaths: list[tuple[float, str]] = []  # (time.monotonic(), cause)
        self.restarts: list[float] = []
        self.gave_up = threading.Event()
        self.restarting = threading.Event()  # from a death (or hang) until it serves again
        self._stopping = threading.Event()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self, timeout: float | None = None) -> None:
        self._stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=timeout)

    def run(self) -> None:
        while not self._stopping.wait(self.poll_s):
            returncode = self.server.process.poll()
            if self._stopping.is_set():
                continue
            if returncode is not None:
                cause = describe_exit(returncode)
                LOGGER.error(
                    "tritonserver died while it should run (%s); its last log lines:\n%s",
                    cause,
                    self.server.log_errors(),
                )
            else:
                cause = self._hang()
                if cause is None:
                    continue
                LOGGER.error("tritonserver hangs (%s): killing it", cause)
                process.kill_group(self.server.process)
            self.deaths.append((time.monotonic(), cause))
            self.restarting.set()
            try:
                if not self._restart():
                    self.gave_up.set()
                    return
            finally:
                self.restarting.clear()

    def _hang(self) -> str | None:
        """Why the live server counts as hung, or None: its liveness answered within
        `hang_s` (checked every `live_every_s`)."""
        now = time.monotonic()
        if self.hang_s is None or now < self._next_check:
            return None
        self._next_check = now + self.live_every_s
        if self.server.is_live():
            self._unanswered_since = None
            return None
        self._unanswered_since = self._unanswered_since or now
        silent_s = time.monotonic() - self._unanswered_since
        if silent_s < self.hang_s:
            return None
        self._unanswered_since = None
        return f"/v2/health/live unanswered for {silent_s:.0f} s"

    def _restart(self) -> bool:
        recent = [at for at, _ in self.deaths if at > time.monotonic() - self.window_s]
        if len(recent) > self.max_deaths:
            LOGGER.error("tritonserver died %d times in %.0f s: not restarting it again", len(recent), self.window_s)
            return False
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=tenacity.wait_exponential(multiplier=self.first_wait_s, max=self.max_wait_s),
            retry=tenacity.retry_if_exception_type((RuntimeError, OSError)),
            before_sleep=lambda state: LOGGER.warning(
                "restarting tritonserver failed (attempt %d): %s", state.attempt_number, state.outcome.exception()
            ),
            sleep=self._stopping.wait,  # a stop interrupts the backoff
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    if self._stopping.is_set():
                        return True
                    LOGGER.warning("restarting tritonserver on %s", self.server.http_url)
                    self.relaunch()
        except (RuntimeError, OSError) as error:
            LOGGER.error("tritonserver did not come back after %d attempts: %s", self.attempts, error)
            return False
        if not self._stopping.is_set():
            self.restarts.append(time.monotonic())
            LOGGER.warning("tritonserver restarted and ready (pid %s)", self.server.pid)
        return True
