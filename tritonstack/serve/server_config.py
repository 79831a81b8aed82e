"""What tritonserver is told, as a typed object rendered to its command line.

    config = ServerConfig("model_repository", http_port=8000, stop_grace_s=5)
    config.args(backend_directory, install.supports)   # ["--model-repository=...", ...]

Like PyTriton's TritonServerConfig: the data lives here, the launcher
(tritonstack.serve.launcher) starts a process with it and nothing in between
spells a flag again. Ports left at 0 and the admin key left unset are chosen when
the config is made (free loopback ports, $TRITONSTACK_ADMIN_KEY or a random key),
so that a config names the server it describes, restarts included.

The policies of the launcher itself (stub supervision, restarts, memory ceilings)
are not tritonserver's flags: they are `Supervision` (tritonstack.serve.supervision).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from tritonstack import cli, pacing
from tritonstack.address import METRICS_PATH
from tritonstack.backends.settings import (
    DEFAULT_MAX_INPUT_BYTES,
    STUB_REGION_BYTES,
    STUB_REGION_SETTING,
    backend_config,
)
from tritonstack.contract import ADMIN_HEADER, ADMIN_KEY_ENV, admin_headers
from tritonstack.objective import check_objective
from tritonstack.serve import security
from tritonstack.serve.layout import CORES_LAYOUT, LAYOUTS, REPOSITORY_LAYOUT, read_cores
from tritonstack.serve.network import LOOPBACK, free_port
from tritonstack.serve.security import RESTRICTED_APIS

# The object stores Triton reads a model repository from (its own support).
REMOTE_REPOSITORY_SCHEMES = ("s3://", "gs://", "as://")
EXPLICIT_MODEL_CONTROL = "--model-control-mode=explicit"
NO_AUTO_COMPLETE = "--disable-auto-complete-config"
# The flags by which a caller decides auto-complete itself (--strict-model-config: its old name).
AUTO_COMPLETE_FLAGS = (NO_AUTO_COMPLETE, "--strict-model-config")
# Triton's latency summaries (quantile: allowed error), per model over a sliding window:
# server-side p50 and p99 beside the cumulative duration counters, which give only means.
# The chart passes the same flags (tests/test_helm_chart.py); the dashboard and alerts
# read these quantiles.
SUMMARY_QUANTILES = {"0.5": "0.05", "0.9": "0.01", "0.99": "0.001"}


# Triton's own default: one request traced in 1000.
DEFAULT_TRACE_RATE = 1000
TRACE_SERVICE_NAME = "image-classifier"


def otlp_trace_flags(url: str, rate: int = DEFAULT_TRACE_RATE, service: str = TRACE_SERVICE_NAME) -> list[str]:
    """Triton's traces in OpenTelemetry mode, exported over OTLP/HTTP to `url` (a
    collector's .../v1/traces): spans of each traced request, its ensemble and every
    step with their model names, their timestamps as span events. The chart passes the
    same flags (tests/test_helm_chart.py)."""
    return [
        "--trace-config=mode=opentelemetry",
        f"--trace-config=opentelemetry,url={url}",
        f"--trace-config=opentelemetry,resource=service.name={service}",
        "--trace-config=level=TIMESTAMPS",
        f"--trace-config=rate={rate}",
    ]


def summary_metrics_flags() -> list[str]:
    quantiles = ",".join(f"{quantile}:{error}" for quantile, error in SUMMARY_QUANTILES.items())
    return ["--metrics-config=summary_latencies=true", f"--metrics-config=summary_quantiles={quantiles}"]


def is_remote_repository(location: str | os.PathLike) -> bool:
    """A repository Triton fetches from object storage rather than a local folder."""
    return str(location).startswith(REMOTE_REPOSITORY_SCHEMES)


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Each field with a flag is a `tritonstack serve` option (tritonstack.cli)."""

    # A local folder (resolved to an absolute path) or s3://, gs://, as:// (kept as text:
    # a Path would fold the "//" of s3://host:port/bucket/path).
    model_repository: str | Path = cli.option(
        cli.REQUIRED,
        "--model-repository",
        command_default="model_repository",
        help="a local folder, or s3://[host:port/]bucket/path fetched by Triton",
    )
    host: str = cli.option(LOOPBACK, "--host", help="address to bind (default: loopback only)")
    # The models loaded at start (Triton's --load-model, an ensemble with its steps); (): all.
    models: tuple[str, ...] = cli.option(
        (),
        "--models",
        nargs="+",
        metavar="NAME",
        convert=tuple,
        help="load only these models, an ensemble with its steps (default: every model of the repository; "
        "docs/operations.md#memory-a-preset-holds)",
    )
    # 0: a free port, chosen when the config is made; the command's are Triton's usual ones.
    http_port: int = cli.option(0, "--http-port", type=cli.positive_int, command_default=8000)
    grpc_port: int = cli.option(0, "--grpc-port", type=cli.positive_int, command_default=8001)
    metrics_port: int = cli.option(0, "--metrics-port", type=cli.positive_int, command_default=8002)
    # In-flight requests get this long after SIGINT (--exit-timeout-secs).
    stop_grace_s: float = cli.option(
        30.0,
        "--stop-grace-s",
        type=cli.non_negative_int,
        command_default=30,
        metavar="S",
        help="after Ctrl-C or SIGTERM, how long requests in flight and open HTTP connections get before "
        "tritonserver exits (--exit-timeout-secs; Triton waits for a client's idle keep-alive connection "
        "too; default: %(default)s)",
    )
    # Triton's APIs behind the admin key (tritonstack.serve.security); () opens all.
    restricted_apis: tuple[str, ...] = cli.option(
        RESTRICTED_APIS,
        "--open-apis",
        const=(),
        help="do not restrict model control, shared memory, statistics, trace, logging "
        f"(default: they need the header {ADMIN_HEADER}: ${ADMIN_KEY_ENV})",
    )
    admin_key: str | None = None
    # Told to our backends too (and to tritonserver where it has the flag).
    max_input_bytes: int = cli.option(
        DEFAULT_MAX_INPUT_BYTES, "--max-input-bytes", type=cli.positive_int, help="largest request accepted, in bytes"
    )
    # Latency quantiles in /metrics (SUMMARY_QUANTILES); False: only Triton's counters.
    summary_latencies: bool = cli.option(
        True,
        "--no-summary-latencies",
        help="leave out Triton's latency quantiles (p50, p90, p99 per model) from /metrics",
    )
    # Triton's local response cache (--cache-config=local,size=...); only models whose
    # config enables `response_cache` use it.
    response_cache_bytes: int = cli.option(
        0,
        "--response-cache-mb",
        type=cli.non_negative_int,
        convert=lambda mib: mib * 2**20,
        command_default=0,
        metavar="N",
        help="Triton's local response cache of N MiB, for the models built with `tritonstack build "
        "--response-cache` (default: 0, none; docs/operations.md#response-cache)",
    )
    # Every ensemble step's queue ceilings from this objective (tritonstack.objective),
    # applied at load without writing the repository; None: the repository's own.
    latency_objective_ms: int | None = cli.option(
        None,
        "--latency-objective-ms",
        type=cli.non_negative_int,
        metavar="MS",
        help="answer within MS or refuse: every ensemble step's queue ceilings from this objective, applied at "
        "load without writing the repository (default: the repository's own, `tritonstack build "
        "--latency-objective-ms`; 0: no ceiling; docs/reliability.md#latency-objective)",
    )
    # Triton has each backend complete a config at load: the Python backend starts a
    # stub for it, then sleeps a second (tritonstack.rules.completion). The launcher
    # turns that off where it loads the models itself and no config of the repository
    # would change; True keeps it on, for models added after the start with configs
    # that leave fields to their backend.
    always_auto_complete: bool = cli.option(
        False,
        "--always-auto-complete",
        help="let the backends complete every config at load, even when every config of the repository states "
        "what they would fill (by default that is skipped: about 1.7 s less per model load; "
        "docs/operations.md#auto-complete)",
    )
    # Triton's rate limiter over the cores (tritonstack.pacing): a first step's batch
    # starts only on a core the classifiers leave free. Off, or the caller's own
    # --rate-limit flags after --: Triton ignores the slots the configs list.
    pacing: bool = cli.option(
        True,
        "--no-pacing",
        help="start the ensembles' first steps on any core, not only on those the classifiers leave free "
        "(docs/reliability.md#overload)",
    )
    # Each ensemble step's instances and threads from the cores this process may use
    # (tritonstack.serve.layout), applied at load without writing the repository. A
    # server started in code keeps the repository's unless asked: tests serve
    # repositories whose layout is theirs to choose.
    layout: str = cli.option(
        REPOSITORY_LAYOUT,
        "--layout",
        choices=LAYOUTS,
        command_default=CORES_LAYOUT,
        help="cores: each ensemble step's instances and threads sized from the CPUs this process may use (its "
        "affinity and cgroup CPU quota), applied at load without writing the repository; repository: the "
        "repository's own (docs/performance.md#thread-layout)",
    )
    # OpenTelemetry traces of one request in `trace_rate`; None: no tracing.
    trace_otlp_url: str | None = cli.option(
        None,
        "--trace-otlp",
        metavar="URL",
        help="export Triton's OpenTelemetry traces (the request, its ensemble, each step) over OTLP/HTTP to a "
        "collector, e.g. http://127.0.0.1:4318/v1/traces (docs/operations.md#traces)",
    )
    trace_rate: int = cli.option(
        DEFAULT_TRACE_RATE,
        "--trace-rate",
        type=cli.positive_int,
        metavar="N",
        help="trace one request in N (default: %(default)s, Triton's)",
    )
    # Any other tritonserver flags, passed as given, after ours (the last of a flag wins).
    # Flags handed to tritonserver as they are (serve's arguments after --).
    extra_args: tuple[str, ...] = cli.option(
        (), "extra", nargs="*", convert=tuple, command_default=None, help="more tritonserver flags, after --"
    )

    def __post_init__(self) -> None:
        resolve = object.__setattr__  # frozen: fill what was left to choose, once
        repository = self.model_repository
        resolve(
            self,
            "model_repository",
            str(repository) if is_remote_repository(repository) else Path(repository).resolve(),
        )
        for port in ("http_port", "grpc_port", "metrics_port"):
            if not getattr(self, port):
                resolve(self, port, free_port(self.host))
        resolve(self, "admin_key", security.admin_key(self.admin_key))
        resolve(self, "restricted_apis", tuple(self.restricted_apis))
        resolve(self, "extra_args", tuple(self.extra_args))
        if self.trace_otlp_url is not None and not self.trace_otlp_url.startswith(("http://", "https://")):
            raise ValueError(f"the OTLP endpoint must be an http:// or https:// URL, not {self.trace_otlp_url!r}")
        if self.latency_objective_ms is not None:
            check_objective(self.latency_objective_ms)
        if self.layout not in LAYOUTS:
            raise ValueError(f"the layout is one of {', '.join(LAYOUTS)}, not {self.layout!r}")
        if self.trace_rate < 1:
            raise ValueError(f"the trace rate must be at least 1 (one request in N), not {self.trace_rate}")

    # --- addresses ---

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
    def local_repository(self) -> Path | None:
        """The repository's folder; None for object storage, which Triton fetches."""
        return self.model_repository if isinstance(self.model_repository, Path) else None

    def admin_headers(self, protocol: str = "http") -> dict[str, str]:
        """Headers that open the restricted APIs, for tritonclient's `headers=`."""
        return admin_headers(protocol, self.admin_key)

    # --- model control ---

    @property
    def owns_model_control(self) -> bool:
        """The caller chose no model-control mode: the launcher picks explicit."""
        return not any(arg.startswith("--model-control-mode") for arg in self.extra_args)

    @property
    def explicit_model_control(self) -> bool:
        """Models can be (re)loaded through the API: the stub supervisor needs it.
        Models load in explicit mode (all of them, --load-model=*) unless the caller
        chose a mode, so that a model whose stub died can be reloaded."""
        return self.owns_model_control or EXPLICIT_MODEL_CONTROL in self.extra_args

    # --- rendering ---

    def may_skip_auto_complete(self) -> bool:
        """The launcher loads every model it serves and reads the repository: it may
        turn auto-complete off where no config needs it (the caller's own flag wins)."""
        stated = any(arg.startswith(AUTO_COMPLETE_FLAGS) for arg in self.extra_args)
        chosen = self.always_auto_complete or stated
        return self.owns_model_control and self.local_repository is not None and not chosen

    def args(self, backend_directory: Path, supports: Callable[[str], bool], auto_complete: bool = True) -> list[str]:
        """tritonserver's command line after the binary; `supports(flag)` says whether
        this tritonserver knows a flag that only newer releases have; `auto_complete`
        False: the backends leave the configs as they are."""
        loaded = [f"--load-model={name}" for name in self.models] or ["--load-model=*"]
        model_control = [EXPLICIT_MODEL_CONTROL, *loaded] if self.owns_model_control else []
        if not auto_complete:
            model_control.append(NO_AUTO_COMPLETE)
        return [
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
            *self.security_args(supports),
            *self.region_args(),
            *(summary_metrics_flags() if self.summary_latencies else []),
            *self.cache_args(),
            *self.pacing_args(),
            *(otlp_trace_flags(self.trace_otlp_url, self.trace_rate) if self.trace_otlp_url else []),
            *self.extra_args,
        ]

    def security_args(self, supports: Callable[[str], bool]) -> list[str]:
        args = security.restriction_flags(self.restricted_apis, self.admin_key)
        if supports("--http-max-input-size"):
            args.append(f"--http-max-input-size={self.max_input_bytes}")
        return args

    def pacing_args(self) -> list[str]:
        if not self.pacing or any(arg.startswith(pacing.RATE_LIMIT_FLAG) for arg in self.extra_args):
            return []
        local = self.local_repository
        return pacing.server_flags(read_cores().usable, pacing.largest_local_claim(local) if local else 0)

    def cache_args(self) -> list[str]:
        return [f"--cache-config=local,size={self.response_cache_bytes}"] if self.response_cache_bytes else []

    def region_args(self) -> list[str]:
        """The stubs' shared region sized for a full batch, unless the caller sized it."""
        if STUB_REGION_SETTING in backend_config(self.extra_args, "python"):
            return []
        return [f"--backend-config=python,{STUB_REGION_SETTING}={STUB_REGION_BYTES}"]

    def replace(self, **changes) -> "ServerConfig":
        """A copy with `changes`; ports and key stay as chosen unless changed."""
        return dataclasses.replace(self, **changes)


def as_served(repository: str | os.PathLike, **settings) -> ServerConfig:
    """What `tritonstack serve` starts on `repository` by default (each step laid out
    for these cores, the classifier's batch from its cost curve), on free loopback
    ports: the server a figure of "the default serve" must measure. A server started in
    code otherwise keeps the repository's layout."""
    return ServerConfig(repository, **({"layout": CORES_LAYOUT} | settings))
