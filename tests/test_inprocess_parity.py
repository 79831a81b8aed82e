"""The served probabilities equal the same serialized pipeline and the same ONNX
model run in this process, without the server."""

import numpy as np
import onnxruntime as ort
from nvidia.dali import Pipeline

from tritonstack.client.classifier import ClassifierClient
from tritonstack.contract import pad_batch
from tritonstack.samples.photos import PHOTOS, photo_bytes


def inprocess_probabilities(model_repository, images):
    serialized = (model_repository / "preprocess_dali_efficientnet_lite0/1/model.dali").read_bytes()
    pipeline = Pipeline.deserialize(
        serialized_pipeline=serialized,
        batch_size=len(images),
        num_threads=1,
        device_id=None,
        prefetch_queue_depth=1,
    )
    pipeline.build()
    pipeline.feed_input("DALI_INPUT_0", list(pad_batch(images)))
    (preprocessed,) = pipeline.run()
    session = ort.InferenceSession(str(model_repository / "efficientnet_lite0/1/model.onnx"))
    return session.run(["probabilities"], {"input": np.asarray(preprocessed.as_tensor())})[0]


def test_served_probabilities_match_inprocess_run(server, model_repository):
    images = [photo_bytes(name) for name in PHOTOS]
    expected = inprocess_probabilities(model_repository, images)
    with ClassifierClient(server.grpc_url, protocol="grpc") as client:
        served = client.probabilities(images)
    assert served.shape == expected.shape == (len(images), 1000)
    np.testing.assert_allclose(served, expected, atol=1e-4, rtol=0)
