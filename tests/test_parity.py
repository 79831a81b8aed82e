"""DALI preprocessing vs the Pillow baseline: the same tensors within the documented
tolerance and the same classes, in process and through the served ensembles."""

import pytest
import tritonclient.http as httpclient

from tritonstack.build.parity import compare, parity_images
from tritonstack.client.classifier import ClassifierClient
from tritonstack.commands.build import main
from tritonstack.samples.photos import PHOTOS, photo_bytes


@pytest.mark.parametrize("preset", ["dali_efficientnet_lite0", "dali_efficientnet_lite2"])
def test_dali_and_pillow_agree_on_photos_and_variants(model_repository, preset):
    report = compare(model_repository, preset)
    assert len(report.images) == len(parity_images()) >= 13
    assert report.top1_agreement == 1.0, [r for r in report.images if r.top1_dali != r.top1_pillow]
    assert report.top5_agreement == 1.0
    # Independent bounds, in 0..255 levels: one level of rounding, almost never.
    assert report.max_abs_levels <= 1.0
    assert report.mean_abs_levels <= 0.01


def test_parity_command_prints_and_writes_the_figures(model_repository, tmp_path, capsys):
    assert main(["parity", str(model_repository), "--json", str(tmp_path / "parity.json")]) == 0
    printed = capsys.readouterr().out
    assert "coffee_cmyk.jpg" in printed and "top-1 agreement 100%" in printed
    assert '"top1_agreement": 1.0' in (tmp_path / "parity.json").read_text()


def test_served_lite2_ensemble_classifies_photos(server):
    with ClassifierClient(server.http_url, model="ensemble_dali_efficientnet_lite2") as client:
        results = client.classify([photo_bytes(name) for name in PHOTOS], top_k=3)
    for (name, expected), top in zip(PHOTOS.items(), results):
        if expected:
            assert {p.label for p in top} & expected, (name, top)


def test_pillow_model_refuses_a_bad_image_for_that_request_only(server):
    with ClassifierClient(server.http_url, model="ensemble_python_efficientnet_lite0") as client:
        with pytest.raises(httpclient.InferenceServerException) as refused:
            client.classify([b"not an image at all"])
        assert refused.value.status() == "400"
        assert "image 0 of the request is not in an image format Pillow can decode" in refused.value.message()
        (top,) = client.classify([photo_bytes("coffee.png")], top_k=1)
    assert top[0].label == "espresso"
