"""Log-mel features, as an audio classifier was trained on them: their parameters (each
a `tritonstack build` option, declared once here), and a NumPy reference of the same
definition that `tritonstack parity` holds DALI's pipeline to.

    samples (16 kHz mono FP32) -> frames of `window_length`, `window_step` apart, no
    centering -> a periodic Hann window -> |rFFT| of `nfft` (magnitude) -> `mel_bins`
    triangular filters between `freq_low` and `freq_high` (HTK or Slaney mel scale, peak 1)
    -> log(mel + log_offset)

The defaults are YAMNet's (TensorFlow models/research/audioset/yamnet/params.py). The
pipeline itself is dali_model.log_mel_features; the classifier's patches are cut from the
frames in its served graph (build/audio_classifier_graph.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tritonstack import cli

MEL_FORMULAS = ("htk", "slaney")
FEATURES = cli.Group(
    "audio classifier features (docs/audio.md#bring-your-own-audio-classifier)",
    "The log-mel features your audio classifier was trained on; the defaults are YAMNet's.",
)


@dataclass(frozen=True)
class LogMelFeatures:
    sample_rate: int = cli.option(16000, "--sample-rate", type=cli.positive_int, metavar="HZ", group=FEATURES)
    window_length: int = cli.option(
        400, "--window-length", type=cli.positive_int, metavar="N", group=FEATURES, help="samples per frame"
    )
    window_step: int = cli.option(
        160, "--window-step", type=cli.positive_int, metavar="N", group=FEATURES, help="samples between frames"
    )
    nfft: int = cli.option(512, "--nfft", type=cli.positive_int, metavar="N", group=FEATURES, help="FFT size")
    mel_bins: int = cli.option(64, "--mel-bins", type=cli.positive_int, metavar="N", group=FEATURES)
    freq_low: float = cli.option(125.0, "--freq-low", type=float, metavar="HZ", group=FEATURES)
    freq_high: float = cli.option(7500.0, "--freq-high", type=float, metavar="HZ", group=FEATURES)
    mel_formula: str = cli.option("htk", "--mel-formula", choices=MEL_FORMULAS, group=FEATURES)
    log_offset: float = cli.option(0.001, "--log-offset", type=float, metavar="X", group=FEATURES, help="log(mel + X)")

    def __post_init__(self):
        if self.nfft < self.window_length:
            raise ValueError(f"--nfft {self.nfft} is shorter than --window-length {self.window_length}")
        if not 0 <= self.freq_low < self.freq_high <= self.sample_rate / 2:
            raise ValueError(
                f"need 0 <= --freq-low < --freq-high <= half the sample rate ({self.sample_rate / 2:g} Hz)"
            )
        if self.log_offset <= 0:
            raise ValueError(f"--log-offset must be above 0, not {self.log_offset}")


def periodic_hann(length: int) -> np.ndarray:
    """The window of TensorFlow's and torch's STFTs (DALI's default differs)."""
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(length) / length)).astype(np.float32)


def reference_log_mel(samples: np.ndarray, features: LogMelFeatures) -> np.ndarray:
    """[frames, mel_bins] FP32, computed in float64."""
    samples = np.asarray(samples, np.float64).reshape(-1)
    count = 1 + (len(samples) - features.window_length) // features.window_step
    if count <= 0:
        return np.zeros((0, features.mel_bins), np.float32)
    starts = features.window_step * np.arange(count)[:, None]
    frames = samples[starts + np.arange(features.window_length)[None, :]] * periodic_hann(features.window_length)
    spectrum = np.abs(np.fft.rfft(frames, n=features.nfft))
    mel = spectrum @ mel_filters(features).T
    return np.log(mel + features.log_offset).astype(np.float32)


def mel_filters(features: LogMelFeatures) -> np.ndarray:
    """[mel_bins, nfft // 2 + 1]: triangles between mel-spaced edges, each peaking at 1."""
    edges = _mel_to_hz(
        np.linspace(
            _hz_to_mel(features.freq_low, features.mel_formula),
            _hz_to_mel(features.freq_high, features.mel_formula),
            features.mel_bins + 2,
        ),
        features.mel_formula,
    )
    bins = np.arange(features.nfft // 2 + 1) * features.sample_rate / features.nfft
    low, center, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    return np.maximum(0, np.minimum((bins - low) / (center - low), (high - bins) / (high - center)))


# Slaney's scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above.
_SLANEY_BREAK_HZ, _SLANEY_BREAK_MEL = 1000.0, 15.0
_SLANEY_LOG_STEP = np.log(6.4) / 27


def _hz_to_mel(hz, formula: str):
    hz = np.asarray(hz, np.float64)
    if formula == "htk":
        return 2595 * np.log10(1 + hz / 700)
    linear = hz * 3 / 200
    return np.where(
        hz >= _SLANEY_BREAK_HZ, _SLANEY_BREAK_MEL + np.log(np.maximum(hz, 1e-9) / 1000) / _SLANEY_LOG_STEP, linear
    )


def _mel_to_hz(mel, formula: str):
    mel = np.asarray(mel, np.float64)
    if formula == "htk":
        return 700 * (10 ** (mel / 2595) - 1)
    return np.where(
        mel >= _SLANEY_BREAK_MEL, 1000 * np.exp((mel - _SLANEY_BREAK_MEL) * _SLANEY_LOG_STEP), mel * 200 / 3
    )
