"""What the code and the docs point at exists: every file path they name, every
markdown link, every `docs/page.md#anchor` (a heading of that page), every dotted
module name (`tritonstack.x.y`) and every `python -m` target."""

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


# A module as code and prose name it: tritonstack.serve.launcher, tritonstack.cli.option.
DOTTED_NAME = re.compile(r"(?<![\w./-])(tritonstack(?:\.[A-Za-z_]\w*)+)")
# What a reader is told to run: `python -m tritonstack.commands.serve`, `python3 -m pip`.
PYTHON_M = re.compile(r"python3? -m ([A-Za-z_][\w.]*\w)")


def module_file(name: str) -> Path | None:
    path = PROJECT_ROOT.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def defined_names(source: Path) -> set[str]:
    """The names a module defines or imports at its top level."""
    import ast

    names = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(target.id for target in targets if isinstance(target, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def unresolved_module(name: str) -> str | None:
    """None when `name` is a module of the project, or a name its longest module prefix
    defines (tritonstack.cli.option); else why not."""
    parts = name.split(".")
    for length in range(len(parts), 0, -1):
        source = module_file(".".join(parts[:length]))
        if source is None:
            continue
        if length == len(parts) or parts[length].startswith("__") or parts[length] in defined_names(source):
            return None
        return f"{'.'.join(parts[:length])} has no {parts[length]}"
    return "no such module"


def unrunnable(module: str) -> str | None:
    """None when `python -m module` finds it: the project's, or an installed one."""
    import importlib.util

    if module.split(".")[0] == "tritonstack":
        source = module_file(module)
        if source is None:
            return "no such module"
        runs = source.name != "__init__.py" or (source.parent / "__main__.py").is_file()
        return None if runs else "a package without __main__.py"
    try:
        return None if importlib.util.find_spec(module) else "not installed"
    except ModuleNotFoundError:  # its package is not there either
        return "not installed"


def module_references(path: Path) -> list[str]:
    text = path.read_text(errors="replace")
    wrong = [f"{name}: {why}" for name in DOTTED_NAME.findall(text) if (why := unresolved_module(name))]
    return wrong + [f"python -m {name}: {why}" for name in PYTHON_M.findall(text) if (why := unrunnable(name))]


def test_every_named_module_and_python_m_target_exists():
    wrong = [
        f"{path.relative_to(PROJECT_ROOT)}: {problem}" for path in text_files() for problem in module_references(path)
    ]
    assert wrong == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see tritonstack.model_config", "tritonstack has no model_config"),
        ("tritonstack.cli.no_such_name", "has no"),
        ("python -m loadtests.benchmark", "not installed"),
        ("python -m tritonstack.serve.nowhere", "no such module"),
        ("python -m tritonstack.serve --compact-memory", "without __main__"),
    ],
)
def test_the_checker_finds_a_dangling_module(tmp_path, text, expected):
    page = tmp_path / "page.md"
    page.write_text(text)
    assert expected in " ".join(module_references(page))


def test_the_checker_accepts_modules_and_their_names(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("tritonstack.serve.launcher, tritonstack.cli.option, python -m tritonstack, python -m pip")
    assert module_references(page) == []
