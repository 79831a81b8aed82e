"""What every command line of the project does alike: help texts that show the
defaults, one-line errors instead of tracebacks, the same exit codes, quiet on a
closed pipe (`| head`), and the natural order of file names.

    def main(argv=None) -> int: ...
    if __name__ == "__main__":
        sys.exit(cli.run(main))

Exit codes: 0 success, 1 the run went through but something failed (a file, a
check), 2 nothing could run (bad option, missing file, no server, unknown model).
`--debug` shows the traceback of an error.
"""

from __future__ import annotations

import argparse
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


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and "(default: X)" after each option that
    has a default worth telling (not None, not a flag's False)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """A bad option is one line, naming it (argparse's usage block buries it)."""

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
    parser_.add_argument(DEBUG_FLAG, action="store_true", help="show the traceback of an error")


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


def run(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """main(argv) with the project's error handling; returns the exit code."""
    arguments = sys.argv[1:] if argv is None else argv
    debug = DEBUG_FLAG in arguments
    try:
        code = main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_OK  # the reader (`| head`) had enough: not an error
    except KeyboardInterrupt:
        error("interrupted")
        return 130
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
