"""Audio: what the speech-segments preset costs served, against silero-vad in-process on
the same work, side by side.

    tritonstack benchmark --audio --out reports/audio.json

Both sides find the speech segments of the same 15 s FLAC clip (tritonstack.samples.
speech: three utterances between silence and music), CONCURRENCY clips in flight:
- served: ensemble_audio_silero_vad over gRPC, one clip per request (DALI decodes and
  resamples, Silero VAD scores the frames, the python step cuts the segments);
- in-process: what a user writes without a server, in this process: a thread pool of
  CONCURRENCY workers, each decoding with a DALI pipeline of its own (the same decoder
  and resampler) and running silero-vad's own `get_speech_timestamps_sequence` (its
  fastest path: the sequence ONNX model, one ONNX Runtime thread).

Written (declared in tritonstack/measure/figures.py, AUDIO), each the median of
`repeats` interleaved rounds with `<key>_spread` [min, max]: audio seconds answered per
second of wall time and per second of CPU (the server's process tree; this process's
for the in-process side), and the ratios served / in-process. The target: served CPU
per second of audio within 1.5x of in-process (cost_ratio <= 1.5).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from tritonstack.benchmark.scenario import Asked, on_server, write_json
from tritonstack.build.vad_graph import SAMPLE_RATE, sequence_model_path
from tritonstack.contract import DEFAULT_AUDIO_MODEL
from tritonstack.measure.figures import AUDIO, Median, report
from tritonstack.measure.load_loops import Phase, closed_loop
from tritonstack.measure.load_settings import Settings
from tritonstack.measure.results import cpu_model
from tritonstack.measure.rounds import interleaved, ratios
from tritonstack.measure.server_usage import server_cpu_seconds
from tritonstack.samples.speech import sample_speech, sample_track

CONCURRENCY = 2  # the served VAD step's instances (one ONNX Runtime thread each)
CLIP_FORMAT = "flac"


@dataclass(frozen=True)
class AudioFigures:
    clip_seconds: float
    concurrency: int
    cpu_model: str
    cpu_count: int | None
    settings: dict
    errors: int
    served_audio_s_per_s: Median
    inprocess_audio_s_per_s: Median
    served_audio_s_per_cpu_s: Median
    inprocess_audio_s_per_cpu_s: Median
    speed_ratio: Median
    cost_ratio: Median


def run_audio(server, settings: Settings, log=print) -> dict:
    """The figures above, on `server` (which serves the audio preset)."""
    clip, seconds = sample_speech(CLIP_FORMAT), sample_track().seconds
    workers = _InProcessWorkers(CONCURRENCY)
    try:
        measures = {
            "served": lambda: _served(server, clip, settings),
            "inprocess": lambda: workers.phase(clip, settings),
        }
        rounds = interleaved(measures, settings.repeats, log)
    finally:
        workers.close()
    per_s = {name: [phase.images_per_s * seconds for phase in phases] for name, phases in rounds.items()}
    per_cpu = {name: [_per_cpu_s(phase, seconds) for phase in phases] for name, phases in rounds.items()}
    cost = ratios(per_cpu["inprocess"], per_cpu["served"])  # CPU per audio second, served / in-process
    figures = AudioFigures(
        clip_seconds=seconds,
        concurrency=CONCURRENCY,
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count(),
        settings={"seconds": settings.seconds, "warmup_s": settings.warmup_s, "repeats": settings.repeats},
        errors=sum(phase.errors for phases in rounds.values() for phase in phases),
        served_audio_s_per_s=Median.of(per_s["served"]),
        inprocess_audio_s_per_s=Median.of(per_s["inprocess"]),
        served_audio_s_per_cpu_s=Median.of([value for value in per_cpu["served"] if value]),
        inprocess_audio_s_per_cpu_s=Median.of([value for value in per_cpu["inprocess"] if value]),
        speed_ratio=Median.of(ratios(per_s["served"], per_s["inprocess"])),
        cost_ratio=Median.of(cost),
    )
    return report(AUDIO, figures)


@dataclass(frozen=True)
class AudioCost:
    """`--audio`: the speech-segments preset served against silero-vad in-process."""

    name: str = "audio"

    def wanted(self, asked: Asked) -> bool:
        return asked.audio

    def run(self, asked: Asked, server, log) -> dict:
        return on_server(lambda on: run_audio(on, asked.settings, log), asked.repository, server)

    def write(self, results: dict, asked: Asked) -> str:
        write_json(results, asked.out)
        return (
            f"{asked.out}: served {results['served_audio_s_per_s']:.1f} audio s/s, in-process "
            f"{results['inprocess_audio_s_per_s']:.1f}; CPU per audio second served / in-process "
            f"x{results['cost_ratio']:.2f} (rounds {results['cost_ratio_spread']})"
        )


SCENARIO = AudioCost()


def _per_cpu_s(phase: Phase, clip_seconds: float) -> float | None:
    rate = phase.images_per_cpu_s
    return rate * clip_seconds if rate else None


def _served(server, clip: bytes, settings: Settings) -> Phase:
    async def send(client, item):
        await client.classify_audio([item])

    cpu = server_cpu_seconds(server)
    phase = asyncio.run(
        closed_loop(
            server.grpc_url, "grpc", DEFAULT_AUDIO_MODEL, [clip], CONCURRENCY, settings.seconds, settings.warmup_s, send
        )
    )
    phase.server_cpu_s, phase.warmup_s = server_cpu_seconds(server) - cpu, settings.warmup_s
    return phase


class _InProcessWorkers:
    """CONCURRENCY threads, each with its own DALI pipeline (a pipeline is not shared
    between threads) and one silero-vad sequence model of one thread."""

    def __init__(self, count: int):
        self._pool = ThreadPoolExecutor(count, thread_name_prefix="inprocess-vad")
        self._count = count
        self._local = threading.local()

    def phase(self, clip: bytes, settings: Settings) -> Phase:
        """Clips done in `settings.seconds` after warm-up, and this process's CPU then."""
        phase = Phase(images=0)
        start = time.monotonic()
        measure_from, end = start + settings.warmup_s, start + settings.warmup_s + settings.seconds
        cpu = time.process_time()
        done = list(self._pool.map(lambda _: self._loop(clip, measure_from, end), range(self._count)))
        phase.images = sum(done)
        phase.seconds = settings.seconds
        phase.server_cpu_s, phase.warmup_s = time.process_time() - cpu, settings.warmup_s
        return phase

    def _loop(self, clip: bytes, measure_from: float, end: float) -> int:
        done = 0
        while time.monotonic() < end:
            self._segments(clip)
            if measure_from <= time.monotonic() <= end:
                done += 1
        return done

    def _segments(self, clip: bytes) -> list[dict]:
        from silero_vad import get_speech_timestamps_sequence

        pipeline, model = self._tools()
        pipeline.feed_input("DALI_INPUT_0", [np.frombuffer(clip, np.uint8)])
        (samples,) = pipeline.run()
        return get_speech_timestamps_sequence(np.asarray(samples[0]), model, sampling_rate=SAMPLE_RATE)

    def _tools(self):
        if not hasattr(self._local, "pipeline"):
            from nvidia.dali import Pipeline
            from silero_vad.sequence_vad import SileroVADSequence

            from tritonstack.build.pipelines import serialize_speech_pipeline

            serialized = serialize_speech_pipeline(SAMPLE_RATE, 1, 1)
            pipeline = Pipeline.deserialize(serialized_pipeline=serialized, batch_size=1, num_threads=1, device_id=None)
            pipeline.build()
            self._local.pipeline = pipeline
            self._local.model = SileroVADSequence(str(sequence_model_path()))
        return self._local.pipeline, self._local.model

    def close(self) -> None:
        self._pool.shutdown(wait=True)
