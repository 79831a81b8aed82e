"""Interleaved rounds: each measure once per round, A, B, A, B, so that drift on a
shared machine moves both sides of a ratio alike; and the per-round ratios."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")  # what a measure returns: a load loop's Phase, a LoadGen result


def interleaved(measures: dict[str, Callable[[], T]], repeats: int, log=print) -> dict[str, list[T]]:
    """Each measure once per round, in the same order, `repeats` rounds: A, B, A, B...
    so that a machine that slows down or speeds up during the run moves both sides
    of a ratio alike."""
    rounds: dict[str, list[T]] = {name: [] for name in measures}
    for round_index in range(repeats):
        log(f"  round {round_index + 1}/{repeats}: {', '.join(measures)}")
        for name, measure in measures.items():
            rounds[name].append(measure())
    return rounds


def ratios(numerators: list[float | None], denominators: list[float | None]) -> list[float]:
    """Per round; a round with an empty or unmeasurable side gives no ratio."""
    return [a / b for a, b in zip(numerators, denominators) if a is not None and b]
