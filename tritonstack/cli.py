"""What every command line of the project does alike: help texts that show the
defaults, one-line errors instead of tracebacks, the same exit codes, quiet on a
closed pipe (`| head`), the natural order of file names, and options declared once,
on the typed object they set. Every command module has the same shape:

    def parser() -> argparse.ArgumentParser: ...    # cli.parser(__doc__) + cli.add_options(...)
    def run(args: argparse.Namespace) -> int: ...   # cli.from_args(SomeOptions, args) builds the object
    def main(argv=None) -> int:
        return cli.run(run, argv, parser)

Exit codes: 0 success, 1 the run went through but something failed (a file, a
check), 2 nothing could run (bad option, missing file, no server, unknown model).
`--debug` shows the traceback of an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from tritonstack.address import AddressError

EXIT_OK, EXIT_FAILED, EXIT_NOTHING_RAN = 0, 1, 2
DEBUG_FLAG = "--debug"


class UsageError(Exception):
    """A user's mistake found before anything ran: exit 2 with this message."""


class OptionError(UsageError):
    """Options that parse but do not go together: said as argparse says a bad option."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and "(default: X)" after each option that
    has a default worth telling (not None, not a flag's False)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """A bad option is one line, naming it (argparse's usage block buries it).
    `intermixed`: options may come between positional arguments (`a.jpg --top-k 2 b.jpg`)."""

    def __init__(self, *args, intermixed: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.intermixed = intermixed

    def parse_args(self, args=None, namespace=None):
        if self.intermixed:
            return self.parse_intermixed_args(args, namespace)
        return super().parse_args(args, namespace)

    def error(self, message: str):
        self.exit(EXIT_NOTHING_RAN, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser(description: str | None, **kwargs) -> ArgumentParser:
    """An ArgumentParser with the project's help formatter and --debug (give
    each sub-command's parser --debug too: add_debug_option)."""
    made = ArgumentParser(description=description, formatter_class=HelpFormatter, **kwargs)
    add_debug_option(made)
    return made


def subcommand(commands, name: str, **kwargs) -> ArgumentParser:
    """A sub-command's parser (from add_subparsers()), with the help formatter and --debug."""
    made = commands.add_parser(name, formatter_class=HelpFormatter, **kwargs)
    add_debug_option(made)
    return made


def add_debug_option(parser_: argparse.ArgumentParser) -> None:
    action = parser_.add_argument(DEBUG_FLAG, action="store_true", help="show the traceback of an error")
    action.declared_by = add_debug_option


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number above 0, not {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def comma_separated(convert: Callable = str) -> Callable[[str], tuple]:
    """An argparse type: "a,b,c" -> a tuple of its items, each converted."""

    def parse(text: str) -> tuple:
        return tuple(convert(item) for item in text.split(","))

    return parse


def natural_key(path: Path | str) -> list:
    """c1, c2, c10 (not c1, c10, c2): digit runs compare as numbers."""
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", str(path))]


def error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)


# Errors that are the user's to fix, not the program's: one line, exit 2.
# ConnectionError: no server answers (tritonstack.client.retry.ServerUnavailableError is one).
_USER_ERRORS = (
    UsageError,
    AddressError,
    ConnectionError,
    FileNotFoundError,
    NotADirectoryError,
    PermissionError,
    IsADirectoryError,
)


def run(
    command: Callable, argv: list[str] | None = None, parser_: Callable[[], argparse.ArgumentParser] | None = None
) -> int:
    """command(parser_().parse_args(argv)), or command(argv) without a parser, with the
    project's error handling; returns the exit code."""
    arguments = sys.argv[1:] if argv is None else argv
    debug = DEBUG_FLAG in arguments
    made = parser_() if parser_ is not None else None
    try:
        code = command(argv) if made is None else command(made.parse_args(argv))
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_OK  # the reader (`| head`) had enough: not an error
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except OptionError as problem:
        if made is None or debug:
            raise
        made.error(str(problem))  # exits 2
    except _USER_ERRORS as problem:
        if debug:
            raise
        error(describe(problem))
        return EXIT_NOTHING_RAN
    except Exception as problem:  # a bug or an unforeseen failure: still one line unless --debug
        if debug:
            raise
        error(f"{type(problem).__name__}: {problem} (run again with {DEBUG_FLAG} for the traceback)")
        return EXIT_FAILED


def describe(problem: BaseException) -> str:
    if isinstance(problem, OSError) and problem.filename is not None:
        return f"{problem.filename}: {problem.strerror or problem}"
    return str(problem)


def _silence_stdout() -> None:
    """Python flushes stdout once more at exit: point it at /dev/null so that the
    closed pipe does not raise again there."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (tests capture it)
        pass
    finally:
        os.close(devnull)


def existing_paths(paths: list[Path]) -> list[Path]:
    """The paths, or UsageError naming the first one that does not exist."""
    for path in paths:
        if not path.exists():
            raise UsageError(f"{path}: no such file or folder")
    return paths


def replaced_by(command: str) -> int:
    """What a module that used to run by itself says now: exit 2, naming its command."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    itself = f"python -m {spec.name}" if spec else Path(sys.argv[0]).name
    error(f"{itself} no longer runs by itself: run `{command}` (see {command} --help)")
    return EXIT_NOTHING_RAN


# --- options: each declared once, as metadata of the dataclass field it sets ---
#
#     @dataclass(frozen=True)
#     class ServerConfig:
#         http_port: int = cli.option(0, "--http-port", type=cli.positive_int, command_default=8000)
#
#     cli.add_options(parser, ServerConfig)          # the argparse arguments
#     config = cli.from_args(ServerConfig, args)     # the typed object, from parse_args()
#
# The namespace keeps what was typed, under the flag's own name (args.response_cache_mb);
# from_args turns it into the field's value (response_cache_bytes).

REQUIRED = dataclasses.MISSING  # a field without a default (the command line gives one)
UNSET = object()  # an Option's const or command_default that was not given
_OPTION, _NESTED = "cli.option", "cli.nested"


@dataclasses.dataclass(frozen=True)
class Group:
    """An argument group of --help: the options of one topic, with a line about them."""

    title: str
    description: str | None = None


@dataclasses.dataclass(frozen=True)
class Option:
    """How one field is set from the command line."""

    flag: str
    argparse: dict  # add_argument's keywords: type, help, choices, metavar
    const: object = UNSET  # a flag without a value: the field's value when it is given
    convert: Callable | None = None  # the typed value -> the field's (MiB -> bytes)
    command_default: object = UNSET  # the command line's default, where not the field's
    group: Group | None = None

    @property
    def dest(self) -> str:
        return _dest(self.flag)

    def prefixed(self, prefix: str) -> Option:
        """The same option for one of several alike (compare's --a-layout, --b-layout)."""
        if not prefix:
            return self
        help_ = f"{prefix.upper()}: {self.argparse.get('help', '')}".rstrip(": ")
        return dataclasses.replace(self, flag=f"--{prefix}-{self.flag[2:]}", argparse={**self.argparse, "help": help_})


def _dest(flag: str) -> str:
    """argparse's name for a flag's value: --response-cache-mb -> response_cache_mb (a
    positional argument's flag is its name: `paths`)."""
    return flag.lstrip("-").replace("-", "_")


@dataclasses.dataclass(frozen=True)
class Nested:
    """A field holding another dataclass of options: None when its `off` flag is given
    or `none_if(value)` holds (RecyclePolicy with --recycle-above-mib 0)."""

    cls: type
    off: Option | None = None
    none_if: Callable | None = None
    prefix: str = ""  # its flags are --<prefix>-<flag>


def option(default, flag: str, *, const=UNSET, convert=None, command_default=UNSET, group=None, **argparse_):
    """A dataclass field set by `flag`. A bool field is a flag that sets the other value
    (`--no-summary-latencies` for one that is True by default); `const`: a flag that sets
    this value (`--open-apis` -> ()); the rest are argparse's keywords."""
    if isinstance(default, bool) and const is UNSET:
        const = not default
    spec = Option(flag, argparse_, const, convert, command_default, group)
    return dataclasses.field(default=default, metadata={_OPTION: spec})


def nested(
    cls: type,
    default=REQUIRED,
    *,
    default_factory=REQUIRED,
    off: str | None = None,
    off_help="",
    none_if=None,
    prefix: str = "",
):
    """A field holding a `cls` whose options are this dataclass's too (`prefix`: each
    flag as --<prefix>-<flag>, for one of two alike)."""
    off_option = Option(off, {"help": off_help}, const=None) if off else None
    spec = Nested(cls, off_option, none_if, prefix)
    return dataclasses.field(default=default, default_factory=default_factory, metadata={_NESTED: spec})


def add_options(parser_: argparse.ArgumentParser, cls: type, defaults=None, prefix: str = "") -> None:
    """An argument for each option of the dataclass `cls` and of those it nests.
    `defaults`: an instance whose values the command line shows and uses as defaults
    (computed at run time: MemoryLimits.default()); else each field's default."""
    groups: dict[Group, object] = {}
    for field in dataclasses.fields(cls):
        default = getattr(defaults, field.name) if defaults is not None else _field_default(field)
        if _NESTED in field.metadata:
            spec = field.metadata[_NESTED]
            if spec.off:
                _add(parser_, spec.off.prefixed(prefix), None)
            add_options(parser_, spec.cls, default, spec.prefix or prefix)
        elif _OPTION in field.metadata:
            spec = field.metadata[_OPTION].prefixed(prefix)
            if spec.group and spec.group not in groups:
                groups[spec.group] = parser_.add_argument_group(spec.group.title, spec.group.description)
            _add(groups.get(spec.group, parser_), spec, default)


def _add(parser_, spec: Option, default) -> None:
    """The argparse argument, marked as declared here (tests/test_cli_options.py looks)."""
    if spec.const is not UNSET:
        action = parser_.add_argument(spec.flag, action="store_true", **spec.argparse)
    else:
        shown = default if spec.command_default is UNSET else spec.command_default
        # None is argparse's own default: not given, so that a positional `nargs="*"` is listed as argparse makes it.
        action = parser_.add_argument(spec.flag, **({} if shown is None else {"default": shown}), **spec.argparse)
    action.declared_by = spec


def _field_default(field: dataclasses.Field):
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def from_args(cls: type, args: argparse.Namespace, prefix: str = "", **fixed):
    """A `cls` from parsed arguments; `fixed`: fields the command line does not set.
    A field whose option this parser does not have keeps its default."""
    values = {}
    for field in dataclasses.fields(cls):
        if field.name in fixed:
            continue
        if _NESTED in field.metadata and _given(field.metadata[_NESTED], args, prefix):
            values[field.name] = _nested_value(field.metadata[_NESTED], args, prefix)
        elif _OPTION in field.metadata and hasattr(args, field.metadata[_OPTION].prefixed(prefix).dest):
            spec = field.metadata[_OPTION].prefixed(prefix)
            typed = getattr(args, spec.dest)
            if spec.const is UNSET:
                values[field.name] = spec.convert(typed) if spec.convert else typed
            elif typed:
                values[field.name] = spec.const
    return cls(**values, **fixed)


def _given(spec: Nested, args: argparse.Namespace, prefix: str) -> bool:
    """Whether this parser has any of the nested dataclass's options."""
    own = spec.prefix or prefix
    return any(hasattr(args, _dest(Option(flag, {}).prefixed(own).flag)) for flag in flags(spec.cls))


def _nested_value(spec: Nested, args: argparse.Namespace, prefix: str = ""):
    own = spec.prefix or prefix
    if spec.off and getattr(args, spec.off.prefixed(own).dest):
        return None
    value = from_args(spec.cls, args, own)
    return None if spec.none_if and spec.none_if(value) else value


def to_argv(options, fields: tuple[str, ...] | None = None) -> list[str]:
    """The command line that from_args turns back into `options` (for a process that
    parses its own: Locust's workers); options without a `convert`. `fields`: only these."""
    argv = []
    for field in dataclasses.fields(options):
        if fields is not None and field.name not in fields:
            continue
        spec = field.metadata.get(_OPTION)
        value = getattr(options, field.name)
        if spec is None or value is None:
            continue
        if spec.const is UNSET:
            argv += [spec.flag, str(value)]
        elif value == spec.const:
            argv.append(spec.flag)
    return argv


def flags(cls: type) -> list[str]:
    """Every flag the dataclass `cls` declares, those of the dataclasses it nests included."""
    found = []
    for field in dataclasses.fields(cls):
        if _NESTED in field.metadata:
            spec = field.metadata[_NESTED]
            found += ([spec.off.flag] if spec.off else []) + flags(spec.cls)
        elif _OPTION in field.metadata:
            found.append(field.metadata[_OPTION].flag)
    return found


def changed_flags(options, names: tuple[str, ...]) -> list[str]:
    """The flags of `options`' fields `names` whose values are not their defaults: the
    options a mode does not use, to refuse rather than ignore (overload's --soak)."""
    fields = {field.name: field for field in dataclasses.fields(options)}
    return [
        fields[name].metadata[_OPTION].flag for name in names if getattr(options, name) != _field_default(fields[name])
    ]


def mirror(owner: type, name: str, default=UNSET, **argparse_):
    """A field set as the dataclass `owner`'s field `name` is (its flag, type, choices,
    convert), with another default or help: one option taken by another command as well
    (compare's sides mirror serve's)."""
    source = next(field for field in dataclasses.fields(owner) if field.name == name)
    spec = source.metadata[_OPTION]
    spec = dataclasses.replace(spec, argparse={**spec.argparse, **argparse_}, command_default=UNSET, group=None)
    return dataclasses.field(default=_field_default(source) if default is UNSET else default, metadata={_OPTION: spec})


def out_option(default=None, *, help: str, **argparse_):
    """--out, the one file or folder a command writes: a Path everywhere, its default
    and meaning each command's (required where it has no default)."""
    required = {"required": True} if default is REQUIRED else {}
    return option(None if default is REQUIRED else default, "--out", type=Path, help=help, **required, **argparse_)


# --- option groups more than one command takes: declared here, once ---

DEFAULT_REPOSITORY = Path("model_repository")  # the folder the command runs in, as `make` runs it


@dataclasses.dataclass(frozen=True)
class RepositoryOption:
    """The model repository a command serves or writes."""

    model_repository: Path = option(
        DEFAULT_REPOSITORY,
        "--model-repository",
        type=Path,
        help="the model repository (a server started here serves it)",
    )


RUNNING_SERVER = Group("a running server instead of starting one (e.g. the NGC container)")


@dataclasses.dataclass(frozen=True)
class ServerAddress:
    """A running Triton to use instead of starting one: its HTTP and gRPC addresses."""

    url: str | None = option(None, "--url", group=RUNNING_SERVER, help="HTTP host:port (or http://host:port)")
    grpc_url: str | None = option(None, "--grpc-url", group=RUNNING_SERVER, help="gRPC host:port (or grpc://host:port)")


@dataclasses.dataclass(frozen=True)
class ServerEndpoints(ServerAddress):
    """ServerAddress and the server's Prometheus endpoint, for what it says of itself."""

    metrics_url: str | None = option(
        None, "--metrics-url", group=RUNNING_SERVER, help="host:port or http://host:port/metrics"
    )
