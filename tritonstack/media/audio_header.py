"""What an encoded audio clip is and how long it lasts, read from its header without
decoding it: the dali backend refuses a clip DALI's CPU audio decoder
(`fn.decoders.audio`, libsndfile) is certain to fail on, or one longer than the model
takes, before the pipeline runs; clients check the same before they send.

Why before: a decoder failure invalidates the DALI pipeline, which the backend must
then build again, and a header that declares more samples than it holds makes the
decoder allocate for all of them (a WAV written to a pipe declares 4 GiB: std::bad_alloc).

Formats DALI 2.4 decodes on a CPU, checked here: WAV (PCM 8/16/24/32-bit, float),
FLAC, OGG with Vorbis or Opus. MP3 and AAC/M4A fail in its decoder and are refused.
Standard library only: the dali backend imports it in the stub.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

AUDIO_FORMATS_TEXT = "WAV, FLAC, OGG (Vorbis or Opus)"
# A WAV written where it cannot seek back (a pipe) leaves its sizes at their maximum.
_UNKNOWN_SIZE = 0xFFFFFFFF
_OGG_TAIL_BYTES = 65536 + 27 + 255  # the largest OGG page, header included
_OPUS_RATE = 48000  # Opus granule positions count 48 kHz samples whatever the input's rate


# The first four bytes of each container read here.
AUDIO_MAGIC = (b"RIFF", b"fLaC", b"OggS")


class AudioHeaderError(ValueError):
    """The clip is not one the decoder reads; the message says why."""


@dataclass(frozen=True)
class AudioHeader:
    format: str  # "WAV", "FLAC", "OGG Vorbis", "OGG Opus"
    sample_rate: int
    channels: int
    seconds: float | None  # None when the header does not say (a FLAC written as a stream)


def read_audio_header(encoded) -> AudioHeader:
    """The clip's format, rate, channels and length; AudioHeaderError when the decoder
    would refuse it or the header is cut."""
    data = bytes(encoded)
    if not data:
        raise AudioHeaderError("it is empty (0 bytes)")
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        header = _wav(data)
    elif data[:4] == b"fLaC":
        header = _flac(data)
    elif data[:4] == b"OggS":
        header = _ogg(data)
    else:
        raise AudioHeaderError(f"it is {_named(data)}; the decoder reads {AUDIO_FORMATS_TEXT}")
    if header.sample_rate <= 0 or header.channels <= 0:
        raise AudioHeaderError(
            f"its {header.format} header declares {header.sample_rate} Hz, {header.channels} channels"
        )
    if header.seconds == 0:
        raise AudioHeaderError(f"it is a clip with no samples (0 s, {header.format})")
    return header


def _wav(data: bytes) -> AudioHeader:
    position, fmt = 12, None
    while position + 8 <= len(data):
        chunk, size = data[position : position + 4], struct.unpack_from("<I", data, position + 4)[0]
        body = position + 8
        if chunk == b"fmt ":
            if size < 16 or body + 16 > len(data):
                break
            _, channels, rate, _, block_align = struct.unpack_from("<HHIIH", data, body)
            fmt = (channels, rate, block_align)
        elif chunk == b"data":
            if fmt is None:
                break
            channels, rate, block_align = fmt
            if size == _UNKNOWN_SIZE:
                raise AudioHeaderError(
                    "it is a WAV whose header does not give its length (4 GiB, as written to a pipe): "
                    "write it to a file, or convert it to FLAC"
                )
            present = min(size, len(data) - body)  # a cut file decodes what it holds
            return AudioHeader("WAV", rate, channels, present // max(block_align, 1) / rate if rate else None)
        position = body + size + (size & 1)  # chunks are padded to an even size
    raise AudioHeaderError("it is a WAV cut before its format and data chunks")


def _flac(data: bytes) -> AudioHeader:
    # fLaC, then the STREAMINFO block: 4 bytes of block header, 10 of sizes, then
    # 20 bits of rate, 3 of channels - 1, 5 of bits - 1, 36 of total samples (0: unknown).
    if len(data) < 8 + 18:
        raise AudioHeaderError("it is a FLAC cut before its STREAMINFO block")
    packed = int.from_bytes(data[8 + 10 : 8 + 18], "big")
    rate, channels, total = packed >> 44, ((packed >> 41) & 0x7) + 1, packed & ((1 << 36) - 1)
    if not total and _flac_frames_start(data) >= len(data):
        total = 0  # no frames after the metadata: an empty clip
    elif not total:
        return AudioHeader("FLAC", rate, channels, None)
    return AudioHeader("FLAC", rate, channels, total / rate if rate else None)


def _flac_frames_start(data: bytes) -> int:
    """Where the audio frames begin: after the last metadata block (its header's top bit)."""
    position = 4
    while position + 4 <= len(data):
        last, size = data[position] & 0x80, int.from_bytes(data[position + 1 : position + 4], "big")
        position += 4 + size
        if last:
            return position
    return len(data)


def _ogg(data: bytes) -> AudioHeader:
    if len(data) < 28:
        raise AudioHeaderError("it is an OGG cut before its first page")
    segments = data[26]
    packet = data[27 + segments : 27 + segments + 19]
    if packet[:7] == b"\x01vorbis" and len(packet) >= 16:
        name, channels, rate, skip = "OGG Vorbis", packet[11], struct.unpack_from("<I", packet, 12)[0], 0
        granule_rate = rate
    elif packet[:8] == b"OpusHead" and len(packet) >= 16:
        name, channels, skip, rate = "OGG Opus", packet[9], struct.unpack_from("<H", packet, 10)[0], _OPUS_RATE
        granule_rate = _OPUS_RATE
    else:
        raise AudioHeaderError(
            f"it is an OGG stream of neither Vorbis nor Opus; the decoder reads {AUDIO_FORMATS_TEXT}"
        )
    last_page = data.rfind(b"OggS", max(0, len(data) - _OGG_TAIL_BYTES))
    if last_page < 0 or last_page + 14 > len(data):
        raise AudioHeaderError(f"it is an {name} stream cut inside its last page")
    granule = struct.unpack_from("<q", data, last_page + 6)[0]
    return AudioHeader(name, rate, channels, max(granule - skip, 0) / granule_rate if granule >= 0 else None)


def _named(data: bytes) -> str:
    """What a clip the decoder does not read is, for the refusal's message."""
    if data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "an MP3"
    if data[4:8] == b"ftyp":
        return "an MP4/M4A (AAC) file"
    if data[:4] == b"FORM":
        return "an AIFF"
    return "not audio in a format the decoder reads"
