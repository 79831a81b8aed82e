"""What a scenario of `tritonstack benchmark` is: a name, whether the options ask for
it, a run that returns its figures as one JSON object (rendered by its registry in
tritonstack.measure.figures), and how that object is written. tritonstack.benchmark.run
lists the scenarios."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tritonstack.measure.load_settings import Settings
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import as_served
from tritonstack.serve.target import GivenServer


@dataclass(frozen=True)
class Asked:
    """What the command line asks of the benchmark: how long the load loops measure,
    the repository the server serves, the scenarios' own options, and the report's file."""

    settings: Settings
    repository: Path
    out: Path
    regions: int | None = None  # boxes per request: the regions scenario
    audio: bool = False

    @property
    def loadgen_dir(self) -> Path:
        """LoadGen's own logs, kept beside the report."""
        return self.out.parent / f"{self.out.stem}_loadgen"


class Scenario(Protocol):
    name: str

    def wanted(self, asked: Asked) -> bool:
        """Whether the options ask for this scenario."""

    def run(self, asked: Asked, server: TritonServer | GivenServer | None, log: Callable[[str], None]) -> dict:
        """Its figures, on `server` if given, else on a server it starts."""

    def write(self, results: dict, asked: Asked) -> str:
        """Write `results` to asked.out; return what the command prints."""


def on_server(measure, repository: Path, server: TritonServer | GivenServer | None):
    """measure(server) on the given server, or on one started for it."""
    if server is not None:
        return measure(server)
    with TritonServer(as_served(repository)) as started:
        return measure(started)


def write_json(results: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
