"""A user's classifier run on real photos before the build writes anything: through
the DALI pipeline it will be served with, then ONNX Runtime, as the server will.

What it settles (build/own_classifier.py): whether the graph gives probabilities or
logits, whether a batch axis the exporter fixed at 1 can be made dynamic, and, for a
classifier with ImageNet's labels, whether the preprocessing options are right: each
photo's class must be in its top 5, or the build refuses, naming the options.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tritonstack.build.classifiers import Classifier, Preprocessing, imagenet_labels
from tritonstack.build.onnx_graph import SERVED_OUTPUT, servable_onnx

# Enough of ImageNet's 1000 names (after normalizing) for a label file to be ImageNet's.
IMAGENET_OVERLAP = 900
TOP = 5
PREPROCESSING_FLAGS = "--layout, --channel-order, --scale (or --mean/--std), --resize, --input-size"
# A batch run must equal single runs this closely (float summation order differs).
BATCH_TOLERANCE = 1e-3


def check_on_photos(classifier: Classifier, labels: list[str], softmax: str, notes: list[str], probabilities=False):
    """(the classifier with a softmax head if it needs one, notes); ValueError if wrong.
    `probabilities`: the graph ends in a Softmax, whose quantized rows need not sum to 1
    (small classes round to 0)."""
    photos = _photos()
    tensors = _preprocessed(classifier.preprocessing, [data for data, _ in photos.values()])
    scores = _scores(classifier, tensors, notes)
    summing_to_one = probabilities or bool(np.all(scores >= 0) and np.allclose(scores.sum(axis=1), 1, atol=1e-3))
    if softmax == "yes" or (softmax == "auto" and not summing_to_one):
        classifier, scores = with_softmax(classifier), softmax_rows(scores)
        notes.append("output: logits -> a softmax head added (the ensemble answers probabilities)")
    else:
        notes.append("output: probabilities" if summing_to_one else "output: scores kept as they are (--softmax no)")
    names = [_normalized(label) for label in labels]
    if len(set(names) & {_normalized(name) for name in imagenet_labels()}) < IMAGENET_OVERLAP:
        notes.append("labels are not ImageNet's: no photo check of the preprocessing")
        return classifier, notes
    wrong = []
    for row, (photo, (_, expected)) in enumerate(photos.items()):
        top = [names[index] for index in np.argsort(-scores[row])[:TOP]]
        if expected and not {_normalized(name) for name in expected} & set(top):
            wrong.append(f"{photo} -> {', '.join(top[:3])}")
    if wrong:
        raise ValueError(
            f"{classifier.name} misclassifies real photos ({'; '.join(wrong)}): its preprocessing is not the one it "
            f"was trained with; check {PREPROCESSING_FLAGS} (docs/building.md#bring-your-own-classifier)"
        )
    notes.append(f"ImageNet labels: {', '.join(photos)} ranked right (top {TOP})")
    return classifier, notes


def _photos() -> dict[str, tuple[bytes, set[str]]]:
    """scikit-image's photos with their ImageNet classes; without it, the packaged sample."""
    from tritonstack.samples.photos import PHOTOS, SAMPLE_CLIP_LABELS, photo_bytes, sample_jpeg

    try:
        return {name: (photo_bytes(name), expected) for name, expected in PHOTOS.items() if expected}
    except FileNotFoundError:
        return {"sample.jpg": (sample_jpeg(), SAMPLE_CLIP_LABELS)}


def _preprocessed(preprocessing: Preprocessing, encoded: list[bytes]) -> np.ndarray:
    from tritonstack.build.pipelines import run_pipeline, serialize_pipeline

    return run_pipeline(serialize_pipeline(preprocessing, max_batch_size=len(encoded), num_threads=1), encoded)


def _scores(classifier: Classifier, tensors: np.ndarray, notes: list[str]) -> np.ndarray:
    """One row a photo, each run alone; with a batch axis made dynamic, a batch must agree."""
    import onnxruntime as ort

    graph = servable_onnx(classifier.onnx_file, False, classifier.dynamic_batch, classifier.dequantize)
    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])

    def run(batch: np.ndarray) -> np.ndarray:
        return session.run(None, {classifier.input_name: batch})[0]

    singles = np.concatenate([run(tensor[None]) for tensor in tensors])
    if classifier.dynamic_batch:
        try:
            batched = run(tensors)
        except Exception as error:  # ONNX Runtime's errors have no common type
            raise ValueError(
                f"{classifier.onnx_file}: fixes its batch at 1 inside the graph too ({type(error).__name__}); "
                "export it again with a dynamic batch axis"
            ) from error
        if not np.allclose(batched, singles, atol=BATCH_TOLERANCE, rtol=BATCH_TOLERANCE):
            raise ValueError(f"{classifier.onnx_file}: a batch does not give what single runs give; export it again")
        notes.append(f"batch axis fixed at 1 in the graph: made dynamic (a batch of {len(tensors)} = single runs)")
    return singles.astype(np.float64)


def _normalized(label: str) -> str:
    return label.replace("_", " ").strip().lower()


def softmax_rows(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def with_softmax(classifier: Classifier) -> Classifier:
    return replace(classifier, softmax=True, output_name=SERVED_OUTPUT)
