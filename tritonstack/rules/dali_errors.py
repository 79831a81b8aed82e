"""DALI's error text, as a person should read it: the lines that say something.

A failed `Pipeline.run()` raises a RuntimeError whose text starts with "Critical
error in pipeline:" and ends with "Current pipeline object is no longer valid.":
neither tells what went wrong. The dali backend answers a client with the rest,
`tritonstack check` reports its first line.
"""

from __future__ import annotations

NOISE = ("Critical error in pipeline:", "Current pipeline object is no longer valid.")


def meaningful_lines(error: BaseException) -> list[str]:
    """The error's non-empty lines less DALI's framing ones, stripped."""
    lines = (line.strip() for line in str(error).splitlines())
    return [line for line in lines if line and line not in NOISE]
