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


def load_line(load: dict) -> str:
    def median(key: str, form: str = ".2f") -> str:
        return figures.Median.read(load, key).text(form)

    return (
        f"{load['protocol']} at {load['multiple']:g}x: goodput {median('goodput_share')}, "
        f"wasted {median('wasted_share')}, refused p99 {median('refused_ms_p99', '.0f')} ms, "
        f"answered p99 {median('answered_ms_p99', '.0f')} ms, recovery {median('recovery_s', '.1f')} s, "
        f"failed {load['failed']}"
    )
