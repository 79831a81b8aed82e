"""The figures' registry (tritonstack.measure.figures) written out for readers: each
group's table in a docs page between its markers, and a module docstring's list of keys.

    python -m tritonstack.measure.figures_page docs/performance.md
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tritonstack import cli
from tritonstack.measure.figures import GROUPS, Figure


def docstring_listing(figures: tuple[Figure, ...], width: int = 88) -> str:
    """The keys, wrapped as prose lines for a module docstring."""
    lines, line = [], ""
    for key in (figure.key for figure in figures):
        if line and len(line) + len(key) + 2 > width:
            lines.append(line + ",")
            line = ""
        line = f"{line}, {key}" if line else key
    return "\n".join([*lines, line + "."])


def _target_text(figure: Figure) -> str:
    if figure.target is None:
        return ""
    sense, value = figure.target
    text = f"{'≥' if sense == '>=' else '≤'} {value:g}"
    return f"{text} (ceiling: `{figure.ceiling}`)" if figure.ceiling else text


def markdown_table(figures: tuple[Figure, ...]) -> str:
    rows = ["| key | unit | target | meaning |", "|---|---|---|---|"]
    for figure in figures:
        key = f"`{figure.key}`" + (" [median]" if figure.spread else "")
        rows.append(f"| {key} | {figure.unit} | {_target_text(figure)} | {figure.meaning} |")
    return "\n".join(rows)


def _marker(group: str) -> re.Pattern:
    return re.compile(rf"(<!-- figures:{group} -->\n)(?:.*?\n)?(<!-- /figures:{group} -->)", re.DOTALL)


def rendered_docs(text: str) -> str:
    """`text` (docs/performance.md) with each group's table rendered between its markers."""
    for group, figures in GROUPS.items():
        text = _marker(group).sub(lambda match, f=figures: match[1] + markdown_table(f) + "\n" + match[2], text)
    return text


@dataclass(frozen=True)
class RenderOptions:
    page: Path = cli.option(None, "page", type=Path, help="the page, e.g. docs/performance.md")


def main(argv: list[str] | None = None) -> int:
    """python -m tritonstack.measure.figures_page docs/performance.md: render its tables."""
    parser = argparse.ArgumentParser(
        description="Render each group's table of figures into a docs page, between its markers."
    )
    cli.add_options(parser, RenderOptions)
    page = cli.from_args(RenderOptions, parser.parse_args(argv)).page
    page.write_text(rendered_docs(page.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
