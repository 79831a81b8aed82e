"""Run the real tritonserver on a model repository, and own its process.

    with TritonServer("model_repository") as server:
        print(server.http_url, server.grpc_url)

The server binds 127.0.0.1 unless told otherwise, runs in its own process group
(tritonserver and the Python backend stubs it spawns), and is stopped with SIGINT
then, after a grace period, SIGKILL of the whole group: no orphan is left behind.

Locked down by default: the model-repository (model control), shared-memory,
statistics, trace and logging APIs answer only requests carrying the admin key
header (`server.admin_headers(protocol)`); inference, health and metadata stay
open. The key comes from $TRITONSTACK_ADMIN_KEY, else a random one per server.
`restricted_apis=()` opens everything (tests that drive model control may prefer
to send the header instead).

Models load in explicit model-control mode (all of them, `--load-model=*`) so that
a supervisor can reload a model whose Python backend stub died: Triton 2.51 never
restarts such a stub by itself (see tritonstack/supervision.py).

From the command line (`make serve`), it runs in the foreground until Ctrl-C:

    python -m tritonstack.server --model-repository model_repository --http-port 8000
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path

from tritonstack.backend_contract import DEFAULT_MAX_INPUT_BYTES, MAX_INPUT_BYTES_ENV, REPOSITORY_ENV
from tritonstack.supervision import StubSupervisor
from tritonstack.triton_install import TritonInstall

LOGGER = logging.getLogger("tritonstack.server")
LOOPBACK = "127.0.0.1"
# The admin key for the restricted APIs; a random one per server when unset.
ADMIN_KEY_ENV = "TRITONSTACK_ADMIN_KEY"
ADMIN_HEADER = "tritonstack-admin-key"
# Triton's gRPC frontend expects restricted-protocol metadata under this prefix.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
# Everything that changes the server or reveals more than inference needs.
RESTRICTED_APIS = ("model-repository", "shared-memory", "statistics", "trace", "logging")


SHM_DIR = Path("/dev/shm")
_ERROR_LINE = re.compile(r"E\d{4} |error: ")
_KEY = re.compile(r"[A-Za-z0-9._~-]+")
# Logged on every machine without a GPU; not the reason for a failure.
_HARMLESS = ("CudaDriverHelper has not been initialized",)


def admin_headers(protocol: str, key: str | None = None) -> dict[str, str]:
    """The header that opens the restricted APIs, with the key given or
    $TRITONSTACK_ADMIN_KEY; no header without a key. gRPC carries it as metadata
    under Triton's restricted-protocol prefix."""
    key = key or os.environ.get(ADMIN_KEY_ENV)
    if not key:
        return {}
    return {(ADMIN_HEADER if protocol == "http" else GRPC_HEADER_PREFIX + ADMIN_HEADER): key}


class ServerStartError(RuntimeError):
    pass


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


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
    ):
        self.model_repository = Path(model_repository).resolve()
        self.host = host
        self.http_port = http_port or free_port(host)
        self.grpc_port = grpc_port or free_port(host)
        self.metrics_port = metrics_port or free_port(host)
        self.extra_args = tuple(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.install = install or TritonInstall.from_pytriton()
        self.restricted_apis = tuple(restricted_apis)
        self.admin_key = admin_key or os.environ.get(ADMIN_KEY_ENV) or secrets.token_urlsafe(24)
        if not _KEY.fullmatch(self.admin_key):
            # Triton parses the flag as <apis>:<header>=<key>.
            raise ValueError(f"the admin key (${ADMIN_KEY_ENV}) may hold only letters, digits and . _ ~ -")
        self.max_input_bytes = max_input_bytes
        self.supervise = supervise
        self.process: subprocess.Popen | None = None
        self.supervisor: StubSupervisor | None = None
        self._workdir: Path | None = None

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

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
        args = []
        if self.restricted_apis:
            apis = ",".join(self.restricted_apis)
            # Same key for both; Triton prefixes the gRPC metadata name itself.
            args.append(f"--http-restricted-api={apis}:{ADMIN_HEADER}={self.admin_key}")
            args.append(f"--grpc-restricted-protocol={apis}:{ADMIN_HEADER}={self.admin_key}")
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
            *self.extra_args,
        ]

    def start(self) -> "TritonServer":
        if not is_loopback(self.host):
            LOGGER.warning("tritonserver binds %s: reachable from other machines", self.host)
        if not self.restricted_apis:
            LOGGER.warning("model control, shared memory and statistics APIs are open to any client")
        self._workdir = Path(tempfile.mkdtemp(prefix="tritonstack-"))
        backends = self.install.assemble_backends(self._workdir / "backends")
        env = self.install.environment()
        env[REPOSITORY_ENV] = str(self.model_repository)
        env[MAX_INPUT_BYTES_ENV] = str(self.max_input_bytes)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command(backends),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group, stubs included
            )
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        if self.supervise:
            self.supervisor = StubSupervisor(self)
            self.supervisor.start()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
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
        if self.supervisor is not None:
            self.supervisor.stop()  # stubs exiting now are no fault to repair
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=self.stop_grace_s + 5)
            except subprocess.TimeoutExpired:
                LOGGER.warning("tritonserver ignored SIGINT; killing it")
        _kill_group(self.process.pid)
        self.process.wait()
        remove_orphaned_stub_regions()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        return self.process.returncode

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: assume it may be reachable from elsewhere
        return False


def remove_orphaned_stub_regions(min_age_s: float = 10.0) -> list[Path]:
    """Delete the Python backend's shared-memory regions that no process maps.

    Each stub's region (`/dev/shm/triton_<backend>_backend_shm_region_<uuid>`) is
    unlinked by a clean shutdown, but a stub or server that was killed leaves it
    behind, and /dev/shm is memory. A region still mapped by any live process
    (another server on this machine) is kept, and so is a very young one (a server
    starting right now may not have mapped it yet)."""
    regions = list(SHM_DIR.glob("triton_*_backend_shm_region_*"))
    if not regions:
        return []
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped.update(line.split()[-1] for line in maps.read_text().splitlines() if str(SHM_DIR) in line)
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    removed = []
    for region in regions:
        try:
            if str(region) not in mapped and time.time() - region.stat().st_mtime > min_age_s:
                region.unlink()
                removed.append(region)
        except FileNotFoundError:
            continue
    if removed:
        LOGGER.info("removed %d orphaned backend shared-memory region(s)", len(removed))
    return removed


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run tritonserver on a model repository until Ctrl-C.")
    parser.add_argument("--model-repository", default="model_repository")
    parser.add_argument("--host", default=LOOPBACK, help="address to bind (default: loopback only)")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--open-apis", action="store_true",
                        help="do not restrict model control, shared memory, statistics, trace, logging "
                             f"(default: they need the header {ADMIN_HEADER}: ${ADMIN_KEY_ENV})")
    parser.add_argument("--max-input-bytes", type=int, default=DEFAULT_MAX_INPUT_BYTES,
                        help="largest request accepted, in bytes")
    parser.add_argument("extra", nargs="*", help="more tritonserver flags, after --")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    server = TritonServer(
        args.model_repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        extra_args=tuple(args.extra),
        restricted_apis=() if args.open_apis else RESTRICTED_APIS,
        max_input_bytes=args.max_input_bytes,
    )
    if not args.open_apis and ADMIN_KEY_ENV not in os.environ:
        LOGGER.info("admin APIs need header %s; set $%s to choose its value", ADMIN_HEADER, ADMIN_KEY_ENV)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.start()
        with open(server.log_path, errors="replace") as log:
            print(log.read(), end="", flush=True)
            LOGGER.info("ready: HTTP %s, gRPC %s, metrics %s (Ctrl-C to stop)",
                        server.http_url, server.grpc_url, server.metrics_url)
            while server.process.poll() is None:
                print(log.read(), end="", flush=True)  # follow the server's log
                time.sleep(0.5)
        LOGGER.error("tritonserver exited with code %s:\n%s", server.process.returncode, server.log_tail())
        return 1
    except KeyboardInterrupt:
        LOGGER.info("stopping")
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
