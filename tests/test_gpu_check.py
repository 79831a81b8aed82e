"""The GPU check's CPU path (docs/performance.md, "On a GPU"): what runs here of what a
lent GPU machine runs, and the pieces DALI travels in."""

import json
import os

import pytest

from tests import repo_factory as rf
from tests.conftest import MODEL_REPOSITORY, PROJECT_ROOT
from tritonstack.commands.build import main as tritonstack_main
from tritonstack.gpu import gpu_check, gpu_pieces, gpu_serve
from tritonstack.samples.photos import PHOTOS

GPU_PRESETS = ("dali_efficientnet_lite0", "regions_efficientnet_lite0", "video_efficientnet_lite0")


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """The GPU variant of three presets built here, checked against the committed CPU one."""
    root = tmp_path_factory.mktemp("gpu-check")
    gpu_repo, inputs, out = root / "gpu", root / "inputs", root / "check.json"
    rf.seed_lite0_export(gpu_repo)
    assert tritonstack_main(["build", "--out", str(gpu_repo), *GPU_PRESETS, "--device", "gpu"]) == 0
    gpu_check.main(["inputs", "--out", str(inputs)])
    run = ["run", "--gpu-repository", str(gpu_repo), "--cpu-repository", str(MODEL_REPOSITORY)]
    gpu_check.main([*run, "--inputs", str(inputs), "--out", str(out), "--seconds", "0.2"])
    return json.loads(out.read_text()), inputs


def test_every_dali_step_of_the_gpu_variant_is_checked(checked):
    report, _ = checked
    kinds = {row["model"]: row["kind"] for row in report["pipelines"]}
    assert kinds == {
        "preprocess_dali_efficientnet_lite0": "image",
        "preprocess_regions_efficientnet_lite0": "regions",
        "preprocess_video_efficientnet_lite0": "video",
    }


def test_without_cuda_the_gpu_side_is_absent_and_says_so(checked):
    report, _ = checked
    assert "gpu" not in report["machine"]
    for row in report["pipelines"]:
        assert row["error"] == "no CUDA device: the GPU variant was not run"
        assert row["max_levels"] is None and row["top1_gpu"] == [] and row["top1_equal"] is None
        assert "gpu" not in row["images_per_s"]


def test_the_cpu_side_is_measured_on_two_cores(checked):
    report, _ = checked
    for row in report["pipelines"]:
        assert row["images_per_s"]["cpu_2_threads_2_cores"] > 0
        assert row["samples"] > 0
    figures = report["pipelines"][0]["images_per_s"]
    all_cores = [key for key in figures if key.startswith("cpu_") and key != "cpu_2_threads_2_cores"]
    assert bool(all_cores) == (len(os.sched_getaffinity(0)) > 2)


def test_the_cpu_variant_ranks_the_labelled_photos(checked):
    """The classifier runs on the CPU variant's tensors: a labelled photo's top-1 at 1280 px
    is one of its classes (the reference the GPU variant's top-1 is compared with). At 320
    px, quality 75, a classifier may see something else (the rocket as a drilling platform)."""
    report, inputs = checked
    labels = (MODEL_REPOSITORY / "efficientnet_lite0" / "labels.txt").read_text().splitlines()
    image = next(row for row in report["pipelines"] if row["kind"] == "image")
    names = gpu_check._input_names("image", inputs)
    classes = {name.rsplit(".", 1)[0]: labelled for name, labelled in PHOTOS.items()}
    assert len(image["top1_cpu"]) == len(names) == image["samples"]
    for name, top1 in zip(names, image["top1_cpu"]):
        expected = classes[name.split("@")[0]]
        if expected and name.endswith("@1280q90.jpg"):
            assert labels[top1] in expected, (name, labels[top1])


@pytest.mark.parametrize("xz_installed", [True, False])
def test_pieces_join_back_to_the_folder_and_a_missing_one_is_named(tmp_path, monkeypatch, xz_installed):
    if not xz_installed:  # Python's lzma packs instead
        monkeypatch.setattr(gpu_pieces.shutil, "which", lambda name: None)
    site = tmp_path / "site"
    (site / "nvidia" / "dali").mkdir(parents=True)
    payload = os.urandom(3 * 2**20)  # random: xz cannot shrink it, so it spans pieces
    (site / "nvidia" / "dali" / "libdali.so").write_bytes(payload)
    (site / "nvidia" / "dali" / "backend_impl.cpython-311-x86_64-linux-gnu.so").write_bytes(b"x")
    (site / "nvidia" / "dali" / "backend_impl.cpython-312-x86_64-linux-gnu.so").write_bytes(b"y")
    (site / "nvidia" / "dali" / "backend_impl.cpython-312t-x86_64-linux-gnu.so").write_bytes(b"z")
    assert gpu_pieces.drop_other_pythons(site, "3.12") == 2
    pieces = gpu_pieces.pack(site, tmp_path / "pieces", piece_mib=1)
    assert len(pieces) >= 3
    gpu_pieces.join(tmp_path / "pieces", tmp_path / "joined")
    joined = tmp_path / "joined" / "nvidia" / "dali"
    assert (joined / "libdali.so").read_bytes() == payload
    kept = sorted(path.name for path in joined.iterdir())
    assert kept == ["backend_impl.cpython-312-x86_64-linux-gnu.so", "libdali.so"]
    pieces[1].unlink()
    with pytest.raises(SystemExit, match="one is missing"):
        gpu_pieces.join(tmp_path / "pieces", tmp_path / "again")


def test_every_wheel_the_gpu_machine_needs_is_pinned():
    wheels = gpu_pieces.WHEELS + gpu_pieces.SERVING_WHEELS
    requirements = gpu_pieces.pinned(PROJECT_ROOT / "constraints.txt", wheels)
    assert [requirement.split("==")[0] for requirement in requirements] == list(wheels)


def test_a_served_variant_ranks_the_photos_and_is_measured(server, checked):
    """gpu_serve's measurement of one running server (the CPU variant's here; the GPU
    variant's on a lent GPU): each photo's top-1 through the ensemble, then closed loops
    on the ensemble and its DALI step, none failed."""
    _, inputs = checked
    names = gpu_check.image_inputs(inputs)
    report = gpu_serve.measure(server, [(inputs / name).read_bytes() for name in names], seconds=0.5, concurrency=4)
    labels = (MODEL_REPOSITORY / "efficientnet_lite0" / "labels.txt").read_text().splitlines()
    classes = {name.rsplit(".", 1)[0]: labelled for name, labelled in PHOTOS.items()}
    assert len(report["top1"]) == len(report["top1_margin"]) == len(names)
    for name, top1 in zip(names, report["top1"]):
        expected = classes[name.split("@")[0]]
        if expected and name.endswith("@1280q90.jpg"):
            assert labels[top1] in expected, (name, labels[top1])
    for loop in ("ensemble", "dali_step_alone"):
        assert report[loop]["images_per_s"] > 0 and report[loop]["errors"] == 0, report[loop]


def test_served_variants_agree_where_the_cpu_top1_is_clear():
    cpu = {"top1": [1, 2, 3], "top1_margin": [0.5, 0.02, 0.3]}
    assert gpu_serve.agreement(cpu, {"top1": [1, 9, 3]}) == {
        "top1_equal": 2,
        "top1_equal_where_clear": True,
        "photos": 3,
        "clear": 2,
    }
    assert gpu_serve.agreement(cpu, {"top1": [1, 2, 4]})["top1_equal_where_clear"] is False
    assert gpu_serve.agreement(cpu, {"error": "no CUDA device"})["top1_equal"] is None
