"""Locked-down defaults of the launcher, against the session's real tritonserver:
admin APIs need the key header on both protocols, inference and health do not;
a non-loopback bind is warned about; a request above the size limit is refused
by the `dali` backend on both protocols and the server keeps serving."""

from __future__ import annotations

import argparse
import logging

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tritonstack import cli
from tritonstack.client.classifier import ClassifierClient
from tritonstack.client.options import ServerOptions
from tritonstack.client.retry import is_retryable
from tritonstack.contract import ADMIN_HEADER, ADMIN_KEY_ENV, DEFAULT_MODEL
from tritonstack.samples.photos import photo_bytes
from tritonstack.serve import security
from tritonstack.serve.launcher import ServerStartError, TritonServer
from tritonstack.serve.network import is_loopback
from tritonstack.serve.server_config import ServerConfig

# One read-only client call per restricted API (same names in both tritonclients).
RESTRICTED_CALLS = {
    "model-repository": "get_model_repository_index",
    "statistics": "get_inference_statistics",
    "shared-memory": "get_system_shared_memory_status",
    "trace": "get_trace_settings",
    "logging": "get_log_settings",
}
# Triton 2.51 answers gRPC UNAVAILABLE here: a client that retries UNAVAILABLE
# must not keep retrying a refused admin call.
REFUSED = {"http": "403", "grpc": "StatusCode.UNAVAILABLE"}


def client_for(server, protocol):
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("api", sorted(RESTRICTED_CALLS))
def test_admin_api_needs_the_key(server, api, protocol):
    call = getattr(client_for(server, protocol), RESTRICTED_CALLS[api])
    for headers in (None, {name: "not-the-key" for name in server.admin_headers(protocol)}):
        with pytest.raises(InferenceServerException) as refused:
            call(headers=headers)
        assert str(refused.value.status()) == REFUSED[protocol]
        assert ADMIN_HEADER in refused.value.message()  # says which header it wants
        assert not is_retryable(refused.value)  # a missing key is not a server restart
    call(headers=server.admin_headers(protocol))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inference_health_and_metadata_stay_open(server, protocol):
    url = server.http_url if protocol == "http" else server.grpc_url
    plain = client_for(server, protocol)
    assert plain.is_server_live() and plain.is_server_ready()
    assert plain.get_model_metadata("ensemble_dali_efficientnet_lite0")
    with ClassifierClient(url, protocol) as client:  # no headers at all
        assert client.classify([photo_bytes("coffee.png")], top_k=1)[0][0].label == "espresso"


def test_admin_key_comes_from_the_environment(model_repository, monkeypatch):
    monkeypatch.setenv(ADMIN_KEY_ENV, "key-from-env")
    configured = TritonServer(model_repository)
    assert configured.admin_headers("http") == {ADMIN_HEADER: "key-from-env"}
    assert configured.admin_headers("grpc") == {f"triton-grpc-protocol-{ADMIN_HEADER}": "key-from-env"}
    monkeypatch.delenv(ADMIN_KEY_ENV)
    assert TritonServer(model_repository).admin_key != TritonServer(model_repository).admin_key  # random each


def test_a_random_key_never_reads_as_an_option():
    # One urlsafe token in 64 starts with "-", and `classify.py --admin-key KEY` then fails.
    assert not any(security.admin_key().startswith("-") for _ in range(2000))


def test_the_clients_take_a_key_that_starts_with_a_dash():
    parser = argparse.ArgumentParser()
    cli.add_options(parser, ServerOptions)
    assert parser.parse_args(["--admin-key=-k3y"]).admin_key == "-k3y"


def test_a_key_triton_would_misparse_is_refused(model_repository):
    with pytest.raises(ValueError, match=ADMIN_KEY_ENV):
        TritonServer(ServerConfig(model_repository, admin_key="a:b=c"))


def test_restrictions_can_be_lifted(model_repository):
    command = " ".join(TritonServer(ServerConfig(model_repository, restricted_apis=())).command(model_repository))
    assert "restricted" not in command


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("192.168.1.10", False),
        ("example.org", False),
    ],
)
def test_which_hosts_count_as_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_binding_all_interfaces_is_warned_about(tmp_path, caplog):
    # A repository that fails at model load: tritonserver exits before it
    # opens any endpoint, so nothing is exposed while we check the warning.
    (tmp_path / "empty_model").mkdir()
    with caplog.at_level(logging.WARNING, logger="tritonstack.serve"):
        with pytest.raises(ServerStartError):
            TritonServer(ServerConfig(tmp_path, host="0.0.0.0"), startup_timeout_s=60).start()
    assert "reachable from other machines" in caplog.text


SIZE_LIMIT = 1024 * 1024  # bytes: every sample photo fits, a padded one does not


@pytest.fixture(scope="module")
def size_limited_server(model_repository):
    """Only the DALI ensemble and its two models, with a small request size limit."""
    only_the_ensemble = ("--model-control-mode=explicit", f"--load-model={DEFAULT_MODEL}")
    with TritonServer(
        ServerConfig(model_repository, max_input_bytes=SIZE_LIMIT, extra_args=only_the_ensemble)
    ) as running:
        yield running


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_body_above_the_size_limit_is_refused(size_limited_server, protocol):
    url = size_limited_server.http_url if protocol == "http" else size_limited_server.grpc_url
    coffee = photo_bytes("coffee.png")
    oversized = coffee + bytes(SIZE_LIMIT)  # a real PNG followed by padding
    with ClassifierClient(url, protocol) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.classify([oversized], top_k=1)
        assert str(refused.value.status()) == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
        message = refused.value.message()
        assert f"is {len(oversized)} bytes" in message and f"max_input_bytes {SIZE_LIMIT}" in message, message
        assert "input 'DALI_INPUT_0'" in message, message
        assert client.classify([coffee], top_k=1)[0][0].label == "espresso"


# Admin writes, not only reads: without the key nothing changes on the server.
WRITES = {
    "load_model": lambda client, headers: client.load_model("efficientnet_lite0", headers=headers),
    "unload_model": lambda client, headers: client.unload_model("efficientnet_lite0", headers=headers),
    "register_system_shared_memory": lambda client, headers: client.register_system_shared_memory(
        "not_allowed", "/not_allowed_region", 64, headers=headers
    ),
}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("write", sorted(WRITES))
def test_admin_writes_without_the_key_are_refused_and_change_nothing(server, write, protocol):
    client = client_for(server, protocol)
    for headers in (None, {name: "not-the-key" for name in server.admin_headers(protocol)}):
        with pytest.raises(InferenceServerException) as refused:
            WRITES[write](client, headers)
        assert str(refused.value.status()) == REFUSED[protocol], refused.value
        assert ADMIN_HEADER in refused.value.message()
    assert client.is_model_ready("efficientnet_lite0")
    regions = client.get_system_shared_memory_status(headers=server.admin_headers(protocol))
    names = [region["name"] for region in regions] if protocol == "http" else list(regions.regions)
    assert "not_allowed" not in names


def test_a_model_file_name_that_would_reach_a_shell_is_refused_before_the_server_starts(tmp_path):
    """Triton 2.51's Python backend starts a stub through bash with the model's file
    path: `$(...)` in default_model_filename would run (seen: a file created). The
    launcher refuses such a repository with the C++ dali backend's file-name rule."""
    from tests import repo_factory as rf
    from tritonstack.serve.launcher import TritonServer, UnservableRepository

    witness = tmp_path / "ran"
    name = rf.write_model(
        tmp_path / "repo",
        rf.identity_config("identity"),
        {"model.dali": rf.serialized(rf.identity_pipeline)},
        default_model_filename=f"model.dali$(touch${{IFS}}{witness})",
    )
    with pytest.raises(UnservableRepository) as refused:
        TritonServer(tmp_path / "repo").start()
    assert f"model '{name}'" in str(refused.value) and "invalid character: '$'" in str(refused.value)
    assert not witness.exists()
