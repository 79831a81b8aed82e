"""What the code and the docs point at exists: every file path they name, every
markdown link, every `docs/page.md#anchor` (a heading of that page)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT

# A path inside the repository as text names it: tritonstack/serve/launcher.py, docs/memory.md#pools.
PATH_REFERENCE = re.compile(
    r"(?<![\w./-])((?:tritonstack|tests|clients|deploy|docs|\.ci)/[\w./-]*\w\.(?:py|md|yaml|json|pbtxt|tpl|txt))"
    r"(#[\w-]+)?"
)
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def tracked_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True).stdout
    return [PROJECT_ROOT / name for name in names.split() if (PROJECT_ROOT / name).is_file()]


def text_files() -> list[Path]:
    kinds = (".py", ".md", ".yaml", ".tpl", ".toml", ".txt")
    named = [path for path in tracked_files() if path.suffix in kinds or path.name in ("Makefile", "run")]
    return [path for path in named if path != Path(__file__).resolve()]  # its examples are broken on purpose


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def broken(target: str, anchor: str | None, base: Path) -> str | None:
    path = (base / target).resolve() if target else None
    if path is not None and not path.exists():
        return "no such file"
    if anchor and path is not None and path.suffix == ".md" and anchor.lstrip("#") not in anchors(path):
        return f"no heading {anchor} there"
    return None


def references(path: Path) -> list[tuple[str, str | None, Path]]:
    text = path.read_text(errors="replace")
    found = [(match[1], match[2], PROJECT_ROOT) for match in PATH_REFERENCE.finditer(text)]
    if path.suffix == ".md":
        for link in MARKDOWN_LINK.findall(text):
            if "://" in link or link.startswith("mailto:"):
                continue
            target, _, anchor = link.partition("#")
            found.append((target, f"#{anchor}" if anchor else None, path.parent if target else path))
    return found


def test_every_named_file_and_anchor_exists():
    wrong = []
    for path in text_files():
        for target, anchor, base in references(path):
            if base == path:  # a link to a heading of the same page
                reason = None if anchor.lstrip("#") in anchors(path) else f"no heading {anchor}"
            else:
                reason = broken(target, anchor, base)
            if reason:
                wrong.append(f"{path.relative_to(PROJECT_ROOT)}: {target}{anchor or ''}: {reason}")
    assert wrong == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [("see docs/nowhere.md", "no such file"), ("see docs/memory.md#no-such-heading", "no heading")],
)
def test_the_checker_finds_a_broken_reference(tmp_path, text, expected):
    page = tmp_path / "page.md"
    page.write_text(text)
    ((target, anchor, base),) = references(page)
    assert expected in broken(target, anchor, base)


def test_every_tracked_link_resolves():
    """The chart's files/ are links into the package: a module moved must take them along."""
    names = subprocess.run(["git", "ls-files"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True).stdout
    dangling = [
        name for name in names.split() if (PROJECT_ROOT / name).is_symlink() and not (PROJECT_ROOT / name).exists()
    ]
    assert dangling == []


def test_the_readme_stays_a_short_guide():
    """Detail lives in docs/, linked from the README."""
    assert len((PROJECT_ROOT / "README.md").read_text().splitlines()) <= 220
