"""Triton 2.51's ensemble trap (triton-inference-server/server#8631, fixed upstream
after 2.51 in core#466): when a step that runs beside another step of the same
request refuses requests at its `max_queue_size`, the refused requests are never
answered and the steps before the split stop serving. Reproduced here on a fan-out
ensemble (preprocessing, then the classifier twice in parallel); the same ensemble
with the bound on its first step, where `tritonstack build` puts it, answers or
refuses every request; and `tritonstack check` refuses the first layout."""

from __future__ import annotations

import concurrent.futures

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import repo_factory as rf
from tests.conftest import TEST_STOP_GRACE_S
from tritonstack.build.check import check_repository
from tritonstack.build.model_config import EnsembleStep, ModelConfig, QueuePolicy, Tensor, write_config
from tritonstack.build.presets import BuildOptions, preset_named
from tritonstack.build.repository import write_repository
from tritonstack.client.retry import is_refusal
from tritonstack.contract import ENSEMBLE_INPUT, PREPROCESS_INPUT, PREPROCESS_OUTPUT, pad_batch
from tritonstack.repository_files import read_config
from tritonstack.samples.photos import photo_bytes
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import ServerConfig

PRESET = preset_named("dali_efficientnet_lite0")
FANOUT = "ensemble_fanout"
BURST = 64
ANSWER_S = 15.0
# Showing the trap needs only requests that never come back: a burst's answers come
# within a few seconds here, so a shorter wait still tells a hang from a slow answer.
TRAP_ANSWER_S = 10.0


def fanout_repository(root, bound_on_classifier: bool):
    """Lite0 and an ensemble that runs the classifier twice on each preprocessed image."""
    rf.seed_lite0_export(root)
    # No latency objective: its ceilings would refuse part of the burst; the trap is the bound's.
    options = BuildOptions(max_queue_size=0 if bound_on_classifier else 2, latency_objective_ms=0)
    write_repository(root, presets=(PRESET,), options=options)
    classifier = PRESET.classifier
    if bound_on_classifier:  # the trap: the bound on the steps that run in parallel
        config = read_config(root / classifier.name)
        config.dynamic_batching.default_queue_policy.CopyFrom(QueuePolicy(max_queue_size=2).to_proto())
        write_config(root / classifier.name, config)
    outputs = ("FIRST", "SECOND")
    fanout = ModelConfig(
        name=FANOUT,
        platform="ensemble",
        max_batch_size=8,
        inputs=(Tensor(ENSEMBLE_INPUT, "UINT8", (-1,)),),
        outputs=tuple(Tensor(name, "FP32", (classifier.num_classes,)) for name in outputs),
        steps=(
            EnsembleStep(PRESET.preprocessing_name, {PREPROCESS_INPUT: ENSEMBLE_INPUT}, {PREPROCESS_OUTPUT: "pre"}),
            *(
                EnsembleStep(classifier.name, {classifier.input_name: "pre"}, {classifier.output_name: name})
                for name in outputs
            ),
        ),
    )
    (root / FANOUT / "1").mkdir(parents=True)
    write_config(root / FANOUT, fanout.to_proto())
    return root


def burst(server, answer_s: float = ANSWER_S) -> tuple[int, int, int]:
    """BURST requests at once to the fan-out ensemble: (answered, refused, no answer
    within `answer_s`)."""
    image = pad_batch([photo_bytes("coffee.png")])

    def one() -> str:
        with httpclient.InferenceServerClient(server.http_url, network_timeout=answer_s) as client:
            tensor = httpclient.InferInput(ENSEMBLE_INPUT, list(image.shape), "UINT8")
            tensor.set_data_from_numpy(image)
            try:
                client.infer(FANOUT, [tensor])
                return "answered"
            except InferenceServerException as error:
                return "refused" if is_refusal(error) else f"other: {error.status()} {error.message()}"
            except Exception:  # no answer within answer_s (the connection times out)
                return "no answer"

    with concurrent.futures.ThreadPoolExecutor(BURST) as pool:
        outcomes = list(pool.map(lambda _: one(), range(BURST)))
    assert not [o for o in outcomes if o.startswith("other")], outcomes
    return outcomes.count("answered"), outcomes.count("refused"), outcomes.count("no answer")


@pytest.mark.timeout(300)
def test_a_bound_on_a_parallel_step_hangs_triton_251(tmp_path):
    repository = fanout_repository(tmp_path, bound_on_classifier=True)
    problems = [str(p) for p in check_repository(repository)]
    assert any("runs beside another step" in p and "server#8631" in p for p in problems), problems
    with TritonServer(ServerConfig(repository, restricted_apis=(), stop_grace_s=1)) as server:
        answered, refused, unanswered = burst(server, TRAP_ANSWER_S)
    assert unanswered > 0, f"the trap did not show: {answered} answered, {refused} refused"


@pytest.mark.timeout(300)
def test_the_bound_on_the_first_step_answers_or_refuses_every_request(tmp_path):
    repository = fanout_repository(tmp_path, bound_on_classifier=False)
    assert [str(p) for p in check_repository(repository)] == []
    with TritonServer(ServerConfig(repository, restricted_apis=(), stop_grace_s=TEST_STOP_GRACE_S)) as server:
        answered, refused, unanswered = burst(server)
        assert unanswered == 0 and refused > 0 and answered > 0, (answered, refused, unanswered)
        again = burst(server)  # and the ensemble still serves afterwards
        assert again[2] == 0 and again[0] > 0, again
