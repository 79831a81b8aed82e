"""Reload a model whose Python backend stub died, or grew and stayed grown.

Seen with Triton 2.51's Python backend (which runs our `dali` and `onnxruntime`
backends): when a model instance's stub process dies (killed, out of memory, a
crash in native code), the server stays up and ready, and every later request to
that model fails with HTTP 500 "Stub process '<instance>' is not healthy." The
backend never restarts the stub, and a plain `load_model` of an unchanged model is
a no-op. Loading it again with its own config as an override, plus a parameter that
changes each time (with_reload_mark), does reload it: new instances and stubs replace
the dead one (in seconds) and the ensembles using it are re-linked.

The supervisor watches the stubs of one server (children of tritonserver; their
command line names the model's file: `<repository>/<model>/<version>/...`). A stub
that the backend stops (unload, reload) is reaped by it; one that died on its own is
left a zombie: the supervisor reloads that stub's model, if the model is still READY
and a load since has not replaced it. A load starts the new instances' stubs before
it stops the old ones, and reaps each old one only when it gets to it (going from four
instances to two, old stubs sat zombies for a poll or more beside the two new ones):
a zombie is no death when the model has, started after it, as many live stubs as its
config has instances. Needs explicit model-control mode (the launcher's default).

A stub can also outgrow itself without dying: DALI 2.4 keeps its host pool's largest
run for good (docs/memory.md), so a burst of huge images leaves the DALI stub
gigabytes larger under ordinary traffic afterwards. With a RecyclePolicy the
supervisor reloads such a model once its stub has stayed more than `above_mib` above
its settled size (its smallest RSS while idle) for `hold_s`: a new stub replaces it,
and the old one's memory goes back to the system. Requests keep being served by the
old instance until the new one is ready (Triton swaps them), so ordinary traffic
flowing all along is not interrupted (tests/test_burst_memory.py).

A stub can also hang: alive, making no progress (tritonstack.serve.hangs finds it).
A stalled stub's model is *replaced*, not reloaded in place: its stubs are killed, the
model unloaded (Triton unloads the ensembles that use it with it), then loaded again
with its own config and a reload mark, and the ensembles with theirs. In place, the old
instances would keep taking requests until the new ones are ready and answer each with
HTTP 500 "Stub process ... is not healthy"; unloaded, the ensemble answers "has no
available versions" at once (HTTP 404, gRPC NOT_FOUND) for the two or three seconds the
load takes. A dead stub's model is still reloaded in place: a death is also what a stub
of a load someone else makes (`tritonstack tune`, an operator) looks like when it is
reaped late, and an unload there failed that load (seen in the suite). The launcher's
readiness is false during either (tritonstack.serve.readiness). Replacements are bounded
per hung model (HangPolicy's restart intensity): one that keeps hanging is left unloaded
and reported.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import psutil
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tritonstack import cli
from tritonstack.serve.hangs import Hang, HangDetector, HangPolicy, RestartIntensity, resume
from tritonstack.serve.limits import MemoryLimits
from tritonstack.serve.loaded import ensemble_steps, loaded_configs
from tritonstack.serve.process_tree import server_stubs

LOGGER = logging.getLogger("tritonstack.serve")
# The model parameter reload_model changes to make Triton load a model afresh.
RELOAD_PARAMETER = "tritonstack_reloaded_at_ns"


def reload_model(
    http_url: str,
    admin_headers: dict[str, str],
    model: str,
    reason: str = "its stub died",
    newer_stubs: int | None = None,
    *,
    kill: Collection[int] | None = None,
) -> bool:
    """Load a READY model again with its own config and a reload mark (with_reload_mark),
    which makes Triton load it afresh: beside the old instances, which serve until the
    new ones are ready; with `kill` (a hung model's stubs), replaced instead
    (replace_model). False when it was not ours to reload: with `newer_stubs` (the
    model's live stubs started after the one that ended), also when they are as many as
    its instances (a load since replaced the one that ended)."""
    client = httpclient.InferenceServerClient(http_url, network_timeout=120)
    try:
        if not client.is_model_ready(model):
            return False  # being unloaded on purpose, or already failed
        config = client.get_model_config(model)
        instances = cpu_instances(config)
        if newer_stubs is not None and instances is not None and newer_stubs >= instances:
            LOGGER.info("model %s: a stub of an earlier load ended; its %d instance(s) run", model, instances)
            return False
        LOGGER.warning("model %s: %s: %s the model", model, reason, "reloading" if kill is None else "replacing")
        if kill is None:
            client.load_model(model, config=json.dumps(with_reload_mark(config)), headers=admin_headers)
        else:
            replace_model(client, loaded_configs(http_url, admin_headers), admin_headers, config, kill)
        return True
    except (InferenceServerException, OSError) as error:
        LOGGER.error("reloading model %s failed: %s", model, error)
        return False
    finally:
        client.close()


def replace_model(
    client: httpclient.InferenceServerClient,
    loaded: list[dict],
    admin_headers: dict[str, str],
    config: dict,
    kill: Collection[int],
) -> None:
    """Kill `kill`, unload the model of `config`, load it again with that config and a
    reload mark, then load each ensemble of `loaded` (the configs READY before) that used
    it with its own config (overrides included) where Triton did not bring it back as
    it was."""
    model = config["name"]
    ensembles = [other for other in loaded if other.get("platform") == "ensemble" and model in ensemble_steps([other])]
    kill_stubs(kill)
    client.unload_model(model, headers=admin_headers)
    client.load_model(model, config=json.dumps(with_reload_mark(config)), headers=admin_headers)
    for ensemble in ensembles:
        name = ensemble["name"]
        if not client.is_model_ready(name) or client.get_model_config(name) != ensemble:
            client.load_model(name, config=json.dumps(ensemble), headers=admin_headers)


def unload_for_good(client: httpclient.InferenceServerClient, admin_headers: dict[str, str], model: str, kill) -> None:
    """Kill `kill` and unload `model` (and so the ensembles that use it), to stay so."""
    kill_stubs(kill)
    client.unload_model(model, headers=admin_headers)


def kill_stubs(pids: Collection[int]) -> None:
    """SIGKILL, which also ends a stopped process: a hung stub answers nothing else."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def with_reload_mark(config: dict) -> dict:
    """`config` with a parameter that differs from any load before. Given a config that
    differs from the one it serves only in its instance groups (the same config, once
    a layout or an objective was loaded as an override), Triton updates the model in
    place and keeps the instances it has, a dead stub's among them (core's
    ConfigChangeRequiresReload ignores instance_group): a changed parameter makes it a
    full reload, with new stubs. Our backends read no such parameter."""
    parameters = dict(config.get("parameters", {}))
    parameters[RELOAD_PARAMETER] = {"string_value": str(time.time_ns())}
    return config | {"parameters": parameters}


def cpu_instances(config: dict) -> int | None:
    """How many stubs the model's config runs; None where that depends on the GPUs."""
    groups = config.get("instance_group", [])
    if not groups or any(group.get("kind", "KIND_CPU") != "KIND_CPU" for group in groups):
        return None
    return sum(int(group.get("count", 1)) for group in groups)


@dataclass(frozen=True)
class RecyclePolicy:
    """When a stub that grew is replaced by a new one."""

    # RSS above the stub's settled size.
    above_mib: float = cli.option(
        256.0,
        "--recycle-above-mib",
        type=float,
        help="reload a model whose stub idles this many MiB above its settled size, after a "
        "burst of huge images (default: %(default)s; 0: never; docs/memory.md)",
    )
    hold_s: float = 5.0  # for this long without a break
    cooldown_s: float = 30.0  # between two recycles of one model
    # Not while the stub works this hard (cores, between two readings): a burst still
    # decoding. A new stub would take the burst's queued requests while the old one
    # holds its buffers (docs/memory.md).
    busy_cores: float = 0.5


@dataclass(frozen=True)
class Supervision:
    """What the launcher does for a server beyond starting it: policies of its own,
    not tritonserver's flags (those are tritonstack.serve.server_config.ServerConfig)."""

    # Replace a model whose stub died (needs explicit model control, the launcher's default).
    stubs: bool = True
    # Replace a model whose stub hangs (tritonstack.serve.hangs), within a restart
    # intensity; None: deaths only.
    hangs: HangPolicy | None = cli.nested(HangPolicy, HangPolicy(), none_if=lambda policy: policy.stall_s <= 0)
    # Start tritonserver again on the same ports when it dies while it should run
    # (tritonstack.serve.restart).
    restart: bool = True
    # ... or when its liveness has not answered for this long (a hang).
    server_hang_s: float = cli.option(
        10.0,
        "--server-hang-s",
        type=float,
        help="restart tritonserver when /v2/health/live has not answered for this many seconds "
        "(default: %(default)s; 0: only when it dies; docs/reliability.md#hangs)",
    )
    # Replace a stub that idles far above its settled size after a burst; None: never.
    recycle: RecyclePolicy | None = cli.nested(
        RecyclePolicy, RecyclePolicy(), none_if=lambda policy: policy.above_mib <= 0
    )
    # Address-space ceilings for the server and each stub (tritonstack.serve.limits); None: none.
    memory_limits: MemoryLimits | None = cli.nested(
        MemoryLimits, default_factory=MemoryLimits.default, off="--no-memory-limits", off_help="no memory ceilings"
    )
    # The nice value of the stubs of ensembles' first steps (tritonstack.serve.priority).
    # The pacing (tritonstack.pacing) keeps the backlog before them: at 19 beside it, a
    # first step's batch ran starved on the core it got, and the capacity was 3 % lower.
    front_nice: int = cli.option(
        0,
        "--front-nice",
        type=int,
        choices=range(0, 20),
        metavar="0-19",
        help="CPU priority (nice value) of the stubs of ensembles' first steps, for a server run with "
        "--no-pacing: under overload the backlog then waits before them, where it is refused (default: 0, "
        "as any other stub; docs/reliability.md#overload)",
    )
    # The launcher's own readiness and liveness (tritonstack.serve.readiness); None: not served.
    health_port: int | None = cli.option(
        None,
        "--health-port",
        type=int,
        command_default=0,
        help="serve the launcher's /ready and /live on this port (default: a free one, logged; "
        "docs/reliability.md#readiness)",
    )
    # Before a start is called ready, each loaded ensemble answers a real sample
    # (tritonstack.serve.warmup), all within this many seconds.
    warmup_s: float = cli.option(
        60.0,
        "--warmup-s",
        type=float,
        help="before it is called ready, each loaded ensemble answers a real sample within this many "
        "seconds (default: %(default)s; 0: no warmup; docs/operations.md)",
    )


@dataclass
class StubMemory:
    """What the supervisor knows of one live stub's memory and activity."""

    settled_mib: float | None = None  # its smallest RSS while idle (loaded, no request)
    cpu_s: float = 0.0
    read_at: float | None = None
    cpu_cores: float = 0.0  # the CPU it used between the last two readings, in cores
    above_since: float | None = None  # since when it sits above the policy's bound

    def observe(self, process: psutil.Process, now: float, above_mib: float) -> float | None:
        """Update from a reading; how long it has sat above `above_mib` over its
        settled size (0 when it does not), None if the stub is gone."""
        try:
            with process.oneshot():
                times, rss = process.cpu_times(), process.memory_info().rss / 2**20
        except psutil.Error:
            return None
        cpu_s = times.user + times.system
        used = cpu_s - self.cpu_s
        idle = used < 0.02
        self.cpu_cores = used / (now - self.read_at) if self.read_at is not None and now > self.read_at else 0.0
        self.cpu_s, self.read_at = cpu_s, now
        if idle:
            self.settled_mib = rss if self.settled_mib is None else min(self.settled_mib, rss)
        grown = self.settled_mib is not None and rss - self.settled_mib > above_mib
        self.above_since = (self.above_since or now) if grown else None
        return now - self.above_since if grown else 0.0

    def grown_mib(self, process: psutil.Process) -> float:
        return process.memory_info().rss / 2**20 - (self.settled_mib or 0.0)


class StubSupervisor(threading.Thread):
    """Watches the stubs of the server process `server_pid`; calls `reload(model,
    reason, newer_stubs)` for a model whose stub died (reload_model's signature; None:
    explicit model control is off, so it can only say so), `reload(model, reason,
    kill=pids)` for one whose stubs stall (found by `hangs`; a stopped one that
    continues: `reload(model, reason)`), `reload(model, reason)` for one that, under
    `recycle`, grew and stayed grown; and
    `on_new_stub(pid, model)` for each stub when first seen alive. `replacing` and
    `given_up` (model -> reason) say what the readiness must not hide."""

    def __init__(
        self,
        server_pid: int,
        reload: Callable[..., bool] | None,
        poll_s: float = 0.5,
        on_new_stub: Callable[[int, str], object] | None = None,
        recycle: RecyclePolicy | None = None,
        hangs: HangDetector | None = None,
        unload: Callable[[str, Collection[int]], object] | None = None,
    ):
        super().__init__(name="stub-supervisor", daemon=True)
        self.server_pid = server_pid
        self.reload = reload
        self.poll_s = poll_s
        self.on_new_stub = on_new_stub
        self.recycle = recycle if reload is not None else None
        self.hangs = hangs if reload is not None else None
        self.unload = unload
        self.intensity = RestartIntensity(hangs.policy) if self.hangs is not None else None
        self.reloads: list[tuple[float, str]] = []  # (time.monotonic(), model): deaths
        self.replaced_hangs: list[tuple[float, str, str]] = []  # (time.monotonic(), model, reason)
        self.recycles: list[tuple[float, str, float]] = []  # (time.monotonic(), model, MiB above settled)
        self.replacing: dict[str, str] = {}
        self.given_up: dict[str, str] = {}
        self._memory: dict[int, StubMemory] = {}
        self._stopping = threading.Event()
        # Seen now, before start() returns: a stub killed right after is still caught.
        self._models: dict[int, str] = {}  # pid -> model, ever seen alive
        self._start_times: dict[int, float] = {}  # pid -> its create_time
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
            replaced: set[str] = set()  # one replacement for all the stubs of a model that died together
            for pid in sorted(dead - handled):
                handled.add(pid)
                self._memory.pop(pid, None)
                model = self._models.get(pid)
                if model is not None and model not in replaced and not self._stopping.is_set():
                    replaced.add(model)
                    self._stub_died(model, self._newer_stubs(pid, live))
                self._models.pop(pid, None)
                self._start_times.pop(pid, None)
            if self.hangs is not None and not self._stopping.is_set():
                for model, hang in self.hangs.hung(live, time.monotonic()).items():
                    self._replace_hung(model, hang, [pid for pid, name in live.items() if name == model])
            if self.recycle is not None:
                self._recycle_grown(live)

    def _replace_hung(self, model: str, hang: Hang, pids: list[int]) -> None:
        if not self._within_intensity(model, hang.reason, pids):
            return
        self.replacing[model] = hang.reason
        try:
            if hang.stopped and resume(pids):
                # Continued: the requests it held are answered; the old instances serve
                # until the new ones are ready.
                replaced = self.reload(model, f"{hang.reason} (continued)")
            else:
                replaced = self.reload(model, hang.reason, kill=pids)
            if replaced:
                self.replaced_hangs.append((time.monotonic(), model, hang.reason))
        finally:
            self.replacing.pop(model, None)

    def _within_intensity(self, model: str, reason: str, pids: Collection[int]) -> bool:
        """Whether `model` may be replaced once more; if not, it is unloaded and reported."""
        if self.intensity is None or self.intensity.allow(model, time.monotonic()):
            return True
        policy = self.intensity.policy
        LOGGER.error(
            "model %s: %s, after %d replacements within %.0f s: unloading it for good (load it again to retry)",
            model,
            reason,
            policy.replacements,
            policy.window_s,
        )
        self.given_up[model] = f"{reason}; replaced {policy.replacements} times within {policy.window_s:.0f} s"
        if self.unload is not None:
            self.unload(model, pids)
        return False

    def _seen(self, live: dict[int, str]) -> None:
        for pid in live.keys() - self._models.keys():
            try:
                self._start_times[pid] = psutil.Process(pid).create_time()
            except psutil.Error:
                pass  # unknown: never counted as newer, and as a death when it ends
            if self.on_new_stub is not None:
                self.on_new_stub(pid, live[pid])
        self._models.update(live)

    def _newer_stubs(self, dead_pid: int, live: dict[int, str]) -> int:
        """The live stubs of the dead one's model that started after it."""
        model, started = self._models[dead_pid], self._start_times.get(dead_pid, float("inf"))
        return sum(name == model and self._start_times.get(pid, 0.0) > started for pid, name in live.items())

    def _stub_died(self, model: str, newer_stubs: int) -> None:
        if self.reload is None:
            LOGGER.error(
                "the stub of model %s died; without explicit model-control mode it "
                "cannot be reloaded: restart the server",
                model,
            )
        else:
            # Not bounded by the restart intensity: a death is also what a stub of another's
            # load reaped late looks like (reload_model tells most apart), and a model left
            # unloaded after a few of those would end a `tritonstack tune` run.
            self.replacing[model] = "its stub died"
            try:
                if self.reload(model, "its stub died", newer_stubs):
                    self.reloads.append((time.monotonic(), model))
            finally:
                self.replacing.pop(model, None)

    def _recycle_grown(self, live: dict[int, str]) -> None:
        now = time.monotonic()
        for pid, model in live.items():
            memory = self._memory.setdefault(pid, StubMemory())
            try:
                process = psutil.Process(pid)
                held_s = memory.observe(process, now, self.recycle.above_mib)
                grown = memory.grown_mib(process)
            except psutil.Error:
                continue
            if held_s is None or held_s < self.recycle.hold_s or memory.cpu_cores >= self.recycle.busy_cores:
                continue
            if any(m == model and now - t < self.recycle.cooldown_s for t, m, _ in self.recycles):
                continue
            reason = (
                f"its stub has stayed {grown:.0f} MiB above its settled {memory.settled_mib:.0f} MiB for {held_s:.0f} s"
            )
            if self.reload(model, reason):
                self.recycles.append((now, model, grown))
