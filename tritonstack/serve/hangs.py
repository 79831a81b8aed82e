"""Find a model whose stub is alive but makes no progress: a hang, not a death.

Seen with Triton 2.51: SIGSTOP on a model's stubs (how a native deadlock looks from
outside) leaves the server ready while every request to the model waits a second and
gets HTTP 500 "Stub process ... is not healthy", for good; a stub deadlocked with its
health thread still running answers nothing, and the requests behind it wait in the
queue. Neither ends on its own. Two signs, read from outside every poll:

- **stopped**: a stub in the stopped state (SIGSTOP, a debugger's stop). This one hang
  can be undone: the supervisor continues it (SIGCONT) within the second Triton's
  health check allows, so the requests it holds are answered, then replaces it in
  place (the old instances serve until the new ones are ready): whatever stopped it
  may stop it again. One that does not continue (a debugger's) is killed and replaced.
- **stalled**: the model's requests have waited (Triton's
  `nv_inference_pending_request_count`, above zero at every read) for `stall_s` while
  none of its stubs used CPU. A stub that computes uses CPU; one that waits for work
  has no requests waiting. The wait is timed from the first read that saw it, not from
  the stubs' last work: a request that reaches a model idle for minutes, and waits a
  poll for a core or a rate-limiter slot, is no hang. Triton's metrics are read only
  while some model's stubs have been idle for a second (WATCH_AFTER_IDLE_S).

The supervisor (tritonstack.serve.supervision) replaces what these find, within the
restart intensity of `HangPolicy`.
"""

from __future__ import annotations

import collections
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
from prometheus_client.parser import text_string_to_metric_families

from tritonstack import cli

# A gauge: requests a model has received and not yet started (Triton 2.51).
PENDING = "nv_inference_pending_request_count"
STOPPED_STATES = frozenset({psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP})
# Stubs idle this long (or stall_s, if shorter) have their model's waiting requests
# read each poll: the start of a stall is then seen within a second of it.
WATCH_AFTER_IDLE_S = 1.0


@dataclass(frozen=True)
class HangPolicy:
    """When a model whose stubs live but make no progress is replaced, and how often."""

    stall_s: float = cli.option(
        10.0,
        "--stall-s",
        type=float,
        help="replace a model whose requests wait while its stubs use no CPU for this many seconds; a "
        "stopped stub is replaced at once (default: %(default)s; docs/reliability.md#hangs)",
    )
    # Restart intensity (Erlang/OTP's): more replacements of a hung model than this
    # within window_s and it is left unloaded and reported.
    replacements: int = 3
    window_s: float = 300.0
    # CPU seconds between two polls below which a stub counts as doing nothing (its
    # health thread and memory gauge use far less).
    idle_cpu_s: float = 0.005


def pending_requests(metrics_url: str, timeout_s: float = 1.0) -> dict[str, float]:
    """Model -> requests received and not yet started, from Triton's metrics."""
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
        text = response.read().decode()
    pending: dict[str, float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(text):
        if family.name == PENDING:
            for sample in family.samples:
                pending[sample.labels["model"]] += sample.value
    return dict(pending)


@dataclass
class _Progress:
    """One model's stubs as last read: which, their CPU seconds, idle since when, and
    since when requests have waited for them at every read (None: not seen waiting)."""

    pids: frozenset[int]
    cpu_s: float
    idle_since: float
    waiting_since: float | None = None


@dataclass(frozen=True)
class Hang:
    reason: str
    stopped: bool  # in the stopped state (else stalled)


@dataclass
class HangDetector:
    """Each poll, `hung(live, now)`: the models whose stubs are stopped or stalled.
    `pending()` reads Triton's pending requests per model."""

    policy: HangPolicy
    pending: Callable[[], dict[str, float]]
    _progress: dict[str, _Progress] = field(default_factory=dict)

    def hung(self, live: dict[int, str], now: float) -> dict[str, Hang]:
        by_model: dict[str, list[int]] = collections.defaultdict(list)
        for pid, model in live.items():
            by_model[model].append(pid)
        found: dict[str, Hang] = {}
        idle_for: dict[str, float] = {}
        for model, pids in by_model.items():
            stopped, cpu_s = _read(pids)
            if stopped:
                found[model] = Hang(f"its stub (pid {stopped}) is stopped", stopped=True)
                continue
            idle_for[model] = self._idle_for(model, frozenset(pids), cpu_s, now)
        for model in by_model.keys() - found.keys() - idle_for.keys():
            self._progress.pop(model, None)
        watch_after_s = min(self.policy.stall_s, WATCH_AFTER_IDLE_S)
        watched = [model for model, seconds in idle_for.items() if seconds >= watch_after_s]
        if watched:
            waiting = self._pending()
            for model in watched:
                waited_s = self._waited_for(model, waiting.get(model, 0), now)
                if waited_s >= self.policy.stall_s:
                    reason = f"{waiting[model]:.0f} request(s) waited {waited_s:.0f} s while its stubs used no CPU"
                    found[model] = Hang(reason, stopped=False)
        for model in found:
            self._progress.pop(model, None)
        return found

    def _idle_for(self, model: str, pids: frozenset[int], cpu_s: float, now: float) -> float:
        last = self._progress.get(model)
        if last is None or last.pids != pids or cpu_s - last.cpu_s >= self.policy.idle_cpu_s:
            self._progress[model] = _Progress(pids, cpu_s, now)
            return 0.0
        last.cpu_s = cpu_s  # creep below the threshold must not add up to work
        return now - last.idle_since

    def _waited_for(self, model: str, pending: float, now: float) -> float:
        """How long requests have waited for the idle `model` at every read till now."""
        progress = self._progress[model]
        if pending <= 0:
            progress.waiting_since = None
            return 0.0
        if progress.waiting_since is None:
            progress.waiting_since = now
        return now - progress.waiting_since

    def _pending(self) -> dict[str, float]:
        try:
            return self.pending()
        except OSError:
            return {}  # a server too busy to answer its metrics is not stalled by this


def resume(pids: list[int], settle_s: float = 0.1) -> bool:
    """SIGCONT each of `pids`; whether none is stopped a moment later (a traced
    process stays stopped)."""
    for pid in pids:
        try:
            psutil.Process(pid).resume()
        except psutil.Error:
            pass
    time.sleep(settle_s)
    return _read(pids)[0] is None


def _read(pids: list[int]) -> tuple[int | None, float]:
    """The first stopped stub among `pids` (None if none), and their CPU seconds."""
    cpu_s = 0.0
    for pid in pids:
        try:
            process = psutil.Process(pid)
            with process.oneshot():
                if process.status() in STOPPED_STATES:
                    return pid, 0.0
                times = process.cpu_times()
        except psutil.Error:
            continue  # gone: the supervisor sees the death
        cpu_s += times.user + times.system
    return None, cpu_s


@dataclass
class RestartIntensity:
    """At most `policy.replacements` replacements of one model within
    `policy.window_s`; `allow(model, now)` counts one and says whether it may go on."""

    policy: HangPolicy
    _times: dict[str, collections.deque] = field(default_factory=dict)

    def allow(self, model: str, now: float) -> bool:
        times = self._times.setdefault(model, collections.deque())
        while times and now - times[0] > self.policy.window_s:
            times.popleft()
        if len(times) >= self.policy.replacements:
            return False
        times.append(now)
        return True
