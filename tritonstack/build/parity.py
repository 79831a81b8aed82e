"""Accuracy parity: DALI preprocessing vs the Pillow baseline, on real photos.

Both transforms run in this process on the same encoded bytes: the repository's
serialized DALI pipeline and `tritonstack.build.pillow_model.preprocess` (the code of the
Pillow model). The classifier's model.onnx then ranks both tensors.

The two implement one transform (same sub-pixel source window, same antialiased
bilinear filter, float resampling rounded once, same crop anchor), so they differ
only by rounding: an occasional value one 0..255 level apart where the resampled
value lands on .5, from float summation order, or from the JPEG decoders
(nvImageCodec's libjpeg-turbo vs Pillow's). Pillow's default 8-bit resize rounds
inside its filter, often enough to flip a near-tie (docs/building.md): hence the
float resize in the Pillow model.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tritonstack.build.classifiers import CLEAR_MARGIN, Classifier, Preprocessing
from tritonstack.build.model_files import VERSION
from tritonstack.build.pillow_model import preprocess
from tritonstack.build.pipelines import run_pipeline
from tritonstack.build.presets import Preset, preset_named
from tritonstack.repository_files import DALI_MODEL_FILENAME, ONNX_MODEL_FILENAME
from tritonstack.samples.photos import PHOTOS, photo_bytes


@dataclass(frozen=True)
class ImageResult:
    name: str
    size: tuple[int, int]
    max_abs_levels: float  # largest |DALI - Pillow| on one value, in 0..255 levels
    mean_abs_levels: float
    top1_dali: int
    top1_pillow: int
    top5_overlap: int  # classes in both top-5 lists


@dataclass(frozen=True)
class ParityReport:
    preset: str
    images: tuple[ImageResult, ...]

    @property
    def top1_agreement(self) -> float:
        return float(np.mean([r.top1_dali == r.top1_pillow for r in self.images]))

    @property
    def top5_agreement(self) -> float:
        """Share of images whose top-5 sets are the same."""
        return float(np.mean([r.top5_overlap == 5 for r in self.images]))

    @property
    def max_abs_levels(self) -> float:
        return max(r.max_abs_levels for r in self.images)

    @property
    def mean_abs_levels(self) -> float:
        return float(np.mean([r.mean_abs_levels for r in self.images]))

    def to_json(self) -> str:
        summary = {
            "top1_agreement": self.top1_agreement,
            "top5_agreement": self.top5_agreement,
            "max_abs_levels": self.max_abs_levels,
            "mean_abs_levels": self.mean_abs_levels,
        }
        return (
            json.dumps({"preset": self.preset, **summary, "images": [asdict(r) for r in self.images]}, indent=2) + "\n"
        )


def parity_images() -> dict[str, bytes]:
    """scikit-image's photos as shipped, and variants made from them with Pillow."""
    from PIL import Image

    images = {name: photo_bytes(name) for name in (*PHOTOS, "camera.png")}
    with (
        Image.open(io.BytesIO(photo_bytes("coffee.png"))) as coffee,
        Image.open(io.BytesIO(photo_bytes("rocket.jpg"))) as rocket,
    ):
        coffee, rocket = coffee.convert("RGB"), rocket.convert("RGB")
        variants = {
            "coffee_small_upscaled.jpg": (coffee.resize((150, 100)), "JPEG"),
            "coffee_large.jpg": (coffee.resize((1800, 1200)), "JPEG"),
            "rocket_wide_8to1.jpg": (rocket.resize((1600, 200)), "JPEG"),
            "rocket_tall_1to6.jpg": (rocket.resize((300, 1800)), "JPEG"),
            "coffee_gray.jpg": (coffee.convert("L"), "JPEG"),
            "rocket.png": (rocket, "PNG"),
            "coffee_cmyk.jpg": (coffee.convert("CMYK"), "JPEG"),
        }
    for name, (image, image_format) in variants.items():
        encoded = io.BytesIO()
        image.save(encoded, format=image_format, **({"quality": 92} if image_format == "JPEG" else {}))
        images[name] = encoded.getvalue()
    return images


# scikit-image's photos of real scenes and textures, colour and grey, for crop_images().
CROP_SOURCES = (
    "chelsea.png",
    "coffee.png",
    "rocket.jpg",
    "astronaut.png",
    "motorcycle_left.png",
    "motorcycle_right.png",
    "hubble_deep_field.jpg",
    "ihc.png",
    "retina.jpg",
    "brick.png",
    "grass.png",
    "gravel.png",
    "camera.png",
    "coins.png",
    "clock_motion.png",
    "moon.png",
    "cell.png",
    "page.png",
)
# (left, top, side) of each square crop, as fractions of the photo's width and height.
CROP_WINDOWS = ((0, 0, 0.6), (0.4, 0, 0.6), (0, 0.4, 0.6), (0.4, 0.4, 0.6), (0.2, 0.2, 0.6), (0.1, 0.1, 0.8))


def crop_images() -> dict[str, bytes]:
    """A wider corpus than parity_images() for comparing two classifiers: 6 crops of
    each of 18 photos, each as is and mirrored, as JPEG (216 images). Many are
    textures a classifier is unsure of, where a small numeric change flips the top-1:
    a stricter test of agreement than the parity corpus, whose 13 images move a
    fraction by 7.7 % each."""
    from PIL import Image, ImageOps

    images = {}
    for name in CROP_SOURCES:
        with Image.open(io.BytesIO(photo_bytes(name))) as photo:
            photo = photo.convert("RGB")
        width, height = photo.size
        for index, (left, top, side) in enumerate(CROP_WINDOWS):
            crop = photo.crop(
                (int(left * width), int(top * height), int((left + side) * width), int((top + side) * height))
            )
            for mirrored in (False, True):
                encoded = io.BytesIO()
                (ImageOps.mirror(crop) if mirrored else crop).save(encoded, format="JPEG", quality=90)
                images[f"{name}_crop{index}{'_mirrored' if mirrored else ''}.jpg"] = encoded.getvalue()
    return images


def compare(
    repository: Path,
    preset_name: str = "dali_efficientnet_lite0",
    images: dict[str, bytes] | None = None,
    classifier: Classifier | None = None,
) -> ParityReport:
    """DALI against Pillow for a preset, or for `classifier` (a user's, built with the
    same options: tritonstack.build.own_classifier) served as `dali_<name>`."""
    from PIL import Image

    preset = preset_named(preset_name) if classifier is None else Preset(classifier, "dali")
    classifier = preset.classifier
    images = images or parity_images()
    encoded = list(images.values())
    dali = dali_tensors(repository, preset, encoded)
    p = classifier.preprocessing
    pillow = np.stack([preprocess(data, **asdict(p)) for data in encoded])
    scores_dali, scores_pillow = (classify(repository, classifier, batch) for batch in (dali, pillow))
    levels = _levels(dali, pillow, p)
    results = []
    for index, (name, data) in enumerate(images.items()):
        with Image.open(io.BytesIO(data)) as image:
            size = image.size
        top5_dali = np.argsort(scores_dali[index])[::-1][:5]
        top5_pillow = np.argsort(scores_pillow[index])[::-1][:5]
        results.append(
            ImageResult(
                name=name,
                size=size,
                max_abs_levels=round(float(levels[index].max()), 3),
                mean_abs_levels=round(float(levels[index].mean()), 4),
                top1_dali=int(top5_dali[0]),
                top1_pillow=int(top5_pillow[0]),
                top5_overlap=len(set(top5_dali) & set(top5_pillow)),
            )
        )
    return ParityReport(preset=preset.name, images=tuple(results))


def _levels(dali: np.ndarray, pillow: np.ndarray, p: Preprocessing) -> np.ndarray:
    """|DALI - Pillow| back in 0..255 units: a UINT8 input is in them already."""
    difference = np.abs(dali.astype(np.float32) - pillow.astype(np.float32))
    if p.input_type == "uint8":
        return difference
    std = np.asarray(p.std, np.float32)
    return difference * (std[:, None, None] if p.layout == "NCHW" else std)


def dali_tensors(repository: Path, preset: Preset | str, encoded: list[bytes]) -> np.ndarray:
    """The preset's served DALI pipeline (its model.dali) run here on `encoded`."""
    preset = preset_named(preset) if isinstance(preset, str) else preset
    serialized = (Path(repository) / preset.preprocessing_name / VERSION / DALI_MODEL_FILENAME).read_bytes()
    return run_pipeline(serialized, encoded)


def classify(repository: Path, classifier: Classifier | str, batch: np.ndarray) -> np.ndarray:
    """The classifier (or a preset's) as served (its model.onnx) on preprocessed images: scores."""
    import onnxruntime as ort

    if isinstance(classifier, str):
        classifier = preset_named(classifier).classifier
    session = ort.InferenceSession(
        str(Path(repository) / classifier.name / VERSION / ONNX_MODEL_FILENAME), providers=["CPUExecutionProvider"]
    )
    return session.run([classifier.output_name], {classifier.input_name: batch})[0]


@dataclass(frozen=True)
class ClassifierAgreement:
    """One classifier against another on the same preprocessed images."""

    reference: str
    candidate: str
    top1_same: tuple[bool, ...]
    top5_overlaps: tuple[int, ...]
    reference_margins: tuple[float, ...]  # the reference's top-1 minus top-2 score

    @property
    def top1_agreement(self) -> float:
        return float(np.mean(self.top1_same))

    def clear_top1_agreement(self, margin: float = CLEAR_MARGIN) -> float:
        """Top-1 agreement on the images whose reference top-1 leads by `margin` or
        more: near-ties, which any rounding may flip, left out."""
        return float(np.mean([same for same, lead in zip(self.top1_same, self.reference_margins) if lead >= margin]))

    @property
    def mean_top5_overlap(self) -> float:
        return float(np.mean(self.top5_overlaps))


def compare_classifiers(
    repository: Path, reference: str, candidate: str, images: dict[str, bytes] | None = None
) -> ClassifierAgreement:
    """Two presets' classifiers (e.g. FP32 and INT8) fed the reference preset's DALI
    tensors for the parity corpus: top-1 agreement and top-5 overlap per image.
    Agreement with a reference, not accuracy against ground truth."""
    encoded = list((images or parity_images()).values())
    tensors = dali_tensors(repository, reference, encoded)
    scores = [classify(repository, reference, tensors), classify(repository, candidate, tensors)]
    top5 = [np.argsort(each, axis=1)[:, ::-1][:, :5] for each in scores]
    leading = np.sort(scores[0], axis=1)
    return ClassifierAgreement(
        reference=reference,
        candidate=candidate,
        top1_same=tuple(bool(a[0] == b[0]) for a, b in zip(*top5)),
        top5_overlaps=tuple(len(set(a) & set(b)) for a, b in zip(*top5)),
        reference_margins=tuple(float(lead) for lead in leading[:, -1] - leading[:, -2]),
    )


def format_report(report: ParityReport) -> str:
    lines = [
        f"DALI ({report.preset}) vs Pillow, |difference| in 0..255 levels",
        f"{'image':28} {'size':>11} {'max':>6} {'mean':>7}  top-1 DALI/Pillow  top-5 shared",
    ]
    for r in report.images:
        lines.append(
            f"{r.name:28} {r.size[0]:>5}x{r.size[1]:<5} {r.max_abs_levels:6.2f} {r.mean_abs_levels:7.4f}"
            f"  {r.top1_dali:>5}/{r.top1_pillow:<5}{'' if r.top1_dali == r.top1_pillow else ' DIFFER':7}"
            f"      {r.top5_overlap}/5"
        )
    lines.append(
        f"top-1 agreement {report.top1_agreement:.0%}, identical top-5 sets {report.top5_agreement:.0%}, "
        f"max {report.max_abs_levels:.2f} levels, mean {report.mean_abs_levels:.4f} levels "
        f"over {len(report.images)} images"
    )
    return "\n".join(lines)
