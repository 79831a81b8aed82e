"""The package's rooms stay apart: build/, serve/ and client/ never import each
other, nothing imports in a circle, the backends use only the shared modules, and
the client installs and runs without the server stack."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT
from tritonstack.samples.photos import photo_path

PACKAGE = PROJECT_ROOT / "tritonstack"
ROOMS = ("tritonstack.build", "tritonstack.serve", "tritonstack.client")
# The shared modules: what the rooms agree on, at the package's root and in its
# shared sub-packages (media/, rules/, samples/), and the backends' settings.
SHARED_PACKAGES = ("tritonstack.media", "tritonstack.rules", "tritonstack.samples")
SHARED_ROOT = ("tritonstack.contract", "tritonstack.repository_files", "tritonstack.address", "tritonstack.cli")
SHARED = (
    *SHARED_ROOT,
    *SHARED_PACKAGES,
    "tritonstack.backends",
    "tritonstack.backends.settings",
    *(
        f"{package}.{path.stem}"
        for package in SHARED_PACKAGES
        for path in sorted((PACKAGE / package.split(".")[1]).glob("*.py"))
        if path.stem != "__init__"
    ),
)
# What the backends use and nothing else may (stub_memory imports the stub's pb_utils).
BACKEND_SHARED = (
    "tritonstack.backends.stub_memory",
    "tritonstack.backends.residency",
    "tritonstack.backends.cancellation",
)
# Tools that run the stack and measure it: they may use every room; no room, shared
# module or other tool imports them.
TOOLS = (
    "tritonstack.benchmark",
    "tritonstack.experiments",
    "tritonstack.gpu",
    "tritonstack.diagnostics",
    "tritonstack.loadtests",
)
# The measurement engine the tools share: it may use every room, and imports no tool.
ENGINE = "tritonstack.measure"
# One module per sub-command (its parser and main): they may use every room and tool;
# only the `tritonstack` entry point imports them.
COMMANDS = "tritonstack.commands"
ENTRY_POINT = "tritonstack.__main__"
# What a client user must not have to install (or pay for at import).
SERVER_STACK = (
    "nvidia.dali",
    "pytriton",
    "psutil",
    "torch",
    "onnxruntime",
    "onnx",
    "tritonstack.serve",
    "tritonstack.backends.settings",
    "tritonstack.build",
    "skimage",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project modules a file imports, at any depth of the file (lazy imports
    inside functions count too): `from a.b import c` is a.b.c when that is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in known}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: imported_modules(path, set(files)) - {name} for name, path in files.items()}


def room_of(module: str) -> str | None:
    return next((room for room in ROOMS if module == room or module.startswith(room + ".")), None)


def test_rooms_never_import_each_other():
    crossings = [
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        for target in targets
        if room_of(module) and room_of(target) and room_of(module) != room_of(target)
    ]
    assert crossings == []


def tool_of(module: str) -> str | None:
    return next((tool for tool in TOOLS if module == tool or module.startswith(tool + ".")), None)


def test_nothing_imports_a_tool_but_the_tool_itself():
    wrong = [
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        for target in targets
        if tool_of(target) and tool_of(target) != tool_of(module) and not is_command(module)
    ]
    assert wrong == []


def test_the_engine_imports_no_tool_and_no_command():
    wrong = [
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        for target in targets
        if module.startswith(ENGINE + ".") and (tool_of(target) or target.startswith(COMMANDS + "."))
    ]
    assert wrong == []


def test_only_tools_and_commands_import_the_engine():
    wrong = [
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        for target in targets
        if target.startswith(ENGINE + ".")
        and not (module.startswith(ENGINE + ".") or tool_of(module) or is_command(module))
    ]
    assert wrong == []


def is_command(module: str) -> bool:
    return module == ENTRY_POINT or module.startswith(COMMANDS + ".")


def test_only_the_entry_point_imports_a_command():
    wrong = [
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        for target in targets
        if target.startswith(COMMANDS + ".") and module != ENTRY_POINT
    ]
    assert wrong == []


def test_every_command_is_a_module_of_its_name():
    """`tritonstack NAME` runs tritonstack/commands/<name>.py (build's siblings list,
    check and parity share build.py), each with main(argv)."""
    from tritonstack.__main__ import COMMANDS as TABLE

    for name, (module, _, _) in TABLE.items():
        own = "build" if name in ("list", "check", "parity") else name
        assert module == f"{COMMANDS}.{own}", (name, module)
        assert (PACKAGE / "commands" / f"{own}.py").is_file()


# overload.py: its owner converts it to the template.


def test_every_command_module_has_parser_run_and_main():
    """One template: parser() -> ArgumentParser, run(args) -> int, main(argv) = cli.run(run, argv, parser)."""
    import importlib
    import inspect

    names = sorted(path.stem for path in (PACKAGE / "commands").glob("*.py") if path.stem != "__init__")
    assert "serve" in names and "build" in names
    for name in sorted(names):
        module = importlib.import_module(f"{COMMANDS}.{name}")
        for function in ("parser", "run", "main"):
            assert callable(getattr(module, function, None)), f"{name}.py has no {function}()"
        assert list(inspect.signature(module.parser).parameters) == [], name
        assert list(inspect.signature(module.run).parameters) == ["args"], name
        assert "cli.run(run, argv, parser)" in inspect.getsource(module.main), name


def runnable_modules() -> list[str]:
    """Every module of the package with a `__main__` guard: what `python -m` runs."""
    guard = re.compile(r"^if __name__ == .__main__.:", re.MULTILINE)
    paths = list(PACKAGE.rglob("*.py"))
    return sorted(module_name(path) for path in paths if guard.search(path.read_text()))


def test_every_runnable_module_runs_its_command_or_names_the_one_that_replaced_it():
    """No silent entry point: `python -m X --help` prints a usage, or exits non-zero
    saying which `tritonstack ...` command to run instead."""
    modules = runnable_modules()
    assert {"tritonstack.loadtests.headless", "tritonstack.benchmark.run", "tritonstack.commands.serve"} <= set(modules)

    def help_of(module: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT
        )

    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = dict(zip(modules, pool.map(help_of, modules)))
    for module, done in answers.items():
        if done.returncode == 0:
            assert "usage:" in done.stdout.lower(), (module, done.stdout[-500:], done.stderr[-500:])
        else:
            assert "`tritonstack " in done.stderr and "Traceback" not in done.stderr, (module, done.stderr[-500:])


def test_no_sys_path_edits_outside_tests():
    """Modules import each other as a package."""
    sources = [
        *PACKAGE.rglob("*.py"),
        *(PROJECT_ROOT / "clients").rglob("*.py"),
        PROJECT_ROOT / "build_pipelines.py",
    ]
    edits = [str(path) for path in sources if "sys.path" in path.read_text()]
    assert edits == []


def test_no_function_over_60_lines():
    """Short functions: a newcomer reads one on a screen."""
    sources = [
        path
        for folder in ("tritonstack", "clients", "deploy", "tests")
        for path in (PROJECT_ROOT / folder).rglob("*.py")
    ]
    long = [
        f"{path.relative_to(PROJECT_ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sources
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60
    ]
    assert long == []


def test_few_modules_loose_at_the_package_root():
    """Shared modules live in named homes (media/, rules/, samples/); the root keeps
    the entry point and the few every room needs."""
    loose = sorted(path.name for path in PACKAGE.glob("*.py") if path.name not in ("__init__.py", "__main__.py"))
    assert len(loose) <= 6, loose


NAME_COLUMN_END = 20  # the layout tree's names stop before this column, its descriptions start after


def listed_paths(layout: str) -> set[str]:
    """The files docs/architecture.md's layout tree names, by path: each `name.py` of a
    line belongs to the innermost folder (`media/`, `  dali/`) opened above it."""
    tree = layout.split("# Project layout", 1)[1].split("```")[1]
    folders: list[tuple[int, str]] = []  # (indent, folder) from the root in
    found = set()
    for line in tree.splitlines():
        head = re.match(r"( *)(\S+)", line)
        if head and len(head[1]) < NAME_COLUMN_END:  # a line of the name column: a folder or a file
            indent = len(head[1])
            folders = [(i, f) for i, f in folders if i < indent]
            folders += [(indent, head[2])] if head[2].endswith("/") else []
        where = "".join(folder for _, folder in folders)
        found.update(where + name for name in re.findall(r"(?<![\w/.])(\w+\.py)\b", line))
    return found


def test_architecture_lists_every_module_by_path_and_the_docstring_every_sub_package():
    layout = (PROJECT_ROOT / "docs" / "architecture.md").read_text()
    listed = listed_paths(layout)
    unlisted = sorted(
        str(path.relative_to(PROJECT_ROOT))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" and str(path.relative_to(PROJECT_ROOT)) not in listed
    )
    assert unlisted == []
    import tritonstack

    sub_packages = sorted(path.parent.name for path in PACKAGE.glob("*/__init__.py"))
    assert [name for name in sub_packages if f"{name}/" not in layout] == []
    assert [name for name in sub_packages if f"`{name}/`" not in tritonstack.__doc__] == []


def test_the_layout_reader_places_a_name_in_its_folder():
    tree = (
        "# Project layout\n```\ntritonstack/  the package\n  serve/      launcher.py,\n"
        + " " * 26
        + "limits.py\n  cli.py\n```"
    )
    assert listed_paths(tree) == {"tritonstack/serve/launcher.py", "tritonstack/serve/limits.py", "tritonstack/cli.py"}


def test_no_two_modules_share_a_file_name_but_model_py():
    """A name says which module it is: a command and its engine, two settings.py, never.
    The chart's files/ are links to the package's modules (Helm reads only inside the
    chart), not modules of their own."""
    sources = [*PACKAGE.rglob("*.py"), *(PROJECT_ROOT / "deploy").rglob("*.py")]
    sources += (PROJECT_ROOT / "tests").rglob("*.py")
    names = [path.name for path in sources if not path.is_symlink() and path.name not in ("__init__.py", "model.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []


def test_no_module_outside_tests_over_500_lines():
    sources = [
        *PACKAGE.rglob("*.py"),
        *(PROJECT_ROOT / "clients").rglob("*.py"),
        *(PROJECT_ROOT / "deploy").rglob("*.py"),
    ]
    long = {str(path): n for path in sources if (n := len(path.read_text().splitlines())) > 500}
    assert long == {}


def test_shared_modules_import_no_room():
    graph = import_graph()
    wrong = [f"{module} imports {target}" for module in SHARED for target in graph[module] if room_of(target)]
    assert wrong == []


def test_no_import_cycle():
    graph = import_graph()
    state: dict[str, str] = {}  # "visiting" or "done"

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "visiting"
        for target in sorted(graph[module]):
            if state.get(target) == "visiting":
                return path + [module, target]
            if target not in state and (cycle := visit(target, path + [module])):
                return cycle
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [])
            assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle(monkeypatch):
    # The check above must be able to fail: feed it a two-module circle.
    monkeypatch.setattr(sys.modules[__name__], "import_graph", lambda: {"a": {"b"}, "b": {"a"}})
    with pytest.raises(AssertionError, match="a -> b -> a"):
        test_no_import_cycle()


@pytest.mark.parametrize("backend", ["dali", "onnxruntime"])
def test_backends_use_only_the_shared_modules(backend):
    """A backend runs inside a Python backend stub: its own modules and the shared
    ones, never a room (build/, serve/, client/) nor the other backend."""
    own = f"tritonstack.backends.{backend}"
    known = {module_name(p) for p in PACKAGE.rglob("*.py")}
    used = set().union(*(imported_modules(path, known) for path in (PACKAGE / "backends" / backend).glob("*.py")))
    foreign = {name for name in used if name != own and not name.startswith(own + ".")}
    assert used and foreign <= set(SHARED) | set(BACKEND_SHARED) | {"tritonstack"}, foreign


def test_backends_live_in_the_package_only():
    assert not (PROJECT_ROOT / "backends").exists()
    from tritonstack.backends import BACKENDS, entry_point

    for backend in BACKENDS:
        assert (PACKAGE / "backends" / backend / "model.py").is_file()
        assert f"tritonstack.backends.{backend}.model import TritonPythonModel" in entry_point(backend)


def test_copied_model_files_import_nothing_of_the_project():
    # They are copied verbatim into version folders and serve in the NGC container.
    known = {module_name(p) for p in PACKAGE.rglob("*.py")} | {"tritonstack"}
    for name in ("pillow_model.py", "dali_model.py"):
        assert imported_modules(PACKAGE / "build" / name, known) == set(), name


def test_copied_model_files_use_the_contract_tensor_names():
    from tritonstack import contract
    from tritonstack.build import dali_model, pillow_model

    for module in (dali_model, pillow_model):
        assert (module.INPUT_NAME, module.OUTPUT_NAME) == (contract.PREPROCESS_INPUT, contract.PREPROCESS_OUTPUT)


def test_importing_the_client_loads_no_server_stack():
    code = (
        "import json, sys\n"
        "import tritonstack.client, tritonstack.client.classifier, tritonstack.client.aio\n"
        "import tritonstack.client.runner, tritonstack.client.shm, tritonstack.client.images\n"
        "import tritonstack.commands.classify, tritonstack.commands.evaluate\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=PROJECT_ROOT
        ).stdout
    )
    heavy = [name for name in loaded if any(name == m or name.startswith(m + ".") for m in SERVER_STACK)]
    assert heavy == []
    assert "tritonstack.client.classifier" in loaded  # the probe did import the client


def reachable(graph: dict[str, set[str]], starts: set[str]) -> set[str]:
    """Every module that `starts` import, directly or through others."""
    seen, todo = set(), list(starts)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


# The client's commands: what `pip install "tritonstack[client]"` runs.
CLIENT_COMMANDS = ("tritonstack.commands.classify", "tritonstack.commands.evaluate")


def test_the_client_path_imports_none_of_the_launchers_settings():
    """What the launcher tells the backends (tritonstack.backends.settings: memory
    tuning, the repository's location) is no client's business: nothing the client
    room, its commands or the wire contract import, at any depth, reaches it."""
    graph = import_graph()
    client = {module for module in graph if room_of(module) == "tritonstack.client"}
    reached = reachable(graph, client | set(CLIENT_COMMANDS) | {"tritonstack.contract"})
    assert "tritonstack.client.classifier" in reached and "tritonstack.contract" in reached
    assert {"tritonstack.backends.settings", "tritonstack.serve"} & reached == set()
    assert not [module for module in reached if room_of(module) in ("tritonstack.serve", "tritonstack.build")]


def test_the_wire_contract_names_no_environment_but_the_admin_key():
    """contract.py is what both ends of the wire agree on; environment variables the
    launcher sets for the backends live in tritonstack/backends/settings.py."""
    import tritonstack.backends.settings as settings
    import tritonstack.contract as contract

    env_names = {name for name in vars(contract) if name.endswith("_ENV")}
    assert env_names == {"ADMIN_KEY_ENV"}
    assert {"REPOSITORY_ENV", "MAX_INPUT_BYTES_ENV", "DALI_HOST_POOL_ENV", "POOL_RESIDENCY_ENV"} <= set(vars(settings))


def wheelhouse() -> Path:
    """Wheels of the client extra, saved by `make install` (no network in tests)."""
    return Path(sys.prefix) / "wheelhouse"


@pytest.mark.timeout(600)
def test_client_extra_installs_alone_and_classifies(tmp_path, server):
    if not any(wheelhouse().glob("tritonclient-*.whl")):
        pytest.fail(f"no client wheels in {wheelhouse()}: run `make install`")
    env_dir = tmp_path / "client-venv"
    # No pip of its own (ensurepip would add seconds to every run): this venv's pip
    # installs into it and lists it, as `pip --python` does for a user. --no-compile:
    # Python compiles what the command imports when it imports it.
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PIP_CONSTRAINT")}
    subprocess.run(
        [
            *pip,
            "install",
            "--quiet",
            "--no-compile",
            "--no-index",
            "--find-links",
            str(wheelhouse()),
            "-c",
            str(PROJECT_ROOT / "constraints.txt"),
            f"{PROJECT_ROOT}[client]",
        ],
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=540,
    )
    installed = subprocess.run(
        [*pip, "list", "--format=json"], check=True, capture_output=True, text=True, env=env
    ).stdout
    names = {package["name"].lower() for package in json.loads(installed)}
    assert not names & {"nvidia-pytriton", "nvidia-dali-cuda120", "onnxruntime", "torch", "psutil"}, names

    result = subprocess.run(
        [
            str(python),
            "-m",
            "tritonstack",
            "classify",
            "--url",
            server.http_url,
            "--format",
            "jsonl",
            str(photo_path("coffee.png")),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert json.loads(line)["top"][0]["label"] == "espresso", line
