"""A newcomer's mistakes, driven through the real command lines (subprocesses,
the session's real server): each ends in one line naming the problem, no
traceback unless --debug, and the exit code the README documents (2: nothing
could run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import PROJECT_ROOT
from tritonstack.contract import ADMIN_KEY_ENV
from tritonstack.samples.photos import photo_path
from tritonstack.serve.network import free_port

CLASSIFY = ("-m", "tritonstack", "classify")
EVALUATE = ("-m", "tritonstack", "evaluate")
BUILD = PROJECT_ROOT / "build_pipelines.py"
COFFEE = str(photo_path("coffee.png"))


def run(*args, key: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != ADMIN_KEY_ENV}
    if key:
        env[ADMIN_KEY_ENV] = key
    return subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=PROJECT_ROOT, env=env
    )


def one_line_error(done: subprocess.CompletedProcess, *words: str, code: int = 2) -> str:
    """The run's stderr is one line naming the problem; returns it."""
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("form", ["http://{http}", "{http}", "grpc://{grpc}"])
def test_every_address_form_is_accepted(server, form):
    url = form.format(http=server.http_url, grpc=server.grpc_url)
    done = run(*CLASSIFY, COFFEE, "--url", url, "--top-k", "1")
    assert done.returncode == 0, done.stderr
    assert "espresso" in done.stdout


def test_http_client_on_the_grpc_port(server):
    one_line_error(
        run(*CLASSIFY, COFFEE, "--url", server.grpc_url),
        f"{server.grpc_url} does not answer HTTP",
        "gRPC port",
        f"grpc://{server.grpc_url}",
    )


def test_grpc_client_on_the_http_port(server):
    one_line_error(
        run(*CLASSIFY, COFFEE, "--url", f"grpc://{server.http_url}"),
        f"{server.http_url} does not answer gRPC",
        "HTTP port",
    )


def test_scheme_and_protocol_that_disagree():
    one_line_error(run(*CLASSIFY, COFFEE, "--url", "grpc://127.0.0.1:8001", "--protocol", "http"), "disagree")


def test_unsupported_scheme_and_address_without_port():
    one_line_error(run(*CLASSIFY, COFFEE, "--url", "https://127.0.0.1:8000"), "https:// is not supported")
    one_line_error(run(*CLASSIFY, COFFEE, "--url", "127.0.0.1"), "expected host:port")


def test_unknown_model_lists_the_image_classifiers(server):
    line = one_line_error(
        run(*CLASSIFY, COFFEE, "--url", server.http_url, "--model", "resnet50", key=server.admin_key),
        "model 'resnet50' not found",
        "available image classifiers:",
        "ensemble_dali_efficientnet_lite0",
    )
    assert "preprocess_dali" not in line  # takes images, but answers pixels: not a classifier


def test_unknown_model_without_the_admin_key_says_how_to_list_them(server):
    one_line_error(
        run(*CLASSIFY, COFFEE, "--url", f"grpc://{server.grpc_url}", "--model", "resnet50"),
        "model 'resnet50' not found",
        f"${ADMIN_KEY_ENV}",
    )


def test_a_model_that_does_not_take_encoded_images(server, tmp_path):
    (tmp_path / "espresso").mkdir()
    shutil.copy(photo_path("coffee.png"), tmp_path / "espresso" / "coffee.png")
    one_line_error(
        run(*EVALUATE, tmp_path, "--url", server.http_url, "--model", "efficientnet_lite0"),
        "model 'efficientnet_lite0' takes FP32",
        "not encoded images",
    )


def test_a_preprocessing_model_is_not_a_classifier(server):
    one_line_error(
        run(*CLASSIFY, COFFEE, "--url", server.http_url, "--model", "preprocess_dali_efficientnet_lite0"),
        "takes encoded images but answers FP32",
        "not class scores",
    )


def test_missing_file_and_folder():
    one_line_error(
        run(*CLASSIFY, "/nonexistent/photo.jpg", "--url", "127.0.0.1:1"),
        "/nonexistent/photo.jpg: no such file or folder",
    )
    one_line_error(run(*EVALUATE, "/nonexistent", "--url", "127.0.0.1:1"), "/nonexistent: no such folder")


def test_a_class_folder_that_names_no_class(server, tmp_path):
    (tmp_path / "not a class").mkdir()
    shutil.copy(photo_path("coffee.png"), tmp_path / "not a class" / "coffee.png")
    one_line_error(run(*EVALUATE, tmp_path, "--url", server.http_url), "'not a class' is neither a label")


def test_bad_option_is_one_line_naming_it():
    one_line_error(run(*CLASSIFY, COFFEE, "--top-k", "0"), "--top-k: must be at least 1", "--help")
    one_line_error(run(*EVALUATE, "x", "--retries", "-1"), "--retries: must be 0 or more")


def test_no_server():
    url = f"127.0.0.1:{free_port()}"
    one_line_error(run(*CLASSIFY, COFFEE, "--url", url, "--retries", "0"), f"no Triton server at {url}", "make serve")


def test_debug_shows_the_traceback(server):
    done = run(*CLASSIFY, COFFEE, "--url", server.http_url, "--model", "resnet50", "--debug")
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "ModelError" in done.stderr


def test_a_closed_pipe_ends_quietly(server, tmp_path):
    for n in range(12):
        shutil.copy(photo_path("rocket.jpg"), tmp_path / f"{n}.jpg")
    process = subprocess.Popen(
        [sys.executable, *CLASSIFY, str(tmp_path), "--url", server.http_url, "--top-k", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "missile" in process.stdout.readline()  # `| head -1`
        process.stdout.close()
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_build_tool_mistakes():
    one_line_error(run(BUILD, "check", "/nonexistent"), "/nonexistent: no such folder", "make build")
    one_line_error(run(BUILD, "build", "resnet50", "--out", "/nonexistent"), "no preset 'resnet50'")


def test_launcher_refuses_a_port_in_use_and_a_missing_repository(server, model_repository):
    one_line_error(
        run(
            "-m",
            "tritonstack",
            "serve",
            "--model-repository",
            model_repository,
            "--http-port",
            server.http_url.rsplit(":", 1)[1],
        ),
        "is in use",
        "--http-port",
    )
    one_line_error(
        run("-m", "tritonstack", "serve", "--model-repository", "/nonexistent"),
        "/nonexistent: no such folder",
        "make build",
    )


def test_benchmark_and_soak_mistakes(tmp_path):
    one_line_error(
        run("-m", "tritonstack", "benchmark", "--out", tmp_path / "b.json", "--url", "grpc://127.0.0.1:1"),
        "--url grpc://127.0.0.1:1 names a grpc endpoint",
    )
    url = f"127.0.0.1:{free_port()}"
    one_line_error(
        run("-m", "tritonstack", "benchmark", "--out", tmp_path / "b.json", "--url", url), f"no Triton server at {url}"
    )
    one_line_error(
        run("-m", "tritonstack.commands.soak", "--model-repository", "/nonexistent"), "/nonexistent: no such folder"
    )
    assert not (tmp_path / "b.json").exists()


def test_help_shows_defaults():
    done = run(*CLASSIFY, "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "(default: 5)" in text and "(default: ensemble_dali_efficientnet_lite0)" in text
    assert "default: the --url's scheme, else http" in text
