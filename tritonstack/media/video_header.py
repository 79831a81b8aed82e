"""What an encoded clip declares, read from its container's header without decoding
it: the codec, the frame size and (MP4) the frame count.

Why it matters: DALI 2.4's CPU video decoder (`fn.decoders.video(device="cpu")`)
reads VP8, VP9 and MJPEG only; on anything else, or on bytes that are no video,
it fails with "Failed to create video decoder" (the codec is named only in the
server's log) and the pipeline must be rebuilt. The dali backend refuses those
clips first, naming what was wrong, and counts the frames a clip will be decoded
to against the decode budget (tritonstack.media.decode_budget), as it does an image's
pixels.

Containers: MP4/MOV (ISO BMFF: the first video track's sample entry and sample
count) and Matroska/WebM (the first video track's CodecID and pixel size; the frame
count is not in its header). Standard library only: the dali backend imports it in
the stub.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# What DALI's CPU decoder reads (its docstring: VP8, VP9, MJPEG); the GPU ("mixed")
# decoder reads H.264, H.265, AV1 and MPEG-4 too.
CPU_CODECS = frozenset({"VP8", "VP9", "MJPEG"})
GPU_CODECS = CPU_CODECS | {"H.264", "H.265", "AV1", "MPEG-4"}
_MP4_CODECS = {
    b"avc1": "H.264",
    b"avc3": "H.264",
    b"hvc1": "H.265",
    b"hev1": "H.265",
    b"av01": "AV1",
    b"mp4v": "MPEG-4",
    b"vp08": "VP8",
    b"vp09": "VP9",
    b"jpeg": "MJPEG",
    b"mjpa": "MJPEG",
    b"mjpb": "MJPEG",
}
_MKV_CODECS = {
    "V_VP8": "VP8",
    "V_VP9": "VP9",
    "V_MJPEG": "MJPEG",
    "V_MPEG4/ISO/AVC": "H.264",
    "V_MPEGH/ISO/HEVC": "H.265",
    "V_AV1": "AV1",
}
_MP4_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl"}
_EBML_MAGIC = b"\x1a\x45\xdf\xa3"
# Matroska element ids: Segment, Tracks, TrackEntry, Video (descended into); the rest read.
_MKV_CONTAINERS = {0x18538067, 0x1654AE6B, 0xAE, 0xE0}
_MKV_TRACK_TYPE, _MKV_CODEC_ID, _MKV_WIDTH, _MKV_HEIGHT = 0x83, 0x86, 0xB0, 0xBA
_MKV_VIDEO_TRACK = 1


@dataclass(frozen=True)
class ClipHeader:
    container: str  # "MP4" or "WebM/Matroska"
    codec: str  # "VP9", "H.264", ... or the container's own name for an unknown one
    width: int | None
    height: int | None
    frames: int | None  # None when the container does not say (WebM)


def has_video_signature(head: bytes) -> bool:
    """Whether the first bytes are those of an MP4/MOV or a Matroska/WebM file."""
    return head[4:8] == b"ftyp" or head[:4] == _EBML_MAGIC


def read_header(data: bytes) -> ClipHeader | None:
    """The clip's header, or None when the bytes are no MP4 or Matroska/WebM video."""
    if not has_video_signature(data):
        return None
    return _mp4(data) if data[4:8] == b"ftyp" else _matroska(data)


def unreadable_reason(data: bytes, codecs: frozenset[str] = CPU_CODECS) -> str | None:
    """Why a video decoder reading `codecs` would fail on these bytes, or None."""
    header = read_header(bytes(data))
    if header is None:
        return "it is not a video, or it is cut short (no MP4 or WebM/Matroska header with a video track)"
    if header.codec not in codecs:
        return (
            f"it is {header.codec} video in {header.container}: this model's video decoder reads "
            f"{', '.join(sorted(codecs))} (DALI's CPU decoder does not read {header.codec}; "
            "re-encode it, e.g. ffmpeg -c:v libvpx-vp9, or serve on a GPU)"
        )
    if header.frames == 0:
        return "it has no frames"
    return None


# --- MP4 (ISO base media file format) ---------------------------------------------------------


def _boxes(data: bytes, start: int, end: int):
    """(type, payload start, payload end) of each box in data[start:end]."""
    while start + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, start)
        header = 8
        if size == 1 and start + 16 <= end:
            size, header = struct.unpack_from(">Q", data, start + 8)[0], 16
        elif size == 0:
            size = end - start
        if size < header:
            return
        yield kind, start + header, min(start + size, end)
        start += size


def _mp4(data: bytes) -> ClipHeader | None:
    for track in _find_all(data, 0, len(data), b"trak"):
        fields = {kind: (begin, stop) for kind, begin, stop in _walk(data, *track)}
        hdlr, stsd = fields.get(b"hdlr"), fields.get(b"stsd")
        if not hdlr or data[hdlr[0] + 8 : hdlr[0] + 12] != b"vide" or not stsd:
            continue
        entry = stsd[0] + 8  # version/flags, entry count
        fourcc = data[entry + 4 : entry + 8]
        width, height = struct.unpack_from(">HH", data, entry + 32) if entry + 36 <= len(data) else (None, None)
        stsz = fields.get(b"stsz")
        frames = struct.unpack_from(">I", data, stsz[0] + 8)[0] if stsz and stsz[0] + 12 <= len(data) else None
        codec = _MP4_CODECS.get(fourcc, fourcc.decode("latin-1"))
        return ClipHeader("MP4", codec, width, height, frames)
    return None


def _find_all(data: bytes, start: int, end: int, wanted: bytes):
    for kind, begin, stop in _boxes(data, start, end):
        if kind == wanted:
            yield begin, stop
        elif kind in _MP4_CONTAINERS:
            yield from _find_all(data, begin, stop, wanted)


def _walk(data: bytes, start: int, end: int):
    for kind, begin, stop in _boxes(data, start, end):
        yield kind, begin, stop
        if kind in _MP4_CONTAINERS:
            yield from _walk(data, begin, stop)


# --- Matroska / WebM ----------------------------------------------------------------------


def _vint(data: bytes, position: int, keep_marker: bool) -> tuple[int, int]:
    first = data[position]
    length = next((n for n in range(8) if first & (0x80 >> n)), 8) + 1
    value = first if keep_marker else first & (0xFF >> length)
    for byte in data[position + 1 : position + length]:
        value = (value << 8) | byte
    return value, position + length


def _elements(data: bytes, start: int, end: int):
    """(id, payload start, payload end), descending into the track elements."""
    while start < end:
        element, size_at = _vint(data, start, keep_marker=True)
        size, position = _vint(data, size_at, keep_marker=False)
        unknown_size = size == (1 << (7 * (position - size_at))) - 1  # a live stream's Segment
        stop = end if unknown_size else min(position + size, end)
        yield element, position, stop
        if element in _MKV_CONTAINERS:
            yield from _elements(data, position, stop)
        start = stop


def _matroska(data: bytes) -> ClipHeader | None:
    tracks, current = [], None
    try:
        for element, begin, stop in _elements(data, 0, len(data)):
            if element == 0xAE:
                current = {}
                tracks.append(current)
            elif current is not None and element in (_MKV_TRACK_TYPE, _MKV_WIDTH, _MKV_HEIGHT):
                current[element] = int.from_bytes(data[begin:stop], "big")
            elif current is not None and element == _MKV_CODEC_ID:
                current[element] = data[begin:stop].decode("ascii", "replace")
    except IndexError:
        pass  # cut short: judge what was read
    video = next((track for track in tracks if track.get(_MKV_TRACK_TYPE) == _MKV_VIDEO_TRACK), None)
    if video is None:
        return None
    codec_id = video.get(_MKV_CODEC_ID, "")
    return ClipHeader(
        "WebM/Matroska", _MKV_CODECS.get(codec_id, codec_id), video.get(_MKV_WIDTH), video.get(_MKV_HEIGHT), None
    )
