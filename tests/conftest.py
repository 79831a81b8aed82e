"""Shared fixtures: the built model repository and one real tritonserver per test
session, on free loopback ports, always stopped at the end."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from filelock import FileLock

from tritonstack.build.audio import AUDIO_PRESETS
from tritonstack.build.presets import BuildOptions
from tritonstack.build.repository import write_repository
from tritonstack.serve import batch_cost
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import ServerConfig

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = PROJECT_ROOT / "model_repository"


@pytest.fixture(scope="session", autouse=True)
def batch_cost_cache(tmp_path_factory):
    """The classifiers' batch cost curves (tritonstack.serve.batch_cost) measured once for
    the run, shared by its workers and the servers they start, not in the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(batch_cost.CACHE_ENV, str(tmp_path_factory.getbasetemp().parent / "cache"))
        yield


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory) -> Path:
    # `make test` has built it; this makes a bare `pytest` work too (cheap when built).
    # One writer at a time: each pytest worker asks for it (their temporary folders share a parent).
    with FileLock(tmp_path_factory.getbasetemp().parent / "model_repository.lock"):
        write_repository(MODEL_REPOSITORY, audio_presets=AUDIO_PRESETS)
    return MODEL_REPOSITORY


@pytest.fixture(scope="session")
def lite0_repository(tmp_path_factory, model_repository) -> Path:
    """Only the dali_efficientnet_lite0 preset (three models): a server of its own starts fast."""
    from tests import repo_factory as rf
    from tritonstack.build.presets import preset_named

    out = tmp_path_factory.mktemp("lite0")
    rf.seed_lite0_export(out)
    write_repository(out, presets=(preset_named("dali_efficientnet_lite0"),), options=FUNCTIONAL_BUILD)
    return out


# Triton 2.51 waits its whole exit timeout at shutdown while any HTTP client keeps an
# idle connection open, or a model it could not load or unload (docs/operations.md):
# a test server stopped with nothing in flight needs no more than this.
TEST_STOP_GRACE_S = 1


# The session server is shared by every functional test: a transient stall of this
# machine (a stub recycled after another test's burst, a pipeline rebuilt after a bad
# image) must not refuse their interactive requests at the default objective's 300 ms.
# The objective itself is tested on servers of its own (tests/test_overload.py).
SESSION_OBJECTIVE_MS = 60_000
# The same for the repositories functional tests build for servers of their own.
FUNCTIONAL_BUILD = BuildOptions(latency_objective_ms=SESSION_OBJECTIVE_MS)


@pytest.fixture(scope="session")
def session_repository(model_repository, tmp_path_factory) -> Path:
    """The committed repository built again with the session's objective, in this
    worker's folder: its server loads each step once (the same objective applied at
    load, `latency_objective_ms`, loads every step twice: ~10 s more a server)."""
    out = tmp_path_factory.mktemp("session") / MODEL_REPOSITORY.name
    shutil.copytree(model_repository, out)
    write_repository(out, audio_presets=AUDIO_PRESETS, options=FUNCTIONAL_BUILD)
    return out


@pytest.fixture(scope="session")
def server(session_repository):
    with TritonServer(ServerConfig(session_repository, stop_grace_s=TEST_STOP_GRACE_S)) as running:
        yield running


def served_instances(server: TritonServer, model: str) -> int:
    """How many instances of `model` the running server loaded (its layout may not be
    the repository's)."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        return int(client.get_model_config(model)["instance_group"][0]["count"])
