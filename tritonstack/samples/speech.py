"""Audio with known speech spans, for the audio tests, the benchmark and the load tests:
speech synthesized by espeak-ng (libespeak-ng and its voices from the espeakng-loader
wheel, driven through ctypes), silence, and music (chords), laid end to end; encoded
by the imageio-ffmpeg wheel's static ffmpeg, byte-identical run to run.

    track = speech_track([("silence", 1.0), ("speech", "Hello there"), ("music", 2.0)])
    flac = encode(track.samples, "flac")
    track.speech_spans  # [(start_s, end_s)] of the words themselves

`sample_speech()` is one such clip, the same every time: the benchmark's and the
Locust users' workload.
"""

from __future__ import annotations

import ctypes
import functools
import io
import subprocess
import tempfile
import threading
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SAMPLE_RATE = 22050  # espeak-ng's
_SYNCHRONOUS = 2  # espeak_AUDIO_OUTPUT AUDIO_OUTPUT_SYNCHRONOUS
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
_LOCK = threading.Lock()  # the library holds one synthesizer per process
# An utterance's edges: where its envelope first and last passes this share of its peak.
_EDGE_SHARE = 0.02
# Encodings as the tests send them: (ffmpeg output options, container suffix).
FORMATS = {
    "wav48k_stereo": (["-ar", "48000", "-ac", "2", "-c:a", "pcm_s16le"], "wav"),
    "flac": (["-c:a", "flac"], "flac"),
    "ogg_vorbis": (["-c:a", "libvorbis", "-q:a", "4"], "ogg"),
    "ogg_opus": (["-c:a", "libopus", "-ar", "48000", "-b:a", "48k"], "ogg"),
}


@dataclass(frozen=True)
class Track:
    samples: np.ndarray  # int16 mono at SAMPLE_RATE
    speech_spans: list[tuple[float, float]]  # seconds, of the words themselves

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


@functools.cache
def _espeak():
    import espeakng_loader

    library = ctypes.CDLL(espeakng_loader.get_library_path())
    rate = library.espeak_Initialize(_SYNCHRONOUS, 0, espeakng_loader.get_data_path().encode(), 0)
    if rate != SAMPLE_RATE:
        raise RuntimeError(f"espeak-ng did not start (espeak_Initialize gave {rate})")
    chunks: list[np.ndarray] = []

    def collect(wav, count, events):
        if count > 0:
            chunks.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
        return 0

    callback = _CALLBACK(collect)  # kept alive with the library
    library.espeak_SetSynthCallback(callback)
    library.espeak_SetVoiceByName(b"en")
    return library, chunks, callback


def synthesize(text: str) -> np.ndarray:
    """int16 mono speech at SAMPLE_RATE."""
    with _LOCK:
        library, chunks, _ = _espeak()
        chunks.clear()
        encoded = text.encode()
        library.espeak_Synth(encoded, len(encoded) + 1, 0, 0, 0, 0, None, None)
        library.espeak_Synchronize()
        return np.concatenate(chunks).astype(np.int16)


def music(seconds: float, seed: int = 0) -> np.ndarray:
    """Chords (four notes, each with two overtones, a soft attack and a decay), half a
    second each: int16 at SAMPLE_RATE. Silero VAD gives them at most about 0.47; a
    melody of single piano-like notes reached 0.98 in some frames (docs/audio.md)."""
    rng = np.random.default_rng(seed)
    chord_s = 0.5
    t = np.arange(int(chord_s * SAMPLE_RATE)) / SAMPLE_RATE
    envelope = np.minimum(t / 0.02, 1) * np.exp(-t * 3)
    chords = []
    for _ in range(int(seconds / chord_s)):
        root = 110 * 2 ** (rng.integers(0, 12) / 12)
        tone = sum(np.sin(2 * np.pi * root * ratio * k * t) / k**2 for ratio in (1, 1.26, 1.5, 2) for k in range(1, 4))
        chords.append(tone * envelope)
    played = np.concatenate(chords) if chords else np.zeros(0)
    return (played / max(np.abs(played).max(), 1e-9) * 0.5 * 32767).astype(np.int16)


def speech_track(parts: list[tuple[str, float | str]]) -> Track:
    """("silence", seconds), ("music", seconds) and ("speech", text) parts, end to end."""
    pieces, spans, at = [], [], 0
    for kind, value in parts:
        if kind == "speech":
            piece = synthesize(str(value))
            first, last = _edges(piece)
            spans.append(((at + first) / SAMPLE_RATE, (at + last) / SAMPLE_RATE))
        elif kind == "music":
            piece = music(float(value), seed=at)
        else:
            piece = np.zeros(int(float(value) * SAMPLE_RATE), np.int16)
        pieces.append(piece)
        at += len(piece)
    return Track(np.concatenate(pieces), spans)


def _edges(speech: np.ndarray) -> tuple[int, int]:
    loud = np.flatnonzero(np.abs(speech.astype(np.float32)) > _EDGE_SHARE * np.abs(speech).max())
    return int(loud[0]), int(loud[-1]) + 1


def encode(samples: np.ndarray, fmt: str) -> bytes:
    """int16 mono at SAMPLE_RATE, encoded as FORMATS[fmt] describes."""
    import imageio_ffmpeg

    options, suffix = FORMATS[fmt]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"clip.{suffix}"
        subprocess.run(
            [imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-f", "s16le", "-ar", str(SAMPLE_RATE), "-ac", "1"]
            + ["-i", "-", *options, "-fflags", "+bitexact", "-flags:a", "+bitexact", "-map_metadata", "-1", str(path)],
            input=np.ascontiguousarray(samples, "<i2").tobytes(),
            check=True,
            capture_output=True,
            timeout=60,
        )
        return path.read_bytes()


# The benchmark's and the load tests' clip: about 15 s, three utterances between silence and music.
SAMPLE_PARTS = (
    ("silence", 1.0),
    ("speech", "Triton serves images and audio"),
    ("silence", 1.2),
    ("music", 3.0),
    ("silence", 0.8),
    ("speech", "Speech is found in every format"),
    ("silence", 1.0),
    ("music", 2.0),
    ("speech", "and this ends the test"),
    ("silence", 0.7),
)


@functools.cache
def sample_track() -> Track:
    return speech_track(list(SAMPLE_PARTS))


@functools.cache
def sample_speech(fmt: str = "flac") -> bytes:
    """sample_track() encoded (FORMATS)."""
    return encode(sample_track().samples, fmt)


@functools.cache
def tone_wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A 440 Hz tone as a 16-bit mono WAV, the same bytes every time, written with the
    standard library: the audio models' warmup (a real clip: random bytes do not decode)."""
    t = np.arange(round(rate * seconds)) / rate
    return wav_bytes((np.sin(2 * np.pi * 440 * t) * 0.3 * 32767).astype(np.int16), rate)


def wav_bytes(samples: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    """int16 mono samples as a WAV, with the standard library alone (no ffmpeg: the
    Locust users, which run under gevent, use it)."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(rate)
        clip.writeframes(np.ascontiguousarray(samples, "<i2").tobytes())
    return buffer.getvalue()
