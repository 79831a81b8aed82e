"""Each load's figures over the rounds of `tritonstack overload --rounds`: per protocol
and multiple, each figure declared in tritonstack.measure.figures.OVERLOAD_LOADS as the
median of its rounds with its 95 % interval and n, and a line of them for the log."""

from __future__ import annotations

from tritonstack.measure import figures


def over_rounds(phases: list[dict]) -> list[dict]:
    """Per protocol and multiple, in the order first run: each figure declared in
    tritonstack.measure.figures.OVERLOAD_LOADS as its median over the rounds, with its
    interval and n (a round that measured none, e.g. no refusal to take a p99 of,
    gives no value), and the failed requests of every round summed."""
    loads = []
    for protocol, multiple in dict.fromkeys((phase["protocol"], phase["multiple"]) for phase in phases):
        rounds = [phase for phase in phases if (phase["protocol"], phase["multiple"]) == (protocol, multiple)]
        load = {"protocol": protocol, "multiple": multiple, "failed": sum(phase["failed"] for phase in rounds)}
        for figure in figures.OVERLOAD_LOADS:
            if figure.spread:
                values = [phase[figure.key] for phase in rounds if phase[figure.key] is not None]
                load |= figures.Median.of(values).written(figure.key)
        loads.append(load)
    return loads


def interval_text(load: dict, key: str, digits: int = 2) -> str:
    """`0.89 [0.85, 0.93]`, or the value alone without an interval, or "-"."""
    value, interval = load[key], load[f"{key}_interval"]
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return f"{text} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]" if interval else text


def load_line(load: dict) -> str:
    return (
        f"{load['protocol']} at {load['multiple']:g}x, n={load['goodput_share_n']}: "
        f"goodput {interval_text(load, 'goodput_share')}, wasted {interval_text(load, 'wasted_share')}, "
        f"refused p99 {interval_text(load, 'refused_ms_p99', 0)} ms, "
        f"answered p99 {interval_text(load, 'answered_ms_p99', 0)} ms, "
        f"recovery {interval_text(load, 'recovery_s', 1)} s, failed {load['failed']}"
    )
