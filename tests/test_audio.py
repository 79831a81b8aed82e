"""The speech-segments preset (ensemble_audio_silero_vad) on the session server: real
speech (espeak-ng) between silence and music, in four encodings, over HTTP and gRPC;
the segments against silero-vad's own on the same samples; bad clips refused one by
one while the others in their batch are answered."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
import subprocess
import sys
import wave

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tritonstack.build import vad_graph
from tritonstack.build.segments_model import SegmentSettings, speech_timestamps
from tritonstack.client.classifier import ClassifierClient
from tritonstack.contract import DEFAULT_AUDIO_MODEL, ENSEMBLE_FRAME_PROBABILITIES, ENSEMBLE_INPUT, ENSEMBLE_SEGMENTS
from tritonstack.media.audio_header import AudioHeaderError, read_audio_header
from tritonstack.samples.speech import FORMATS, SAMPLE_RATE, encode, sample_track

PREPROCESS = "preprocess_audio_silero_vad"
# "every speech span found within 0.3 s of its edges" (the preset's promise, docs/audio.md)
EDGE_TOLERANCE_S = 0.3
FRAME_S = vad_graph.FRAME_SAMPLES / vad_graph.SAMPLE_RATE


@pytest.fixture(scope="module")
def track():
    """Three utterances between silence and music (chords)."""
    return sample_track()


@pytest.fixture(scope="module")
def encoded(track):
    return {fmt: encode(track.samples, fmt) for fmt in FORMATS}


def decoded_samples(repository, clip: bytes) -> np.ndarray:
    """The 16 kHz samples the served DALI pipeline gives for a clip, run here."""
    from nvidia.dali import Pipeline

    serialized = (repository / PREPROCESS / "1" / "model.dali").read_bytes()
    pipeline = Pipeline.deserialize(serialized_pipeline=serialized, batch_size=1, num_threads=1, device_id=None)
    pipeline.build()
    pipeline.feed_input("DALI_INPUT_0", [np.frombuffer(clip, np.uint8)])
    (samples,) = pipeline.run()
    return np.asarray(samples[0])


# --- without a server -------------------------------------------------------------------


def test_segment_state_machine_is_silero_vads():
    """speech_timestamps is get_speech_timestamps_from_probs, on noisy runs of speech
    and silence under every setting (max speech cut, padding, thresholds)."""
    from silero_vad.utils_vad import get_speech_timestamps_from_probs

    rng = np.random.default_rng(7)
    for _ in range(400):
        frames, run = int(rng.integers(0, 600)), int(rng.integers(1, 30))
        runs = np.repeat(rng.random(frames // run + 1) > 0.5, run)[:frames]
        probabilities = np.clip(runs * 0.8 + rng.normal(0, 0.2, frames), 0, 1).astype(np.float32)
        settings = SegmentSettings(
            threshold=float(rng.choice([0.3, 0.5, 0.7])),
            min_speech_duration_ms=int(rng.choice([0, 250])),
            max_speech_duration_s=float(rng.choice([math.inf, 1.0, 2.5])),
            min_silence_duration_ms=int(rng.choice([0, 100, 300])),
            speech_pad_ms=int(rng.choice([0, 30, 200])),
        )
        samples = max(frames * vad_graph.FRAME_SAMPLES - int(rng.integers(0, 512)), 0)
        theirs = get_speech_timestamps_from_probs(
            probabilities.tolist(),
            threshold=settings.threshold,
            min_speech_duration_ms=settings.min_speech_duration_ms,
            max_speech_duration_s=settings.max_speech_duration_s,
            min_silence_duration_ms=settings.min_silence_duration_ms,
            speech_pad_ms=settings.speech_pad_ms,
            audio_length_samples=samples,
        )
        assert speech_timestamps(probabilities, samples, settings) == [(t["start"], t["end"]) for t in theirs]


def test_served_vad_graph_is_the_sequence_model_with_silero_framing(track):
    """The graph's framing and zero state give silero-vad's own probabilities, to the bit
    on this CPU's kernels (asserted within 1e-5), for lengths around a frame's edge."""
    import onnxruntime as ort
    from silero_vad.sequence_vad import SileroVADSequence

    served = ort.InferenceSession(vad_graph.served_vad_onnx(), providers=["CPUExecutionProvider"])
    theirs = SileroVADSequence(str(vad_graph.sequence_model_path()))
    speech = track.samples.astype(np.float32) / 32768
    for length in (1, 511, 512, 513, 16000, len(speech)):
        probabilities, count = served.run(None, {vad_graph.SAMPLES_INPUT: speech[None, :length]})
        expected = theirs.audio_forward(speech[:length])
        assert probabilities.shape == (1, math.ceil(length / 512)) and int(count[0, 0]) == length
        np.testing.assert_allclose(probabilities[0], expected, atol=1e-5)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_headers_tell_format_and_length(track, encoded, fmt):
    header = read_audio_header(encoded[fmt])
    assert abs(header.seconds - track.seconds) < 0.05, header


@pytest.mark.parametrize(
    "name, clip, words",
    [
        ("empty", b"", "empty"),
        ("text", b"hello, this is not audio" * 4, "not audio"),
        ("mp3", b"ID3\x04\x00\x00\x00\x00\x00\x00" + bytes(200), "MP3"),
        ("streamed wav", "streamed", "pipe"),
        ("no samples", None, "no samples"),
    ],
)
def test_headers_refuse_what_the_decoder_would(name, clip, words):
    if clip is None:
        clip = _wav(np.zeros(0, np.int16), 16000)
    elif clip == "streamed":  # as ffmpeg writes a WAV to a pipe: both sizes at their maximum
        clip = bytearray(_wav(np.zeros(1600, np.int16), 16000))
        clip[4:8] = clip[40:44] = b"\xff\xff\xff\xff"
    with pytest.raises(AudioHeaderError, match=words):
        read_audio_header(clip)


def _wav(samples: np.ndarray, rate: int, width: int = 2) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(width)
        clip.setframerate(rate)
        clip.writeframes(samples.tobytes())
    return buffer.getvalue()


# --- served ---------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_speech_span_found_in_every_format(server, track, encoded, protocol):
    url = server.http_url if protocol == "http" else server.grpc_url
    with ClassifierClient(url, protocol, DEFAULT_AUDIO_MODEL) as client:
        answers = dict(zip(encoded, client.classify_audio(list(encoded.values()))))
    for fmt, answer in answers.items():
        found = [(segment.start_s, segment.end_s) for segment in answer.segments]
        for start, end in track.speech_spans:
            inside = [(s, e) for s, e in found if s < end and e > start]
            assert inside, f"{fmt}: speech {start:.2f}-{end:.2f} s not found in {found}"
            assert abs(inside[0][0] - start) <= EDGE_TOLERANCE_S and abs(inside[-1][1] - end) <= EDGE_TOLERANCE_S, (
                fmt,
                (start, end),
                found,
            )
        # No segment in silence or music: each one overlaps a spoken span.
        for s, e in found:
            assert any(s < end and e > start for start, end in track.speech_spans), (fmt, (s, e), track.speech_spans)
        assert all(0.5 <= segment.probability <= 1 for segment in answer.segments), answer.segments


def test_segments_equal_silero_vads_own_on_the_same_samples(server, model_repository, encoded):
    """silero-vad's get_speech_timestamps (its default TorchScript model, frame by
    frame) on the samples our DALI step decodes: the same segments, edges within one
    32 ms frame."""
    import torch
    from silero_vad import get_speech_timestamps, load_silero_vad

    model = load_silero_vad()
    with ClassifierClient(server.http_url, "http", DEFAULT_AUDIO_MODEL) as client:
        for fmt in ("flac", "ogg_opus"):
            samples = decoded_samples(model_repository, encoded[fmt])
            theirs = get_speech_timestamps(torch.from_numpy(samples), model)
            ours = client.classify_audio([encoded[fmt]])[0].segments
            assert len(ours) == len(theirs), (fmt, ours, theirs)
            for segment, timestamp in zip(ours, theirs):
                assert abs(segment.start_s - timestamp["start"] / SAMPLE_RATE_16K) <= FRAME_S + 1e-6
                assert abs(segment.end_s - timestamp["end"] / SAMPLE_RATE_16K) <= FRAME_S + 1e-6


SAMPLE_RATE_16K = vad_graph.SAMPLE_RATE


def test_stock_clients_get_segments_and_frame_probabilities(server, track, encoded):
    """Triton's own clients, no tritonstack code: one clip, [1, bytes] UINT8."""
    clip = np.frombuffer(encoded["wav48k_stereo"], np.uint8)[None]
    for api, client in (
        (httpclient, httpclient.InferenceServerClient(server.http_url)),
        (grpcclient, grpcclient.InferenceServerClient(server.grpc_url)),
    ):
        with client:
            tensor = api.InferInput(ENSEMBLE_INPUT, list(clip.shape), "UINT8")
            tensor.set_data_from_numpy(clip)
            outputs = [
                api.InferRequestedOutput(ENSEMBLE_SEGMENTS),
                api.InferRequestedOutput(ENSEMBLE_FRAME_PROBABILITIES),
            ]
            result = client.infer(DEFAULT_AUDIO_MODEL, [tensor], outputs=outputs)
            segments = result.as_numpy(ENSEMBLE_SEGMENTS)
            frames = result.as_numpy(ENSEMBLE_FRAME_PROBABILITIES)
        assert segments.shape == (1, len(track.speech_spans), 3)
        assert abs(frames.shape[1] - track.seconds / FRAME_S) <= 2, frames.shape
        assert frames.min() >= 0 and frames.max() <= 1


def test_clips_of_different_lengths_share_a_batch_and_bad_ones_fail_alone(server, track, encoded):
    """Concurrent requests from Triton's own asyncio client, good clips of six lengths
    among bad ones: each good one has its own segments, each bad one its own error, and
    the DALI step ran them in fewer executions than requests (they shared batches)."""
    silent = encode(np.zeros(SAMPLE_RATE * 2, np.int16), "flac")
    short = encode(track.samples[: int(3.2 * SAMPLE_RATE)], "ogg_vorbis")  # the first utterance
    good = {**encoded, "silent": silent, "short": short}
    bad = {
        "mp3": b"ID3\x04" + bytes(300),
        "text": b"not audio at all" * 10,
        "no samples": _wav(np.zeros(0, np.int16), 16000),
    }
    stats = httpclient.InferenceServerClient(server.http_url)
    shared = False
    for _ in range(3):  # a batch forms when requests queue behind a running one: nearly always at once
        before = _counts(stats, server.admin_headers())
        answers = asyncio.run(_send_concurrently(server.grpc_url, [*good.values(), *bad.values()]))
        after = _counts(stats, server.admin_headers())
        shared = shared or after[1] - before[1] < len(good) + len(bad)
        for name, answer in zip([*good, *bad], answers):
            if name in bad:
                assert isinstance(answer, InferenceServerException), (name, answer)
                assert "cannot be decoded" in str(answer), (name, answer)
                continue
            segments = answer.as_numpy(ENSEMBLE_SEGMENTS)
            expected = {"silent": 0, "short": 1}.get(name, len(track.speech_spans))
            assert segments.shape == (1, expected, 3), (name, segments)
        if shared:
            break
    stats.close()
    assert shared, "the DALI step never ran two clips in one batch"


async def _send_concurrently(url: str, clips: list[bytes]) -> list:
    import tritonclient.grpc.aio as grpc_aio

    async with grpc_aio.InferenceServerClient(url) as client:

        async def one(clip: bytes):
            tensor = np.frombuffer(clip, np.uint8)[None]
            request = grpcclient.InferInput(ENSEMBLE_INPUT, list(tensor.shape), "UINT8")
            request.set_data_from_numpy(tensor)
            try:
                return await client.infer(DEFAULT_AUDIO_MODEL, [request])
            except InferenceServerException as error:
                return error

        return await asyncio.gather(*(one(clip) for clip in clips))


def _counts(client, headers) -> tuple[int, int]:
    """The DALI step's requests and executions, failed ones included."""
    (model,) = client.get_inference_statistics(PREPROCESS, headers=headers)["model_stats"]
    failed = int(model["inference_stats"]["fail"]["count"])
    return model["inference_count"] + failed, model["execution_count"]


def _raw_request(url: str, clip: bytes):
    tensor = np.frombuffer(clip, np.uint8)[None]
    with httpclient.InferenceServerClient(url) as client:
        request = httpclient.InferInput(ENSEMBLE_INPUT, list(tensor.shape), "UINT8")
        request.set_data_from_numpy(tensor)
        try:
            return client.infer(DEFAULT_AUDIO_MODEL, [request])
        except InferenceServerException as error:
            return error


def test_a_clip_longer_than_the_model_takes_is_refused(server):
    """max_audio_seconds (300 by default), read from the header: 301 s of 8 kHz 8-bit silence."""
    too_long = _wav(np.full(8000 * 301, 128, np.uint8), 8000, width=1)
    error = _raw_request(server.http_url, too_long)
    assert isinstance(error, InferenceServerException) and "max_audio_seconds 300" in str(error), error
    with ClassifierClient(server.http_url, "http", DEFAULT_AUDIO_MODEL) as client:  # still serving
        assert client.classify_audio([_wav(np.zeros(16000, np.int16), 16000)])[0].segments == []


def test_classify_cli_answers_audio_beside_images(server, encoded, tmp_path):
    """`tritonstack classify` on a folder of audio and a photo: segments for the audio, a
    ranking for the photo, in jsonl, csv and the table."""
    from tritonstack.samples.photos import sample_jpeg

    (tmp_path / "speech.flac").write_bytes(encoded["flac"])
    (tmp_path / "talk.ogg").write_bytes(encoded["ogg_opus"])
    (tmp_path / "cat.jpg").write_bytes(sample_jpeg())
    outputs = {}
    for fmt in ("jsonl", "csv", "table"):
        run = subprocess.run(
            [sys.executable, "-m", "tritonstack", "classify", str(tmp_path), "--url", server.http_url, "--format", fmt],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        outputs[fmt] = run.stdout
    lines = {json.loads(line)["path"].rsplit("/", 1)[-1]: json.loads(line) for line in outputs["jsonl"].splitlines()}
    assert lines["cat.jpg"]["top"][0]["label"]
    for name in ("speech.flac", "talk.ogg"):
        segments = lines[name]["segments"]
        assert len(segments) == 3 and set(segments[0]) == {"start_s", "end_s", "probability"}, lines[name]
    rows = list(csv.DictReader(io.StringIO(outputs["csv"])))
    speech_rows = [row for row in rows if row["path"].endswith("speech.flac")]
    assert [row["label_1"] for row in speech_rows] == ["speech"] * 3, rows
    first = lines["speech.flac"]["segments"][0]
    assert abs(float(speech_rows[0]["start_s"]) - first["start_s"]) < 1e-3, speech_rows[0]
    assert [line for line in outputs["table"].splitlines() if "talk.ogg" in line][0].split()[1] == "speech"


def test_the_asyncio_client_answers_segments(server, encoded):
    from tritonstack.client.aio import AsyncClassifierClient

    async def ask():
        async with AsyncClassifierClient(server.grpc_url, "grpc", DEFAULT_AUDIO_MODEL) as client:
            return await client.classify_audio_each([encoded["flac"], b"not audio"], frame_probabilities=True)

    good, bad = asyncio.run(ask())
    assert len(good.segments) == 3 and good.frame_probabilities.max() > 0.5
    assert isinstance(bad, ValueError) and "not a clip the audio model reads" in str(bad)


def test_the_gpu_variant_is_written_and_checked_offline(tmp_path):
    """`--device gpu`: the DALI step on KIND_GPU hands its samples to the GPU (DALI decodes
    audio on the CPU only), the VAD on KIND_GPU, the segments on the CPU; `check` passes."""
    from tritonstack.build import audio
    from tritonstack.build.check import check_repository
    from tritonstack.build.presets import BuildOptions
    from tritonstack.rules.dali_proto import parse_pipeline

    audio.write_speech_preset(tmp_path, audio.SILERO_VAD, BuildOptions(device="gpu"))
    assert check_repository(tmp_path) == []
    spec = parse_pipeline((tmp_path / PREPROCESS / "1" / "model.dali").read_bytes())
    assert [port.device for port in spec.outputs] == ["gpu"]
    kinds = {name: (tmp_path / name / "config.pbtxt").read_text() for name in audio.SILERO_VAD.model_names[:3]}
    assert "KIND_GPU" in kinds[PREPROCESS] and "KIND_GPU" in kinds["silero_vad"]
    assert "KIND_CPU" in kinds["segments_silero_vad"]


def test_audio_benchmark_writes_its_declared_figures(server):
    """`tritonstack benchmark --audio`'s measurement, its shortest phases, on the session server."""
    from tritonstack.benchmark.audio_cost import run_audio
    from tritonstack.measure.figures import AUDIO, written_keys
    from tritonstack.measure.load_settings import SMOKE

    results = run_audio(server, SMOKE, log=lambda text: None)
    assert results["errors"] == 0
    assert set(written_keys(AUDIO)) - {"benchmark_seconds"} <= set(results)
    assert results["served_audio_s_per_s"] > 0 and results["inprocess_audio_s_per_s"] > 0
    assert results["cost_ratio"] > 0


@pytest.mark.parametrize("user", ["grpc", "http"])
def test_locust_users_send_speech_and_check_its_segments(server, tmp_path, user):
    """`tritonstack loadtest --audio`: the sample clip to the audio preset, each answer
    checked for its three segments; a few seconds, bounded by a request count."""
    from tritonstack.commands import loadtest
    from tritonstack.loadtests.report import final_stats

    servers = ["--url", server.http_url, "--grpc-url", server.grpc_url, "--metrics-url", server.metrics_url]
    bounds = ["--shape", "closed", "--users", "2", "--run-time", "8", "--max-requests", "12"]
    assert loadtest.main([*servers, "--out", str(tmp_path), "--user", user, "--audio", *bounds]) == 0
    rows = {(row["Type"], row["Name"]): row for row in final_stats(tmp_path / "locust")}
    row = rows[(user, DEFAULT_AUDIO_MODEL)]
    assert int(row["Request Count"]) >= 12 and row["Failure Count"] == "0", row
