"""The peer: the image classification service a user writes instead of Triton.

FastAPI under uvicorn (one process a worker), Pillow with its default 8-bit
antialiased bilinear resize, ONNX Runtime with one thread, one image a request, the
blocking work (decode, preprocessing, ONNX Runtime) in FastAPI's threadpool, as its
docs advise: a worker's event loop keeps reading requests while an image is computed,
instead of stopping until it is done. `tritonstack benchmark` starts it
(tritonstack.benchmark.peer) with the same classifier files the repository serves:

    TRITONSTACK_PEER_MODELS='{"efficientnet_lite0": {"onnx": "...", "labels": "...",
        "input_name": "...", "resize_shorter": 256, "crop": 224, "mean": [...], "std": [...]}}' \\
    uvicorn tritonstack.benchmark.peer_service:app --workers 2

    POST /classify/<model>   body: the encoded image   ->   {"top5": [[label, probability], ...]}

It imports nothing else of this project: it is the baseline, not a part of the stack.
"""

import io
import json
import os

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from PIL import Image, ImageOps, UnidentifiedImageError

MODELS_ENV = "TRITONSTACK_PEER_MODELS"


def preprocess(data: bytes, resize_shorter: int, crop: int, mean, std) -> np.ndarray:
    """Encoded image -> normalized FP32 [3, crop, crop], in 8 bits until the end."""
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    scale = resize_shorter / min(image.size)
    image = image.resize((max(round(image.width * scale), 1), max(round(image.height * scale), 1)), Image.BILINEAR)
    left, top = (image.width - crop) // 2, (image.height - crop) // 2
    pixels = np.asarray(image.crop((left, top, left + crop, top + crop)), dtype=np.float32)
    return ((pixels - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)).transpose(2, 0, 1)


class Model:
    def __init__(self, onnx: str, labels: str, input_name: str, **preprocessing):
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(onnx, options, providers=["CPUExecutionProvider"])
        self.labels = open(labels).read().splitlines()
        self.input_name, self.preprocessing = input_name, preprocessing

    def top5(self, data: bytes) -> list[tuple[str, float]]:
        batch = preprocess(data, **self.preprocessing)[None]
        probabilities = self.session.run(None, {self.input_name: batch})[0][0]
        return [(self.labels[i], float(probabilities[i])) for i in np.argsort(probabilities)[::-1][:5]]


MODELS = {name: Model(**spec) for name, spec in json.loads(os.environ.get(MODELS_ENV, "{}")).items()}
app = FastAPI()


@app.get("/ready")
async def ready() -> dict:
    return {"models": sorted(MODELS)}


@app.post("/classify/{model}")
async def classify(model: str, request: Request) -> dict:
    if model not in MODELS:
        raise HTTPException(404, f"unknown model {model!r}")
    try:
        return {"top5": await run_in_threadpool(MODELS[model].top5, await request.body())}
    except (UnidentifiedImageError, OSError) as error:
        raise HTTPException(400, f"cannot decode the image: {error}") from error
