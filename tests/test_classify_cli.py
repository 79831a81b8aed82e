"""`tritonstack classify` against the real server: one result per input file in
every format and mode, error lines for broken files, exit codes, progress and
summary on stderr."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tritonstack.commands import classify
from tritonstack.samples.photos import PHOTOS, photo_path
from tritonstack.serve.network import free_port

GOOD = ["chelsea.png", "coffee.png", "rocket.jpg"]


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory) -> Path:
    """Photos in nested folders, one PNG without extension (found by content),
    a broken JPEG, an empty file, and a text file that is not an input."""
    root = tmp_path_factory.mktemp("photos")
    (root / "nested" / "deeper").mkdir(parents=True)
    shutil.copy(photo_path("chelsea.png"), root / "chelsea.png")
    shutil.copy(photo_path("rocket.jpg"), root / "nested" / "rocket.jpg")
    shutil.copy(photo_path("coffee.png"), root / "nested" / "deeper" / "coffee_no_extension")
    (root / "nested" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated JPEG")
    (root / "empty.png").write_bytes(b"")
    (root / "notes.txt").write_text("not an image")
    return root


EXPECTED = {
    "chelsea.png": PHOTOS["chelsea.png"],
    "rocket.jpg": PHOTOS["rocket.jpg"],
    "coffee_no_extension": PHOTOS["coffee.png"],
    "broken.jpg": None,
    "empty.png": None,
}


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = classify.main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def jsonl_by_name(out: str) -> dict[str, dict]:
    lines = [json.loads(line) for line in out.splitlines()]
    by_name = {Path(line["path"]).name: line for line in lines}
    assert len(by_name) == len(lines), "a file appears twice"
    return by_name


MODES = [
    ("http", []),
    ("grpc", ["--batch-size", "3", "--concurrency", "2"]),
    ("http", ["--async", "--batch-size", "2", "--concurrency", "3", "--shm", "system"]),
    ("grpc", ["--async", "--shm", "system", "--timeout", "30"]),
    ("http", ["--concurrency", "2", "--batch-size", "4", "--shm", "system"]),
]


@pytest.mark.parametrize("protocol,options", MODES)
def test_jsonl_has_one_line_per_file_and_error_lines(server, photo_folder, capsys, protocol, options, monkeypatch):
    monkeypatch.setenv("TRITONSTACK_ADMIN_KEY", server.admin_key)
    url = server.http_url if protocol == "http" else server.grpc_url
    code, out, err = run_cli(
        capsys, photo_folder, "--url", url, "--protocol", protocol, "--format", "jsonl", "--top-k", "3", *options
    )
    by_name = jsonl_by_name(out)
    assert set(by_name) == set(EXPECTED)
    for name, labels in EXPECTED.items():
        if labels is None:
            assert set(by_name[name]) == {"path", "error"} and by_name[name]["error"], by_name[name]
        else:
            assert "top" in by_name[name], by_name[name]
            top = by_name[name]["top"]
            assert top[0]["label"] in labels and len(top) == 3, top
            assert set(top[0]) == {"label", "index", "score"}
    assert "nvImageCodec" in by_name["broken.jpg"]["error"] or "400" in by_name["broken.jpg"]["error"]
    assert "empty file" in by_name["empty.png"]["error"]
    assert code == 1
    assert err.strip().splitlines()[-1].startswith("5 files, 2 failed,")
    assert "files/s" in err


def test_all_good_files_exit_0_in_table_format(server, capsys):
    paths = [photo_path(name) for name in GOOD]
    code, out, err = run_cli(capsys, *paths, "--url", server.http_url, "--top-k", "2")
    lines = out.splitlines()
    assert code == 0
    assert [line.split()[0] for line in lines] == [str(path) for path in paths]
    assert "espresso (0.9" in lines[1]
    assert "3 files, 0 failed" in err


def test_csv_has_a_header_and_one_row_per_file(server, photo_folder, capsys):
    code, out, _ = run_cli(
        capsys, photo_folder, "--url", server.grpc_url, "--protocol", "grpc", "--format", "csv", "--top-k", "2"
    )
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 1
    assert len(rows) == len(EXPECTED)
    by_name = {Path(row["path"]).name: row for row in rows}
    assert by_name["coffee_no_extension"]["label_1"] == "espresso"
    assert by_name["coffee_no_extension"]["index_1"] == "967"
    assert by_name["broken.jpg"]["error"] and not by_name["broken.jpg"]["label_1"]


def test_many_files_in_natural_order_without_progress_frames_off_a_terminal(server, tmp_path, capsys):
    for n in range(12):
        shutil.copy(photo_path("rocket.jpg"), tmp_path / f"c{n}.jpg")
    code, out, err = run_cli(capsys, tmp_path, "--url", server.http_url, "--batch-size", "4", "--top-k", "1")
    assert code == 0
    names = [Path(line.split()[0]).name for line in out.splitlines()]
    assert names == [f"c{n}.jpg" for n in range(12)]  # c2 before c10
    assert len({line.index("missile") for line in out.splitlines()}) == 1  # an aligned column
    assert "\r" not in err  # stderr is not a terminal here: no bar frames in logs
    assert err.startswith("12 files, 0 failed")


def test_no_server_exits_2_with_a_clear_message(tmp_path, capsys):
    url = f"127.0.0.1:{free_port()}"
    code, out, err = run_cli(capsys, photo_path("coffee.png"), "--url", url, "--protocol", "grpc", "--retries", "1")
    assert code == 2
    assert out == ""
    assert f"no Triton server at {url} (grpc): start one with `make serve`" in err


def test_no_image_files_exits_2(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("nothing to see")
    code, _, err = run_cli(capsys, tmp_path, "--url", "127.0.0.1:1")
    assert code == 2
    assert "no image, clip or audio files" in err


def test_runs_as_the_tritonstack_command(server):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tritonstack",
            "classify",
            str(photo_path("coffee.png")),
            "--url",
            server.grpc_url,
            "--protocol",
            "grpc",
            "--format",
            "jsonl",
            "--top-k",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["top"][0]["label"] == "espresso"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream,frames", [(_Terminal(), True), (io.StringIO(), False)])
def test_progress_bar_only_on_a_terminal_and_out_of_the_results_way(stream, frames):
    from tritonstack.client.runner import FileResult, Progress

    progress = Progress(12, stream=stream)
    for n in range(12):
        with progress.above():
            stream.write(f"result {n}\n")  # a result line: the bar is cleared first
        progress.update(FileResult(Path(f"{n}.jpg"), error="bad" if n == 3 else None))
    progress.close()
    text = stream.getvalue()
    assert ("/12" in text and "\r" in text) is frames
    for n in range(12):  # every result line whole, at the start of a line or after the bar's clearing \r
        assert re.search(rf"(^|\r)result {n}\n", text, re.MULTILINE), n
    assert text.endswith("12 files, 1 failed" + text.split("12 files, 1 failed", 1)[1])
    assert progress.failed == 1
