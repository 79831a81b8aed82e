"""Run the real tritonserver on a model repository, and own its process.

    with TritonServer("model_repository") as server:
        print(server.http_url, server.grpc_url)

The server binds 127.0.0.1 unless told otherwise, runs in its own process group
(tritonserver and the Python backend stubs it spawns), and is stopped with SIGINT
then, after a grace period, SIGKILL of the whole group: no orphan is left behind.
A launcher that is itself killed (SIGKILL, the OOM killer, a CI timeout) cannot do
that: the kernel does it instead, since tritonserver is started with
PR_SET_PDEATHSIG=SIGKILL (`die_with_launcher`), and the Python backend stubs leave
when their server is gone (tests/test_launcher_cli.py shows both). The signal follows the
*thread* that started the server: start it from a thread that outlives it (the
main thread, as every caller here does).

The restricted APIs need the admin key (tritonstack.serve.security;
`server.admin_headers(protocol)`); `restricted_apis=()` opens everything.

Models load in explicit model-control mode (all of them, `--load-model=*`) so that
the stub supervisor (tritonstack.serve.supervision) can reload a model whose Python
backend stub died: Triton 2.51 never restarts such a stub by itself. When
tritonserver itself dies while it should run, the restarter
(tritonstack.serve.restart) starts it again on the same ports. Both register as
`on_ready` callbacks, called after every start.

The command line is `python -m tritonstack.serve` (tritonstack/serve/__main__.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path

import psutil

from tritonstack.address import METRICS_PATH
from tritonstack.contract import (
    DALI_BACKEND_CONFIG_ENV,
    DEFAULT_MAX_INPUT_BYTES,
    MAX_INPUT_BYTES_ENV,
    REPOSITORY_ENV,
    STUB_REGION_BYTES,
    STUB_REGION_SETTING,
    admin_headers,
    backend_config,
)
from tritonstack.processes import group_processes
from tritonstack.rules.repository import shell_unsafe_reason, unservable_reason
from tritonstack.serve import security
from tritonstack.serve.install import TritonInstall
from tritonstack.serve.limits import MemoryLimits, limit_address_space
from tritonstack.serve.network import LOOPBACK, free_port, is_loopback
from tritonstack.serve.restart import ServerRestarter
from tritonstack.serve.security import RESTRICTED_APIS
from tritonstack.serve.shm_cleanup import remove_orphaned_stub_regions, stub_regions
from tritonstack.serve.supervision import RecyclePolicy, StubSupervisor, reload_model

LOGGER = logging.getLogger("tritonstack.serve")
_ERROR_LINE = re.compile(r"E\d{4} |error: ")
# Logged on every machine without a GPU; not the reason for a failure.
_HARMLESS = ("CudaDriverHelper has not been initialized",)
# The object stores Triton reads a model repository from (its own support).
REMOTE_REPOSITORY_SCHEMES = ("s3://", "gs://", "as://")
# How long stop() waits for killed stubs to be gone before removing their regions.
STUBS_EXIT_TIMEOUT_S = 10.0


class ServerStartError(RuntimeError):
    pass


class UnservableRepository(ServerStartError):
    """The repository is missing or not built: said in one line, no server started."""


class TritonServer:
    def __init__(
        self,
        model_repository: str | os.PathLike,
        host: str = LOOPBACK,
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        extra_args: tuple[str, ...] = (),
        startup_timeout_s: float = 180.0,
        stop_grace_s: float = 30.0,
        install: TritonInstall | None = None,
        restricted_apis: tuple[str, ...] = RESTRICTED_APIS,
        admin_key: str | None = None,
        max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
        supervise: bool = True,
        restart: bool = True,
        environment: dict[str, str] | None = None,
        memory_limits: MemoryLimits | None = None,
        limit_memory: bool = True,
        recycle: RecyclePolicy | None = RecyclePolicy(),
    ):
        # Object storage (s3://, gs://, as://) is fetched by Triton itself.
        self.model_repository = (str(model_repository) if is_remote_repository(model_repository)
                                 else Path(model_repository).resolve())
        self.host = host
        self.http_port = http_port or free_port(host)
        self.grpc_port = grpc_port or free_port(host)
        self.metrics_port = metrics_port or free_port(host)
        self.extra_args = tuple(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.install = install or TritonInstall.from_pytriton()
        self.restricted_apis = tuple(restricted_apis)
        self.admin_key = security.admin_key(admin_key)
        self.max_input_bytes = max_input_bytes
        self.supervise = supervise
        self.restart = restart
        # Added to the server's (and its stubs') environment, e.g. STUB_ENVIRONMENT
        # (tritonstack/serve/stub_environment.py: a flatter heap for 20 % throughput).
        self.environment = dict(environment or {})
        # Address-space ceilings (tritonstack.serve.limits); None: the defaults.
        self.memory_limits = (memory_limits or MemoryLimits.default()) if limit_memory else None
        # A stub that idles far above its settled size after a burst is replaced
        # (tritonstack.serve.supervision); None: never.
        self.recycle = recycle
        self.process: subprocess.Popen | None = None
        self.supervisor: StubSupervisor | None = None
        self.restarter: ServerRestarter | None = None
        # Called with the server after every start that became ready, restarts included.
        self.on_ready: list[Callable[["TritonServer"], None]] = []
        self._workdir: Path | None = None
        self._backends: Path | None = None
        self._stopping = threading.Event()
        self._bytecode_before: set[Path] = set()
        self._regions_before: set[Path] = set()  # the stubs' /dev/shm regions before start

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}{METRICS_PATH}"

    @property
    def pid(self) -> int | None:
        """tritonserver's process id while it runs."""
        return self.process.pid if self.process is not None else None

    @property
    def log_path(self) -> Path:
        return self._workdir / "tritonserver.log"

    def admin_headers(self, protocol: str = "http") -> dict[str, str]:
        """Headers that open the restricted APIs, for tritonclient's `headers=`."""
        return admin_headers(protocol, self.admin_key)

    @property
    def explicit_model_control(self) -> bool:
        """Models can be (re)loaded through the API: the supervisor needs it."""
        return self._owns_model_control or "--model-control-mode=explicit" in self.extra_args

    @property
    def _owns_model_control(self) -> bool:
        """The caller chose no model-control mode: the launcher picks explicit."""
        return not any(arg.startswith("--model-control-mode") for arg in self.extra_args)

    def security_args(self) -> list[str]:
        args = security.restriction_flags(self.restricted_apis, self.admin_key)
        if self.install.supports("--http-max-input-size"):
            args.append(f"--http-max-input-size={self.max_input_bytes}")
        return args

    def command(self, backend_directory: Path) -> list[str]:
        model_control = ["--model-control-mode=explicit", "--load-model=*"] if self._owns_model_control else []
        return [
            str(self.install.binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backend_directory}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            f"--exit-timeout-secs={int(self.stop_grace_s)}",
            *model_control,
            *self.security_args(),
            *self.region_args(),
            *self.extra_args,
        ]

    def region_args(self) -> list[str]:
        """The stubs' shared region sized for a full batch, unless the caller sized it."""
        if STUB_REGION_SETTING in backend_config(self.extra_args, "python"):
            return []
        return [f"--backend-config=python,{STUB_REGION_SETTING}={STUB_REGION_BYTES}"]

    def check_repository(self) -> None:
        if not isinstance(self.model_repository, Path):
            return  # object storage: Triton says what is wrong with it
        reason = unservable_reason(self.model_repository) or shell_unsafe_reason(self.model_repository)
        if reason:
            raise UnservableRepository(reason)

    def start(self) -> "TritonServer":
        self.check_repository()
        if not is_loopback(self.host):
            LOGGER.warning("tritonserver binds %s: reachable from other machines", self.host)
        if not self.restricted_apis:
            LOGGER.warning("model control, shared memory and statistics APIs are open to any client")
        self._workdir = Path(tempfile.mkdtemp(prefix="tritonstack-"))
        self._backends = self.install.assemble_backends(self._workdir / "backends")
        if isinstance(self.model_repository, Path):
            self._bytecode_before = _bytecode_folders(self.model_repository)
        self._regions_before = stub_regions()
        self._stopping.clear()
        if self.supervise and _supervise_stubs not in self.on_ready:
            self.on_ready.append(_supervise_stubs)
        try:
            self.launch()
        except BaseException:
            self.stop()
            raise
        if self.restart:
            self.restarter = ServerRestarter(self, self.relaunch)
            self.restarter.start()
        return self

    def launch(self) -> None:
        """Spawn tritonserver (its log appended to), wait until it is ready, then
        call the on_ready callbacks."""
        env = self.install.environment()
        if isinstance(self.model_repository, Path):
            # Auto-complete reads model files here; Triton's copy of a remote
            # repository is a temporary folder nobody is told of.
            env[REPOSITORY_ENV] = str(self.model_repository)
        env[MAX_INPUT_BYTES_ENV] = str(self.max_input_bytes)
        dali_settings = backend_config(self.extra_args, "dali")
        if dali_settings:
            env[DALI_BACKEND_CONFIG_ENV] = json.dumps(dali_settings)
        env.update(self.environment)
        env.update(self.memory_limits.environment() if self.memory_limits else {})
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(self._backends),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group, stubs included
                preexec_fn=die_with_launcher(os.getpid()),
            )
        if self.memory_limits:  # before it loads models: the stubs inherit it
            limit_address_space(self.process.pid, self.memory_limits.server_bytes)
        self.wait_ready()
        for callback in self.on_ready:
            callback(self)

    def relaunch(self) -> None:
        """Clear what a dead server left (its stubs, their shared memory), then
        launch again on the same ports."""
        _kill_group(self.process)
        remove_orphaned_stub_regions(existing_before=self._regions_before)
        self.launch()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._stopping.is_set():
                raise ServerStartError("stopped while starting")
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"tritonserver exited with code {self.process.returncode} during start-up:\n"
                    + self.log_errors()
                )
            if self.is_ready():
                return
            time.sleep(0.2)
        raise ServerStartError(
            f"tritonserver not ready after {self.startup_timeout_s:.0f} s:\n" + self.log_errors()
        )

    def is_ready(self) -> bool:
        try:
            url = f"http://{self.http_url}/v2/health/ready"
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def log_tail(self, lines: int = 40) -> str:
        if self._workdir is None or not self.log_path.exists():
            return "(no log)"
        with open(self.log_path, errors="replace") as log:
            return "".join(deque(log, maxlen=lines))

    def log_errors(self) -> str:
        """The log's error lines (model load failures among them) and its end."""
        if self._workdir is None or not self.log_path.exists():
            return "(no log)"
        errors = [
            line
            for line in self.log_path.read_text(errors="replace").splitlines(keepends=True)
            if (_ERROR_LINE.match(line) or "UNAVAILABLE" in line) and not any(h in line for h in _HARMLESS)
        ]
        return "".join(errors) + "...\n" + self.log_tail(lines=5)

    def stop(self) -> int | None:
        """SIGINT, wait for in-flight requests up to the grace period, then SIGKILL
        the whole process group. Returns the server's exit code."""
        if self.process is None:
            return None
        self._stopping.set()
        if self.restarter is not None:
            # Told now (a death now is no fault to repair), joined only after the
            # server has stopped: a restarted server is the restarter thread's child,
            # and PR_SET_PDEATHSIG would SIGKILL it when that thread ends, before
            # the drain.
            self.restarter.stop(timeout=0)
        if self.supervisor is not None:
            self.supervisor.stop()  # stubs exiting now are no fault to repair
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=self.stop_grace_s + 5)
            except subprocess.TimeoutExpired:
                LOGGER.warning("tritonserver ignored SIGINT; killing it")
        _kill_group(self.process)
        if self.restarter is not None:
            self.restarter.stop(timeout=self.stop_grace_s + 10)
            if self.process.poll() is None:  # a relaunch was under way
                _kill_group(self.process)
        remove_orphaned_stub_regions(existing_before=self._regions_before)
        if isinstance(self.model_repository, Path):
            _remove_new_bytecode(self.model_repository, self._bytecode_before)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        return self.process.returncode

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


# prctl(2) option numbers from <linux/prctl.h>; libc is loaded here, before any
# fork, so that the child only calls into it.
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def die_with_launcher(launcher_pid: int):
    """A preexec_fn: the child gets SIGKILL when the launcher (the thread that
    forked it) dies. If the launcher died already, between fork and prctl, the
    child exits at once instead of serving unowned."""

    def set_parent_death_signal() -> None:
        if _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != launcher_pid:
            os._exit(70)

    return set_parent_death_signal


def _supervise_stubs(server: TritonServer) -> None:
    """Watch the stubs of the server process just started (a new one after a restart)."""
    if server.supervisor is not None:
        server.supervisor.stop()
    reload = functools.partial(reload_model, server.http_url, server.admin_headers("http"))
    limit = (functools.partial(limit_address_space, limit_bytes=server.memory_limits.stub_bytes)
             if server.memory_limits else None)
    server.supervisor = StubSupervisor(server.process.pid, reload if server.explicit_model_control else None,
                                       on_new_stub=limit, recycle=server.recycle)
    server.supervisor.start()


def is_remote_repository(location: str | os.PathLike) -> bool:
    """A repository Triton fetches from object storage rather than a local folder."""
    return str(location).startswith(REMOTE_REPOSITORY_SCHEMES)
def _bytecode_folders(repository: Path) -> set[Path]:
    return set(repository.glob("*/*/**/__pycache__"))


def _remove_new_bytecode(repository: Path, before: set[Path]) -> None:
    """Triton's Python backend stub imports a `backend: "python"` model's model.py
    from the repository in an isolated interpreter (PYTHONDONTWRITEBYTECODE is
    ignored there), which writes <model>/<version>/__pycache__: remove the bytecode
    folders that appeared while this server ran, and nothing else (a SIGKILLed
    launcher cannot; our dali backend writes none)."""
    for folder in _bytecode_folders(repository) - before:
        shutil.rmtree(folder, ignore_errors=True)


def _kill_group(server: subprocess.Popen) -> None:
    """SIGKILL a server's process group; return once the server is reaped and its
    stubs are gone (bounded): a killed stub maps its region until it is."""
    try:
        os.killpg(server.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    server.wait()  # before the group's wait, which would reap it and lose its exit code
    psutil.wait_procs(group_processes(server.pid), timeout=STUBS_EXIT_TIMEOUT_S)


