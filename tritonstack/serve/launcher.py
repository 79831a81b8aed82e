"""Run the real tritonserver on a model repository, and own its process.

    with TritonServer("model_repository") as server:
        print(server.http_url, server.grpc_url)

    config = ServerConfig("model_repository", http_port=8000, stop_grace_s=5)
    with TritonServer(config, Supervision(recycle=None)) as server: ...

What tritonserver is told is a ServerConfig (tritonstack.serve.server_config, rendered
to its flags); what the launcher does beyond starting it is a Supervision
(tritonstack.serve.supervision); running the process is tritonstack.serve.process.
This module puts them together: it checks the repository, lays out the backends,
starts the process with the backends' environment, and on every start that became
ready calls the `on_ready` callbacks. The stub supervisor and the restarter
register that way: Triton 2.51 never restarts a dead stub by itself, and a
tritonserver that dies while it should run is started again on the same ports.

The server binds 127.0.0.1 unless told otherwise and is stopped with SIGINT then,
after a grace period, SIGKILL of its whole process group: no orphan is left behind.
The restricted APIs need the admin key (`server.admin_headers(protocol)`);
`ServerConfig(..., restricted_apis=())` opens everything.

The command line is `tritonstack serve` (tritonstack/commands/serve.py).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import tritonclient.http
from tritonclient.utils import InferenceServerException

from tritonstack.backends.settings import VARIABLES, BackendSettings, backend_config, stub_defaults
from tritonstack.rules.completion import models_to_complete
from tritonstack.rules.unbuilt import shell_unsafe_reason, unservable_reason
from tritonstack.serve import process, server_log
from tritonstack.serve.batch_cost import measured_batches
from tritonstack.serve.hangs import HangDetector, pending_requests
from tritonstack.serve.install import TritonInstall
from tritonstack.serve.layout import CLASSIFIER_BACKEND, REPOSITORY_LAYOUT, describe_layouts, read_cores, step_layouts
from tritonstack.serve.layout import overridden as layout_overridden
from tritonstack.serve.limits import gpu_models, has_nvidia_devices, limit_address_space, memory_share_bytes
from tritonstack.serve.loaded import load_overrides, loaded_configs
from tritonstack.serve.network import is_loopback
from tritonstack.serve.priority import front_steps, lower_priority
from tritonstack.serve.queue_ceilings import overridden as objective_overridden
from tritonstack.serve.readiness import HealthEndpoint
from tritonstack.serve.response_cache import cache_ensembles
from tritonstack.serve.restart import ServerRestarter, describe_exit
from tritonstack.serve.server_config import ServerConfig
from tritonstack.serve.shm_budget import shm_shortfall, stubs_by_model
from tritonstack.serve.shm_cleanup import remove_orphaned_stub_regions, stub_regions
from tritonstack.serve.supervision import StubSupervisor, Supervision, reload_model, unload_for_good
from tritonstack.serve.warmup import warm_ensembles

LOGGER = logging.getLogger("tritonstack.serve")


class ServerStartError(RuntimeError):
    pass


class UnservableRepository(ServerStartError):
    """The repository is missing or not built: said in one line, no server started."""


class TritonServer:
    def __init__(
        self,
        config: ServerConfig | str | os.PathLike,
        supervision: Supervision | None = None,
        environment: dict[str, str] | None = None,
        install: TritonInstall | None = None,
        startup_timeout_s: float = 180.0,
    ):
        # A repository's path alone is ServerConfig(path): free loopback ports, a random admin key.
        self.config = config if isinstance(config, ServerConfig) else ServerConfig(config)
        self.supervision = supervision or Supervision()
        # Added to the server's (and its stubs') environment, e.g. STUB_ENVIRONMENT
        # (tritonstack/serve/stub_environment.py).
        self.environment = dict(environment or {})
        self.install = install or TritonInstall.from_pytriton()
        self.startup_timeout_s = startup_timeout_s
        self.process = None
        self.supervisor: StubSupervisor | None = None
        self.restarter: ServerRestarter | None = None
        self.health: HealthEndpoint | None = None  # the launcher's /ready and /live
        # Set once a launch has loaded, laid out, warmed and supervised the models.
        self.started = threading.Event()
        # Called with the server after every start that became ready, restarts included.
        self.on_ready: list[Callable[[TritonServer], None]] = []
        # The configs of the models READY at the last start, read once for the cache,
        # the warmup and the callbacks (the server's own: its repository may be remote).
        self.loaded: list[dict] = []
        self._workdir: Path | None = None
        self._backends: Path | None = None
        self._stopping = threading.Event()
        self._bytecode_before: set[Path] = set()
        self._regions_before: set[Path] = set()  # the stubs' /dev/shm regions before start

    # --- what callers read: the config's addresses, the process, its log ---

    @property
    def http_url(self) -> str:
        return self.config.http_url

    @property
    def grpc_url(self) -> str:
        return self.config.grpc_url

    @property
    def metrics_url(self) -> str:
        return self.config.metrics_url

    @property
    def admin_key(self) -> str:
        return self.config.admin_key

    def admin_headers(self, protocol: str = "http") -> dict[str, str]:
        """Headers that open the restricted APIs, for tritonclient's `headers=`."""
        return self.config.admin_headers(protocol)

    @property
    def pid(self) -> int | None:
        """tritonserver's process id while it runs."""
        return self.process.pid if self.process is not None else None

    @property
    def log_path(self) -> Path | None:
        return self._workdir / "tritonserver.log" if self._workdir else None

    def log_tail(self, lines: int = 40) -> str:
        return server_log.tail(self.log_path, lines)

    def log_errors(self) -> str:
        return server_log.errors(self.log_path)

    def command(self, backend_directory: Path) -> list[str]:
        caches = self.install.cache_directory
        # Where the install keeps its cache library (the wheel's is not at Triton's default path).
        cache_directory = [f"--cache-directory={caches}"] if self.config.response_cache_bytes and caches else []
        args = self.config.args(backend_directory, self.install.supports, self._auto_complete())
        return [str(self.install.binary), *cache_directory, *args]

    def _auto_complete(self) -> bool:
        """Whether the backends complete the configs at load: not where none would change."""
        if not self.config.may_skip_auto_complete():
            return True
        incomplete = models_to_complete(self.config.local_repository)
        if incomplete:
            name, reason = next(iter(incomplete.items()))
            LOGGER.info("auto-complete on: %d model(s) need it (%s: %s)", len(incomplete), name, reason)
        return bool(incomplete)

    # --- start and stop ---

    def check_repository(self) -> None:
        repository = self.config.local_repository
        if repository is None:
            return  # object storage: Triton says what is wrong with it
        reason = unservable_reason(repository) or shell_unsafe_reason(repository) or self._shm_shortfall(repository)
        if reason:
            raise UnservableRepository(reason)

    def _shm_shortfall(self, repository: Path) -> str | None:
        layout = self.config.layout != REPOSITORY_LAYOUT and self.config.explicit_model_control
        at_least = {backend: step.instances for backend, step in step_layouts(read_cores().usable).items()}
        return shm_shortfall(stubs_by_model(repository, self.config.models, at_least if layout else None))

    def start(self) -> TritonServer:
        self.check_repository()
        if not is_loopback(self.config.host):
            LOGGER.warning("tritonserver binds %s: reachable from other machines", self.config.host)
        if not self.config.restricted_apis:
            LOGGER.warning("model control, shared memory and statistics APIs are open to any client")
        self._workdir = Path(tempfile.mkdtemp(prefix="tritonstack-"))
        self._backends = self.install.assemble_backends(self._workdir / "backends")
        if self.config.local_repository is not None:
            self._bytecode_before = _bytecode_folders(self.config.local_repository)
        self._regions_before = stub_regions()
        self._stopping.clear()
        if self.supervision.stubs and _supervise_stubs not in self.on_ready:
            self.on_ready.append(_supervise_stubs)
        try:
            if self.supervision.health_port is not None:  # answers "not ready" while it starts
                self.health = HealthEndpoint(self, self.config.host, self.supervision.health_port).start()
            self._first_launch()
        except BaseException:
            self.stop()
            raise
        if self.supervision.restart:
            self.restarter = ServerRestarter(self, self.relaunch, hang_s=self.supervision.server_hang_s or None)
            self.restarter.start()
        return self

    def server_environment(self) -> dict[str, str]:
        """tritonserver's environment, which its stubs inherit: the install's and the
        caller's additions, the backends' variables written from `backend_settings` only."""
        env = {**self.install.environment(), **self.environment}
        settings = self.backend_settings(env)
        return {**{name: value for name, value in env.items() if name not in VARIABLES}, **settings.to_environ()}

    def backend_settings(self, environment: dict[str, str]) -> BackendSettings:
        """What the backends are told: the memory tuning `environment` sets over the
        launcher's defaults; what the config and the memory ceilings fix over it."""
        tuned = BackendSettings.from_environ({**stub_defaults(), **environment})
        limits = self.supervision.memory_limits
        return dataclasses.replace(
            tuned,
            max_input_bytes=self.config.max_input_bytes,
            # Triton's copy of a remote repository is a temporary folder nobody is told of.
            repository=self.config.local_repository or tuned.repository,
            dali_backend_config=backend_config(self.config.extra_args, "dali") or tuned.dali_backend_config,
            stub_memory_bytes=memory_share_bytes(limits) if limits else tuned.stub_memory_bytes,
        )

    def _first_launch(self) -> None:
        """launch(), and once more when tritonserver was killed by a signal before it was
        ready, as the restarter does once it runs: a crash in native code while dozens of
        stubs start (seen once in this project's suite: Triton 2.51's Python backend
        aborting on a boost::interprocess::lock_exception) is no reason to give up. A
        server that exits with an error code (a bad config) is not started again."""
        try:
            self.launch()
        except ServerStartError:
            code = self.process.poll() if self.process is not None else None
            if not self.supervision.restart or code is None or code >= 0 or self._stopping.is_set():
                raise
            LOGGER.error("tritonserver was %s during start-up: starting it again", describe_exit(code))
            self.relaunch()

    def launch(self) -> None:
        """Spawn tritonserver (its log appended to), wait until it is ready, turn the
        ensembles' response cache on when the server has a cache, send each ensemble a
        real sample (the warmup), then call the on_ready callbacks."""
        self.started.clear()
        self.process = process.spawn(self.command(self._backends), self.server_environment(), self.log_path)
        limits = self.supervision.memory_limits
        if limits and has_nvidia_devices():
            LOGGER.info("no address-space ceiling for tritonserver and GPU stubs: CUDA reserves its own")
        elif limits:  # before it loads models: the stubs inherit it
            limit_address_space(self.process.pid, limits.server_bytes)
        try:
            process.wait_ready(self.process, self.is_ready, self.startup_timeout_s, self._stopping.is_set)
        except process.NotReady as error:
            raise ServerStartError(f"{error}:\n{self.log_errors()}") from None
        self.loaded = self._read_loaded()
        self._apply_overrides()
        if self.config.response_cache_bytes and self.config.explicit_model_control:
            names = cache_ensembles(self.http_url, self.admin_headers("http"), self.loaded)
            LOGGER.info("response cache (%d MiB): on for %s", self.config.response_cache_bytes >> 20, ", ".join(names))
        if self.supervision.warmup_s > 0:
            LOGGER.info(warm_ensembles(self.http_url, self.loaded, self.supervision.warmup_s).summary())
        for callback in self.on_ready:
            callback(self)
        self.started.set()

    def _apply_overrides(self) -> None:
        """The layout for these cores and the latency objective, applied at load as config
        overrides in one pass: a step that both change is loaded again once, with both."""
        layout_changes = self._layout_changes()
        objective_ms = self.config.latency_objective_ms
        objective_changes = [] if objective_ms is None else self._objective_changes(layout_changes, objective_ms)
        changes = {config["name"]: config for config in [*layout_changes, *objective_changes]}
        # Steps before the ensembles that use them (an ensemble loads against its steps).
        ordered = sorted(changes.values(), key=lambda config: config.get("platform") == "ensemble")
        reloaded = load_overrides(self.http_url, self.admin_headers("http"), ordered)
        if reloaded:
            self.loaded = self._read_loaded()
        if objective_ms is not None and self.config.explicit_model_control:
            names = ", ".join(config["name"] for config in objective_changes) or "none"
            LOGGER.info("latency objective %d ms: queue ceilings set for %s", objective_ms, names)

    def _layout_changes(self) -> list[dict]:
        cores = read_cores()
        if self.config.layout == REPOSITORY_LAYOUT:
            LOGGER.info("%s; layout: the repository's own", cores.describe())
            return []
        if not self.config.explicit_model_control:
            LOGGER.warning(
                "%s; --layout cores needs explicit model control: the repository's layout stays", cores.describe()
            )
            return []
        layouts = step_layouts(cores.usable)
        changes = layout_overridden(self.loaded, layouts)
        if self.config.local_repository is not None:  # object storage: no file to time here
            threads = layouts[CLASSIFIER_BACKEND].threads or 1
            changes = measured_batches(self.loaded, changes, self.config.local_repository, threads)
        names = ", ".join(config["name"] for config in changes) or "none"
        LOGGER.info("%s; layout: %s; reloaded: %s", cores.describe(), describe_layouts(layouts), names)
        return changes

    def _objective_changes(self, layout_changes: list[dict], objective_ms: int) -> list[dict]:
        """The objective's overrides on top of the layout's (a step changed by both
        carries both)."""
        if not self.config.explicit_model_control:
            LOGGER.warning("--latency-objective-ms needs explicit model control: the repository's ceilings stay")
            return []
        laid_out = {config["name"]: config for config in layout_changes}
        current = [laid_out.get(config["name"], config) for config in self.loaded]
        return objective_overridden(current, objective_ms)

    def _read_loaded(self) -> list[dict]:
        try:
            return loaded_configs(self.http_url, self.admin_headers("http"))
        except (InferenceServerException, OSError) as error:
            LOGGER.warning("cannot list the loaded models (no warmup, cache or priorities): %s", error)
            return []

    def relaunch(self) -> None:
        """Clear what a dead server left (its stubs, their shared memory), then
        launch again on the same ports."""
        process.kill_group(self.process)
        remove_orphaned_stub_regions(existing_before=self._regions_before)
        self.launch()

    def is_ready(self) -> bool:
        return self._health("ready")

    def is_live(self) -> bool:
        return self._health("live")

    def _health(self, endpoint: str, timeout_s: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/{endpoint}", timeout=timeout_s) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

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
        if not process.interrupt(self.process, self.config.stop_grace_s + 5):
            LOGGER.warning("tritonserver ignored SIGINT; killing it")
        process.kill_group(self.process)
        if self.restarter is not None:
            self.restarter.stop(timeout=self.config.stop_grace_s + 10)
            if self.process.poll() is None:  # a relaunch was under way
                process.kill_group(self.process)
        remove_orphaned_stub_regions(existing_before=self._regions_before)
        if self.health is not None:
            self.health.stop()
            self.health = None
        if self.config.local_repository is not None:
            _remove_new_bytecode(self.config.local_repository, self._bytecode_before)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        return self.process.returncode

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _supervise_stubs(server: TritonServer) -> None:
    """Watch the stubs of the server process just started (a new one after a restart)."""
    if server.supervisor is not None:
        server.supervisor.stop()
    reload = functools.partial(reload_model, server.http_url, server.admin_headers("http"))
    supervision = server.supervision
    front = front_steps(server.loaded) if supervision.front_nice else set()
    on_gpu = gpu_models(server.loaded)

    def on_new_stub(pid: int, model: str) -> None:
        if supervision.memory_limits and model not in on_gpu:
            limit_address_space(pid, supervision.memory_limits.stub_bytes)
        if model in front:
            lower_priority(pid, supervision.front_nice)

    def unload(model: str, stub_pids) -> None:
        with tritonclient.http.InferenceServerClient(server.http_url, network_timeout=120) as client:
            unload_for_good(client, server.admin_headers("http"), model, stub_pids)

    hangs = None
    if supervision.hangs is not None and server.config.metrics_port:
        hangs = HangDetector(supervision.hangs, functools.partial(pending_requests, server.metrics_url))
    server.supervisor = StubSupervisor(
        server.process.pid,
        reload if server.config.explicit_model_control else None,
        on_new_stub=on_new_stub,
        recycle=supervision.recycle,
        hangs=hangs,
        unload=unload,
    )
    server.supervisor.start()


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
