"""Classify encoded images with a Triton classification model, over HTTP or gRPC.

    client = ClassifierClient("127.0.0.1:8000", protocol="http")
    for top in client.classify([open("cat.jpg", "rb").read()], top_k=5):
        print(top[0].label, top[0].score)

Images travel as encoded bytes (the server decodes them): one row per image,
zero-padded to the longest, as binary tensor data. Input and output names come
from the model's metadata, and the ranking from Triton's classification extension.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

DEFAULT_MODEL = "ensemble_dali_efficientnet_lite0"
PROTOCOLS = ("http", "grpc")


@dataclass(frozen=True)
class Prediction:
    label: str
    index: int
    score: float


def pad_batch(images: list[bytes]) -> np.ndarray:
    """[len(images), longest] uint8, each row an encoded image, zero-padded.
    Decoders stop at the image's end marker, so the padding is never read."""
    longest = max(len(image) for image in images)
    batch = np.zeros((len(images), longest), dtype=np.uint8)
    for row, image in zip(batch, images):
        row[: len(image)] = np.frombuffer(image, dtype=np.uint8)
    return batch


def parse_classification(entries) -> list[Prediction]:
    """Triton's classification strings, "score:index:label", best first."""
    predictions = []
    for entry in entries:
        text = entry.decode() if isinstance(entry, bytes) else str(entry)
        score, index, label = text.split(":", 2)
        predictions.append(Prediction(label=label, index=int(index), score=float(score)))
    return predictions


class ClassifierClient:
    def __init__(self, url: str, protocol: str = "http", model: str = DEFAULT_MODEL):
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, not {protocol!r}")
        self.protocol = protocol
        self.model = model
        self._api = httpclient if protocol == "http" else grpcclient
        self._client = self._api.InferenceServerClient(url)
        metadata = self._client.get_model_metadata(model)
        if protocol == "grpc":
            metadata = {"inputs": [{"name": t.name} for t in metadata.inputs],
                        "outputs": [{"name": t.name} for t in metadata.outputs]}
        self.input_name = metadata["inputs"][0]["name"]
        self.output_name = metadata["outputs"][0]["name"]

    def classify(self, images: list[bytes], top_k: int = 5) -> list[list[Prediction]]:
        result = self._infer(images, class_count=top_k)
        return [parse_classification(row) for row in result.as_numpy(self.output_name)]

    def probabilities(self, images: list[bytes]) -> np.ndarray:
        return self._infer(images, class_count=0).as_numpy(self.output_name)

    def _infer(self, images: list[bytes], class_count: int):
        batch = pad_batch(images)
        tensor = self._api.InferInput(self.input_name, list(batch.shape), "UINT8")
        if self.protocol == "http":
            tensor.set_data_from_numpy(batch, binary_data=True)
            output = httpclient.InferRequestedOutput(self.output_name, binary_data=True, class_count=class_count)
        else:
            tensor.set_data_from_numpy(batch)
            output = grpcclient.InferRequestedOutput(self.output_name, class_count=class_count)
        return self._client.infer(self.model, [tensor], outputs=[output])

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "ClassifierClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
