"""`tritonstack evaluate` on an ImageFolder-style set built from scikit-image's
photos, against the real server."""

from __future__ import annotations

import io
import json
import shutil

import pytest
from PIL import Image

from tritonstack.commands import evaluate
from tritonstack.samples.photos import photo_path


def jpeg_copy(name: str, longest_side: int) -> bytes:
    image = Image.open(photo_path(name)).convert("RGB")
    image.thumbnail((longest_side, longest_side))
    encoded = io.BytesIO()
    image.save(encoded, "JPEG", quality=90)
    return encoded.getvalue()


@pytest.fixture(scope="module")
def labelled_set(tmp_path_factory):
    """Folders named by label, by label with underscores, and by index. The cat
    is filed as "tabby", the classifier's third guess: a known top-1 miss."""
    root = tmp_path_factory.mktemp("imagefolder")
    for folder in ("tabby", "tiger_cat", "967", "espresso", "missile"):
        (root / folder).mkdir()
    shutil.copy(photo_path("chelsea.png"), root / "tabby" / "chelsea.png")
    shutil.copy(photo_path("chelsea.png"), root / "tiger_cat" / "chelsea_copy.png")
    shutil.copy(photo_path("coffee.png"), root / "967" / "coffee.png")
    (root / "espresso" / "coffee_small.jpg").write_bytes(jpeg_copy("coffee.png", 320))
    shutil.copy(photo_path("rocket.jpg"), root / "missile" / "rocket.jpg")
    return root


def evaluate_json(capsys, *args) -> tuple[int, dict]:
    code = evaluate.main([str(arg) for arg in args] + ["--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_accuracy_and_worst_classes(server, labelled_set, capsys):
    code, summary = evaluate_json(capsys, labelled_set, "--url", server.grpc_url, "--protocol", "grpc")
    assert code == 0
    assert (summary["images"], summary["classes"], summary["failed"]) == (5, 5, 0)
    assert summary["top1"] == pytest.approx(4 / 5)
    assert summary["top5"] == 1.0
    assert summary["images_per_s"] > 0
    worst = summary["worst"][0]
    assert (worst["class"], worst["top1"], worst["top5"]) == ("tabby", 0.0, 1.0)
    assert worst["taken_for"] == {"tiger cat": 1}


def test_broken_file_counts_as_failed_not_wrong(server, labelled_set, tmp_path, capsys):
    root = tmp_path / "set"
    shutil.copytree(labelled_set, root)
    (root / "missile" / "broken.jpg").write_bytes(b"\xff\xd8\xff broken")
    code, summary = evaluate_json(capsys, root, "--url", server.http_url, "--async", "--batch-size", "3")
    assert code == 1
    assert (summary["images"], summary["failed"]) == (6, 1)
    assert summary["top1"] == pytest.approx(4 / 5)


def test_text_report(server, labelled_set, capsys):
    assert evaluate.main([str(labelled_set), "--url", server.http_url, "--worst", "1"]) == 0
    out = capsys.readouterr().out
    assert "top-1 accuracy    80.0%" in out
    assert "top-5 accuracy   100.0%" in out
    assert "tabby" in out and "taken for: tiger cat x1" in out


def test_a_folder_that_names_no_class_is_refused(server, tmp_path, capsys):
    (tmp_path / "not_a_class").mkdir()
    shutil.copy(photo_path("coffee.png"), tmp_path / "not_a_class" / "coffee.png")
    assert evaluate.main([str(tmp_path), "--url", server.http_url]) == 2
    assert "folder 'not_a_class' is neither a label" in capsys.readouterr().err
