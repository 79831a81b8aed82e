"""The scenarios of `tritonstack benchmark`, in the order they are chosen: the first
one the options ask for runs. Each says itself whether it is asked for
(tritonstack.benchmark.scenario); the serving stack's ratios, asked for by no option,
come last: what a bare `tritonstack benchmark` measures."""

from __future__ import annotations

import sys

from tritonstack import cli
from tritonstack.benchmark import audio_cost, region_speedup, serving_ratios
from tritonstack.benchmark.scenario import Asked, Scenario

SCENARIOS: tuple[Scenario, ...] = (audio_cost.SCENARIO, region_speedup.SCENARIO, serving_ratios.SCENARIO)


def chosen(asked: Asked) -> Scenario:
    """The first scenario the options ask for."""
    return next(scenario for scenario in SCENARIOS if scenario.wanted(asked))


if __name__ == "__main__":
    sys.exit(cli.replaced_by("tritonstack benchmark"))
