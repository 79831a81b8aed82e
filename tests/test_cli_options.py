"""Every command's options go through the one mechanism (tritonstack.cli: `cli.option`
fields of a dataclass, `cli.add_options`), one flag means one type and one default
across the commands, and what `--help` lists stays as it was (tests/cli_options.json).

After a deliberate change of an option, write the listing again:
    python -c 'import tests.test_cli_options as t; t.write_listing()'
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
from collections import defaultdict

from tests.conftest import PROJECT_ROOT
from tritonstack.__main__ import COMMANDS

LISTING = PROJECT_ROOT / "tests" / "cli_options.json"
# Defaults computed from this machine (its memory): their flags are compared, not their values.
MACHINE_DEFAULTS = {"--server-memory-bytes", "--stub-memory-bytes"}
# Flags whose meaning is each command's own, so each command says its default:
# what it writes (--out), its load (--seconds, --concurrency, --workers, ...), its format.
PER_COMMAND = {
    "--out",
    "--model",
    "--format",
    "--seconds",
    "--concurrency",
    "--batch-size",
    "--workers",
    "--max-requests",
    "--warmup-s",
    "--top-k",
    "--boxes",
    "--deadline-ms",
    "--p99-ms",
    "--target-rps",
    "--protocol",
    "--layout",
    "--latency-objective-ms",
}


# serve's --model-repository is also s3://..., gs://... (kept as text: a Path folds "//").
OWN_TYPE = {("serve", "--model-repository")}


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each command module's parser (build's holds list, check and parity)."""
    modules = sorted({module for module, _, _ in COMMANDS.values()})
    return {module.rsplit(".", 1)[1]: importlib.import_module(module).parser() for module in modules}


def options(parser: argparse.ArgumentParser, name: str):
    """(where, action) for every argument of the parser and of its sub-commands'."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from options(sub, f"{name} {sub_name}")
        elif not isinstance(action, argparse._HelpAction):
            yield name, action


def every_option():
    for name, parser in command_parsers().items():
        yield from options(parser, name)


def flag(action: argparse.Action) -> str:
    return "|".join(action.option_strings) or action.dest


def described(action: argparse.Action) -> dict:
    default = "<this machine's>" if flag(action) in MACHINE_DEFAULTS else repr(action.default)
    return {
        "default": default,
        "type": getattr(action.type, "__name__", repr(action.type)),
        "required": action.required,
        "choices": sorted(map(str, action.choices)) if action.choices else None,
        "nargs": repr(action.nargs),
        "action": type(action).__name__,
    }


def listing() -> dict:
    found: dict = defaultdict(dict)
    for where, action in every_option():
        found[where][flag(action)] = described(action)
    return dict(found)


def write_listing() -> None:
    LISTING.write_text(json.dumps(listing(), indent=1, sort_keys=True) + "\n")


def test_twelve_commands_are_enumerated():
    assert len(command_parsers()) == 12


def test_every_option_is_declared_through_the_mechanism():
    outside = [f"{where}: {flag(action)}" for where, action in every_option() if not hasattr(action, "declared_by")]
    assert outside == []


def test_one_flag_has_one_type_and_one_default_across_commands():
    seen = defaultdict(set)
    for where, action in every_option():
        if action.option_strings and flag(action) not in PER_COMMAND and (where, flag(action)) not in OWN_TYPE:
            seen[flag(action)].add((described(action)["type"], described(action)["default"], where))
    differing = {
        name: sorted(uses) for name, uses in seen.items() if len({(kind, default) for kind, default, _ in uses}) > 1
    }
    assert differing == {}


def test_help_lists_the_same_options_with_the_same_defaults():
    assert listing() == json.loads(LISTING.read_text())


def test_the_checks_find_an_option_declared_by_hand():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-repository", default="model_repository")
    ((_, action),) = [(where, action) for where, action in options(parser, "x") if action.option_strings]
    assert not hasattr(action, "declared_by")
    assert described(action)["default"] != repr(importlib.import_module("tritonstack.cli").DEFAULT_REPOSITORY)


# Modules that build a parser by hand, and why they may not use tritonstack.cli.
BY_HAND = {
    "tritonstack/serve/warmup_request.py": "the Helm chart's probe in the NGC image: the standard library only",
    "tritonstack/gpu/gpu_pieces.py": "unpacks the dependencies on a GPU machine: the standard library only",
    "tritonstack/loadtests/locustfile.py": "Locust's own parser: --grpc-url beside load_options' table",
}


def modules_declaring_arguments() -> set[str]:
    """Every module of the package but cli.py with an `add_argument(...)` call."""
    found = set()
    for path in sorted((PROJECT_ROOT / "tritonstack").rglob("*.py")):
        tree = ast.parse(path.read_text())
        calls = (node for node in ast.walk(tree) if isinstance(node, ast.Call))
        if any(isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument" for call in calls):
            found.add(path.relative_to(PROJECT_ROOT).as_posix())
    return found - {"tritonstack/cli.py"}


def test_no_tool_of_the_package_declares_options_by_hand_without_a_reason():
    assert modules_declaring_arguments() == set(BY_HAND)
