"""The overload figures from a known trace (tritonstack.experiments.goodput and
.overload_soak): how each request's end is counted, each share's numerator and
denominator, the wasted share's clamp, the p99s, recovery as wall time, and the
soak's verdict. Pure: no server."""

from __future__ import annotations

import asyncio

import pytest
from tritonclient.utils import InferenceServerException

from tritonstack.client.retry import DEADLINE_EXPIRED, QUEUE_FULL
from tritonstack.client.throttle import ClientThrottledError
from tritonstack.experiments import goodput, overload_loads, overload_soak
from tritonstack.experiments.deadline_loop import Outcomes
from tritonstack.experiments.goodput import Load, phase_result, recovery_seconds, wasted_share
from tritonstack.measure import figures

DEADLINE_S = 1.0
QUEUE_FULL_ERROR = InferenceServerException(QUEUE_FULL, status="StatusCode.UNAVAILABLE")
EXPIRED_ERROR = InferenceServerException(DEADLINE_EXPIRED, status="StatusCode.UNAVAILABLE")


def known_trace() -> Outcomes:
    """28 requests: 15 answers (one late), 4 refusals by the server before the deadline
    and one after it, 5 refused at once by our client, 2 given up on, 1 failed."""
    outcomes = Outcomes(DEADLINE_S)
    for latency in [0.1] * 12 + [0.9] * 2 + [1.5]:
        outcomes.record(latency, None)
    for latency, error in [(0.01, QUEUE_FULL_ERROR)] * 3 + [(0.8, EXPIRED_ERROR), (1.2, EXPIRED_ERROR)]:
        outcomes.record(latency, error)
    for _ in range(5):
        outcomes.record(0.0, ClientThrottledError(requests=100, accepts=10))
    for _ in range(2):
        outcomes.record(1.5, asyncio.TimeoutError())
    outcomes.record(0.05, ConnectionResetError("reset"))
    return outcomes


def known_phase(**changes) -> dict:
    """The trace's figures at capacity 10 requests/s over 2 s: room for 20 in time."""
    arguments = {"computed": {"pre": 20, "cls": 16}, "probes": 2, "idle_s": 0.05, "recovery_s": 3.0}
    arguments |= changes
    load = Load("grpc", "ours", multiple=3.0, capacity=10.0, seconds=2.0)
    return vars(phase_result(known_trace(), load, rss_growth_mb=None, **arguments))


def test_every_request_ends_one_way_and_the_client_s_refusals_apart():
    phase = known_phase()
    assert phase["sent"] == 28
    assert (phase["in_time"], phase["refused"], phase["refused_by_client"]) == (14, 4, 5)
    assert (phase["late"], phase["failed"]) == (4, 1)  # a late answer, a late refusal, two given up on
    assert phase["sent"] == sum(phase[key] for key in ("in_time", "refused", "refused_by_client", "late", "failed"))


def test_the_shares_are_of_the_requests_sent_and_goodput_of_the_capacity():
    phase = known_phase()
    assert phase["refused_share"] == pytest.approx(4 / 28)
    assert phase["refused_by_client_share"] == pytest.approx(5 / 28)
    assert phase["late_share"] == pytest.approx(4 / 28)
    assert phase["goodput_rps"] == pytest.approx(7.0)  # 14 in time over 2 s
    assert phase["goodput_share"] == pytest.approx(0.7)  # 14 of the 20 the capacity serves in 2 s
    assert phase["offered_rps"] == pytest.approx(30.0)


def test_answered_p99_counts_late_answers_and_refused_p99_only_the_servers():
    phase = known_phase()
    # 15 answers: 12 x 100 ms, 2 x 900 ms and the late 1500 ms, interpolated at 99 %.
    assert phase["answered_ms_p99"] == pytest.approx(900 + 0.86 * 600)
    # The server's 4 refusals (3 x 10 ms, 800 ms); our client's instant ones left out.
    assert phase["refused_ms_p99"] == pytest.approx(10 + 0.97 * 790)


def test_wasted_is_the_worst_steps_share_not_delivered_in_time():
    # 14 in time and 2 recovery probes reached someone: 16 of the first step's 20.
    assert known_phase()["wasted_share"] == pytest.approx(0.2)
    assert wasted_share(16, {"pre": 20, "cls": 16}) == pytest.approx(0.2)
    assert wasted_share(16, {"pre": 16, "cls": 20}) == pytest.approx(0.2)  # the worst, whichever step
    # A step's counter below the answers (a cached answer, a counter read early) wastes
    # nothing rather than a negative share; a step that computed nothing is no step.
    assert wasted_share(16, {"pre": 10, "cls": 0}) == 0.0
    assert wasted_share(0, {}) == 0.0


def test_recovery_is_the_wall_time_until_a_probe_is_answered_in_time():
    """Probes of 5 s (slow), none (failed), then 0.1 s (back within twice the idle
    latency): recovery is 5.1 s after the last send, the last probe's own time included."""
    now = [100.0]
    latencies = iter([5.0, None, 0.1])

    async def probe() -> float | None:
        latency = next(latencies)
        now[0] += latency or 0.0
        return latency

    recovery, answered = asyncio.run(recovery_seconds(probe, idle_s=0.06, since=100.0, clock=lambda: now[0]))
    assert recovery == pytest.approx(5.1)
    assert answered == 2


def test_recovery_gives_up_at_its_limit():
    now = [0.0]

    async def probe() -> float:
        now[0] += 10.0
        return 10.0

    recovery, answered = asyncio.run(recovery_seconds(probe, idle_s=0.06, since=0.0, clock=lambda: now[0]))
    assert recovery == goodput.RECOVERY_LIMIT_S
    assert answered == goodput.RECOVERY_LIMIT_S / 10.0


def test_over_rounds_each_load_is_the_median_of_its_own_rounds():
    """Three rounds of two loads: each load's figures are the median over its own rounds
    (not the other load's), with n and an interval of those rounds; a round without a
    refusal gives no refused p99; failures are summed."""
    phases = []
    for round_index, (goodput_at_3x, refused_p99) in enumerate([(0.9, 400.0), (0.7, None), (0.8, 480.0)], 1):
        phases.append({**known_phase(), "round": round_index, "multiple": 1.5, "goodput_share": 1.0, "failed": 0})
        phases.append(
            {**known_phase(), "round": round_index, "goodput_share": goodput_at_3x, "refused_ms_p99": refused_p99}
        )
    at_1_5x, at_3x = overload_loads.over_rounds(phases)
    assert (at_1_5x["multiple"], at_3x["multiple"]) == (1.5, 3.0)
    assert at_1_5x["goodput_share"] == 1.0 and at_1_5x["failed"] == 0
    assert at_3x["goodput_share"] == pytest.approx(0.8) and at_3x["goodput_share_n"] == 3
    assert at_3x["goodput_share_spread"] == pytest.approx([0.7, 0.9])
    low, high = at_3x["goodput_share_interval"]
    assert 0.7 <= low <= 0.8 <= high <= 0.9
    assert at_3x["refused_ms_p99"] == pytest.approx(440.0) and at_3x["refused_ms_p99_n"] == 2
    assert at_3x["failed"] == 3  # the known trace's one failure, each round
    declared = {figure.key for figure in figures.OVERLOAD_LOADS}
    assert declared <= set(at_3x) and set(at_3x) <= set(figures.written_keys(figures.OVERLOAD_LOADS))
    line = overload_loads.load_line(at_3x)
    assert line.startswith("grpc at 3x: goodput 0.80 [") and f"{high:.2f}] n=3" in line and "failed 3" in line


def test_the_soaks_answered_p99_counts_answers_within_the_grace():
    settings = overload_soak.SoakSettings(deadline_s=1.0, grace_s=1.0)
    tally = overload_soak.PeriodTally(2.0)
    for latency in [0.1] * 99 + [1.8]:
        tally.record(latency, settings, None, right=True)
    summary = tally.summary(capacity=50.0, period_s=2.0)
    assert (summary["in_time"], summary["answered_late"]) == (99, 1)
    assert summary["answered_ms_p99"] == pytest.approx(100 + 0.01 * 1700)  # 99 % lies just short of the late one
    assert summary["goodput_share"] == pytest.approx(0.99)  # 99 in time of the 100 the capacity serves


def test_a_soak_passes_only_when_its_memory_was_judged_flat():
    clean = {"unresolved": 0, "wrong": 0, "failed": 0}
    assert overload_soak.soak_verdict(clean, {"passed": True}) is True
    assert overload_soak.soak_verdict(clean, {"passed": False}) is False
    assert overload_soak.soak_verdict(clean, {"passed": None}) is None  # too short to judge: not a pass
    assert overload_soak.soak_verdict(clean, None) is None  # a server elsewhere: not watched
    assert overload_soak.soak_verdict(clean | {"wrong": 1}, {"passed": None}) is False


def test_the_soak_skips_two_warmup_cycles_as_its_docs_say():
    """Troughs that rise into the third cycle, flat from it: passed (judged from the
    first cycle after one warm-up, they would fail); a rise after it is judged."""
    settings = overload_soak.SoakSettings(seconds=300.0, period_s=30.0)
    assert overload_soak.WARMUP_CYCLES == 2

    def samples(rise_by_cycle: list[float]) -> list[dict]:
        return [
            {"t_s": float(second), "rss_mib": {"tritonserver": 100.0 + rise_by_cycle[second // 60]}}
            for second in range(300)
        ]

    assert overload_soak.memory_verdict(samples([0, 0, 20, 20, 20]), settings)["passed"] is True
    assert overload_soak.memory_verdict(samples([0, 0, 0, 20, 20]), settings)["passed"] is False
