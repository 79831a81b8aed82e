"""Triton backend "python" model: speech segments from Silero VAD's frame probabilities.

The last step of the speech-segments ensemble (tritonstack/build/audio.py). It takes
one clip's `frame_probabilities` [1, n] and `sample_count` [1, 1] (16 kHz samples)
and answers `segments` [1, k, 3]: start and end in seconds and the mean probability
of the frames inside, k = 0 for a clip with no speech.

`speech_segments` is silero-vad's `get_speech_timestamps_from_probs` (MIT, silero_vad/
utils_vad.py), the state machine its own `get_speech_timestamps` runs, carried over
statement for statement so that the server answers what silero-vad answers on the same
samples (tests/test_audio.py compares them); silero-vad itself imports torch, which a
stub should not load. Its settings come from the model config's parameters, written by
`tritonstack build` (--vad-threshold, --min-speech-ms, ...).

The build copies this file, unchanged, to `<model>/1/model.py`; it imports only NumPy,
so it serves in the NGC container too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton: tests, clients
    pb_utils = None

PROBABILITIES_INPUT = "frame_probabilities"
SAMPLE_COUNT_INPUT = "sample_count"
SEGMENTS_OUTPUT = "segments"
SEGMENT_WIDTH = 3  # start_s, end_s, probability
SAMPLE_RATE = 16000
FRAME_SAMPLES = 512


@dataclass(frozen=True)
class SegmentSettings:
    """get_speech_timestamps' arguments, with its defaults."""

    threshold: float = 0.5
    min_speech_duration_ms: int = 250
    max_speech_duration_s: float = float("inf")
    min_silence_duration_ms: int = 100
    speech_pad_ms: int = 30

    def parameters(self) -> dict[str, str]:
        """As model config parameters (string values)."""
        return {field.name: str(getattr(self, field.name)) for field in fields(self)}

    @classmethod
    def from_parameters(cls, parameters: dict) -> SegmentSettings:
        values = {}
        for field in fields(cls):
            if field.name in parameters:
                values[field.name] = type(field.default)(parameters[field.name]["string_value"])
        return cls(**values)


def speech_segments(probabilities, sample_count: int, settings: SegmentSettings = SegmentSettings()) -> np.ndarray:
    """[k, 3] FP32: start_s, end_s and the mean probability of the frames that start
    inside each segment."""
    spans = speech_timestamps(probabilities, sample_count, settings)
    rows = np.zeros((len(spans), SEGMENT_WIDTH), np.float32)
    probabilities = np.asarray(probabilities, np.float32).reshape(-1)
    for row, (start, end) in zip(rows, spans):
        first, last = start // FRAME_SAMPLES, max(start // FRAME_SAMPLES + 1, -(-end // FRAME_SAMPLES))
        row[:] = start / SAMPLE_RATE, end / SAMPLE_RATE, probabilities[first:last].mean()
    return rows


def speech_timestamps(probabilities, sample_count: int, settings: SegmentSettings) -> list[tuple[int, int]]:
    """Speech spans in samples: get_speech_timestamps_from_probs at 16 kHz with its
    default use_max_poss_sil_at_max_speech=True and min_silence_at_max_speech=98."""
    segmenter = _Segmenter(settings)
    for i, probability in enumerate(np.asarray(probabilities, np.float32).reshape(-1).tolist()):
        segmenter.frame(FRAME_SAMPLES * i, probability)
    current = segmenter.current
    if current and sample_count - current["start"] > segmenter.min_speech:
        current["end"] = sample_count
        segmenter.speeches.append(current)
    return _padded(segmenter.speeches, segmenter.pad, sample_count)


class _Segmenter:
    """The loop of get_speech_timestamps_from_probs, a frame at a time; its names."""

    def __init__(self, settings: SegmentSettings):
        self.min_speech = SAMPLE_RATE * settings.min_speech_duration_ms / 1000
        self.pad = SAMPLE_RATE * settings.speech_pad_ms / 1000
        self.max_speech = SAMPLE_RATE * settings.max_speech_duration_s - FRAME_SAMPLES - 2 * self.pad
        self.min_silence = SAMPLE_RATE * settings.min_silence_duration_ms / 1000
        self.min_silence_at_max_speech = SAMPLE_RATE * 98 / 1000
        self.threshold = settings.threshold
        self.neg_threshold = max(settings.threshold - 0.15, 0.01)
        self.triggered, self.speeches, self.current = False, [], {}
        self.temp_end = self.prev_end = self.next_start = 0
        self.possible_ends = []

    def frame(self, sample: int, probability: float) -> None:
        if probability >= self.threshold and self.temp_end:
            silence = sample - self.temp_end
            if silence > self.min_silence_at_max_speech:
                self.possible_ends.append((self.temp_end, silence))
            self.temp_end = 0
            if self.next_start < self.prev_end:
                self.next_start = sample
        if probability >= self.threshold and not self.triggered:
            self.triggered = True
            self.current["start"] = sample
            return
        if self.triggered and sample - self.current["start"] > self.max_speech and not self._cut_long(sample):
            return
        if probability < self.neg_threshold and self.triggered:
            if not self.temp_end:
                self.temp_end = sample
            if sample - self.temp_end >= self.min_silence:
                self._end_speech()

    def _cut_long(self, sample: int) -> bool:
        """A segment past the longest: cut at its longest silence, or here when it had
        none (and then skip the rest of this frame: False)."""
        if self.possible_ends:
            self.prev_end, duration = max(self.possible_ends, key=lambda end: end[1])
            self.current["end"] = self.prev_end
            self.speeches.append(self.current)
            self.current = {}
            self.next_start = self.prev_end + duration
            if self.next_start < self.prev_end + sample:
                self.current["start"] = self.next_start
            else:
                self.triggered = False
            self._reset()
            return True
        self.current["end"] = sample
        self.speeches.append(self.current)
        self.current = {}
        self._reset()
        self.triggered = False
        return False

    def _end_speech(self) -> None:
        self.current["end"] = self.temp_end
        if self.current["end"] - self.current["start"] > self.min_speech:
            self.speeches.append(self.current)
        self.current = {}
        self._reset()
        self.triggered = False

    def _reset(self) -> None:
        self.prev_end = self.next_start = self.temp_end = 0
        self.possible_ends = []


def _padded(speeches: list[dict], pad: float, sample_count: int) -> list[tuple[int, int]]:
    """Each span widened by the padding, or by half the silence to its neighbour."""
    for i, speech in enumerate(speeches):
        if i == 0:
            speech["start"] = int(max(0, speech["start"] - pad))
        if i != len(speeches) - 1:
            silence = speeches[i + 1]["start"] - speech["end"]
            if silence < 2 * pad:
                speech["end"] += int(silence // 2)
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - silence // 2))
            else:
                speech["end"] = int(min(sample_count, speech["end"] + pad))
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - pad))
        else:
            speech["end"] = int(min(sample_count, speech["end"] + pad))
    return [(speech["start"], speech["end"]) for speech in speeches]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self._settings = SegmentSettings.from_parameters(config.get("parameters", {}))

    def execute(self, requests):
        return [self._answer(request) for request in requests]

    def _answer(self, request):
        probabilities = pb_utils.get_input_tensor_by_name(request, PROBABILITIES_INPUT).as_numpy()
        counts = pb_utils.get_input_tensor_by_name(request, SAMPLE_COUNT_INPUT).as_numpy().reshape(-1)
        # One clip per row; a request of several holds them zero-padded to one length,
        # each answered with its own segments, padded with zero rows to the longest.
        answers = [speech_segments(row, int(count), self._settings) for row, count in zip(probabilities, counts)]
        longest = max(len(answer) for answer in answers)
        segments = np.zeros((len(answers), longest, SEGMENT_WIDTH), np.float32)
        for row, answer in zip(segments, answers):
            row[: len(answer)] = answer
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(SEGMENTS_OUTPUT, segments)])
