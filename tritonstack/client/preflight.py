"""Before a command line or a load test starts its real work: does Triton answer
at the address, in that protocol, and does it serve the model as an image
classifier (one input of encoded image bytes)? One line saying what is wrong
otherwise, with what to use instead.

    check_model("127.0.0.1:8000", "http", "resnet50")
    # ModelError: model 'resnet50' not found at 127.0.0.1:8000; available image classifiers: ensemble_...
"""

from __future__ import annotations

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tritonstack.cli import UsageError
from tritonstack.client.retry import RetryPolicy, ServerUnavailableError, explain_unreachable, wrong_protocol_message
from tritonstack.contract import ADMIN_KEY_ENV, ENSEMBLE_BOXES, ENSEMBLE_SEGMENTS

PREFLIGHT_TIMEOUT_S = 10.0
# Triton's words for a model name it does not know (HTTP 400, gRPC NOT_FOUND / UNAVAILABLE).
_UNKNOWN_MODEL = ("is not found", "unknown model")


class ModelError(UsageError):
    """The server answers, but not with the model asked for."""


def takes_encoded_images(metadata: dict) -> bool:
    """One UINT8 input of encoded images (beside a regions model's boxes)."""
    inputs = [tensor for tensor in metadata.get("inputs", []) if tensor["name"] != ENSEMBLE_BOXES]
    return len(inputs) == 1 and inputs[0]["datatype"] == "UINT8"


def takes_boxes(metadata: dict) -> bool:
    return any(tensor["name"] == ENSEMBLE_BOXES for tensor in metadata.get("inputs", []))


def classifies_images(metadata: dict) -> bool:
    """Encoded images in, one row of class scores per image out (a preprocessing
    model takes images too, but answers pixels)."""
    outputs = metadata.get("outputs", [])
    return takes_encoded_images(metadata) and len(outputs) >= 1 and len(outputs[0]["shape"]) <= 2


def check_model(
    url: str,
    protocol: str,
    model: str,
    headers: dict[str, str] | None = None,
    retry: RetryPolicy = RetryPolicy(),
    boxes: bool = False,
) -> None:
    """Return when `model` is ready at `url` and takes encoded images, and boxes when
    `boxes` is set (a regions model) or none when not; raise ServerUnavailableError (no
    server, wrong port or protocol, not ready) or ModelError (unknown model, not an image
    model, boxes where none are taken or none where they are) otherwise."""
    client = _Client(url, protocol, headers)
    try:
        try:
            ready = retry.call(client.server_ready)
        except Exception as error:
            if protocol == "grpc" and _answers_http(url):  # Triton's HTTP port just closes a gRPC channel
                raise ServerUnavailableError(wrong_protocol_message(url, protocol, None)) from error
            raise ServerUnavailableError(explain_unreachable(url, protocol, error)) from error
        if not ready:
            raise ServerUnavailableError(
                f"Triton at {url} is not ready yet (models still loading?): "
                "try again in a few seconds, or read the server's log"
            )
        try:
            metadata = client.metadata(model)
        except InferenceServerException as error:
            if not any(words in str(error.message()) for words in _UNKNOWN_MODEL):
                raise
            raise ModelError(f"model {model!r} not found at {url}; {client.image_models_text()}") from None
        if not takes_encoded_images(metadata):
            taken = ", ".join(f"{i['datatype']} {i['name']!r}" for i in metadata.get("inputs", []))
            raise ModelError(
                f"model {model!r} takes {taken or 'no input'}, not encoded images; {client.image_models_text()}"
            )
        if not classifies_images(metadata) and not answers_segments(metadata):
            answer = ", ".join(f"{o['datatype']} {o['shape']}" for o in metadata.get("outputs", []))
            raise ModelError(
                f"model {model!r} takes encoded images but answers {answer}, not class scores; "
                f"{client.image_models_text()}"
            )
        if takes_boxes(metadata) != boxes:
            raise ModelError(
                f"model {model!r} takes an image and its boxes: give --boxes"
                if not boxes
                else f"model {model!r} takes no boxes: name a regions model (ensemble_regions_...) with --boxes"
            )
        if not client.model_ready(model):
            raise ServerUnavailableError(f"model {model!r} is not ready at {url}: read the server's log")
    finally:
        client.close()


def _answers_http(url: str) -> bool:
    try:
        with httpclient.InferenceServerClient(url, connection_timeout=2.0, network_timeout=2.0) as client:
            client.is_server_live()
        return True
    except Exception:  # nothing there, or not HTTP either
        return False


def answers_segments(metadata: dict) -> bool:
    """An audio model: encoded clips in, speech segments out (tritonstack.contract)."""
    return takes_encoded_images(metadata) and any(o["name"] == ENSEMBLE_SEGMENTS for o in metadata.get("outputs", []))


class _Client:
    """The few calls a preflight makes, alike for both protocols (JSON answers)."""

    def __init__(self, url: str, protocol: str, headers: dict[str, str] | None):
        self.headers = headers
        if protocol == "http":
            self._client = httpclient.InferenceServerClient(
                url, connection_timeout=PREFLIGHT_TIMEOUT_S, network_timeout=PREFLIGHT_TIMEOUT_S
            )
            self._json: dict = {}
        else:
            self._client = grpcclient.InferenceServerClient(url)
            self._json = {"as_json": True}

    def server_ready(self) -> bool:
        return self._client.is_server_ready(headers=self.headers)

    def model_ready(self, model: str) -> bool:
        return self._client.is_model_ready(model, headers=self.headers)

    def metadata(self, model: str) -> dict:
        return self._client.get_model_metadata(model, headers=self.headers, **self._json)

    def image_models(self) -> list[str] | None:
        """Ready models that classify encoded images; None when the server does not
        list its models to us (the repository index needs the admin key)."""
        try:
            index = self._client.get_model_repository_index(headers=self.headers, **self._json)
        except InferenceServerException:
            return None
        entries = index.get("models", []) if isinstance(index, dict) else index
        ready = sorted(entry["name"] for entry in entries if entry.get("state") == "READY")
        return [name for name in ready if classifies_images(self.metadata(name))]

    def image_models_text(self) -> str:
        names = self.image_models()
        if names is None:
            return f"set ${ADMIN_KEY_ENV} (the server's admin key) to see the models it serves"
        return (
            f"available image classifiers: {', '.join(names)}" if names else "the server has no image classifier ready"
        )

    def close(self) -> None:
        self._client.close()
