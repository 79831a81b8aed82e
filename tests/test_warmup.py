"""The launcher sends every loaded ensemble a real sample (a photo, with a box for a
regions ensemble; the clip for a video ensemble) before it calls the server ready: the first client request then
costs about what the next ones do."""

from __future__ import annotations

import logging
import statistics
import time

import pytest

from tritonstack.client.classifier import ClassifierClient
from tritonstack.contract import (
    BATCH_PRIORITY,
    DEFAULT_MODEL,
    DEFAULT_REGIONS_MODEL,
    DEFAULT_VIDEO_MODEL,
    ENSEMBLE_BOXES,
    ENSEMBLE_INPUT,
    ENSEMBLE_SEGMENTS,
    is_audio_model,
    is_regions_model,
)
from tritonstack.samples.photos import photo_bytes, sample_jpeg
from tritonstack.serve import warmup_request
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.warmup import REQUESTS_PER_ENSEMBLE, warm_ensembles
from tritonstack.serve.warmup_request import main as warmup_request_main

FRESH_STARTS = 2


def test_every_ensemble_of_the_repository_answers_its_sample(server, model_repository):
    report = warm_ensembles(server.http_url, server.loaded, budget_s=120)
    ensembles = {path.parent.name for path in model_repository.glob("ensemble_*/config.pbtxt")}
    assert set(report.took_s) == ensembles and DEFAULT_VIDEO_MODEL in ensembles, report.summary()
    assert not report.skipped, report.summary()
    assert all(len(times) == REQUESTS_PER_ENSEMBLE for times in report.took_s.values())


def test_a_spent_budget_is_reported_not_raised(server):
    report = warm_ensembles(server.http_url, server.loaded, budget_s=0)
    assert not report.took_s and "budget is spent" in report.summary(), report.summary()


def test_the_standalone_request_refuses_until_ready_and_names_a_refusal(server, tmp_path, capsys):
    sample = tmp_path / "not-an-image"
    sample.write_bytes(b"this is not an image" * 10)
    assert warmup_request_main(["--url", "http://127.0.0.1:1", "--model", DEFAULT_MODEL, str(sample)]) == 1
    assert warmup_request_main(["--url", f"http://{server.http_url}", "--model", DEFAULT_MODEL, str(sample)]) == 1
    assert f"warmup: {DEFAULT_MODEL}: HTTP 400" in capsys.readouterr().err


def test_first_request_after_ready_answers_like_the_next_ten(lite0_repository, caplog):
    """A cold path is slow at every start; a stall of a busy 2-core machine (seen once:
    122 ms against 33) hits one start: a second fresh start decides."""
    photo = photo_bytes("coffee.png")  # not the warmup's sample: a client's own photo
    seen = []
    for _ in range(FRESH_STARTS):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="tritonstack.serve"):
            with TritonServer(lite0_repository) as server:
                warmed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warmup:")]
                with ClassifierClient(server.grpc_url, "grpc", DEFAULT_MODEL) as client:
                    took = []
                    for _ in range(11):
                        started = time.perf_counter()
                        client.classify([photo], top_k=1)
                        took.append(time.perf_counter() - started)
        assert len(warmed) == 1 and DEFAULT_MODEL in warmed[0], warmed
        first, median = took[0], statistics.median(took[1:])
        seen.append(f"first {first * 1000:.0f} ms, median of the next ten {median * 1000:.0f} ms")
        if first < 3 * median:
            return
    pytest.fail(f"in each of {FRESH_STARTS} fresh starts: {'; '.join(seen)}")


def test_the_standalone_request_speaks_the_contract_and_warms_a_regions_ensemble(server, tmp_path, capsys):
    """The chart's probe imports nothing of ours: its tensor names are the contract's, and a
    regions ensemble listed in the chart's models answers its sample with one box."""
    assert (warmup_request.INPUT_NAME, warmup_request.BOXES_NAME) == (ENSEMBLE_INPUT, ENSEMBLE_BOXES)
    assert is_regions_model(warmup_request.REGIONS_PREFIX + "efficientnet_lite0")
    assert is_audio_model(warmup_request.AUDIO_PREFIX + "silero_vad")
    assert warmup_request.WARMUP_PRIORITY == BATCH_PRIORITY
    assert warmup_request.SEGMENTS_NAME == ENSEMBLE_SEGMENTS
    sample = tmp_path / "sample.jpg"
    sample.write_bytes(sample_jpeg())
    url = f"http://{server.http_url}"
    assert warmup_request_main(["--url", url, "--model", DEFAULT_REGIONS_MODEL, str(sample)]) == 0
    assert f"warmup: {DEFAULT_REGIONS_MODEL} answered" in capsys.readouterr().out
