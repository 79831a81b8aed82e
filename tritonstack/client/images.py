"""Which files are images, which are video clips and which audio: by extension, or by
their first bytes for files named otherwise (camera dumps, downloads without a suffix)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tritonstack.cli import natural_key
from tritonstack.media.audio_header import AUDIO_MAGIC
from tritonstack.media.video_header import has_video_signature

AUDIO_SUFFIXES = {".wav", ".wave", ".flac", ".ogg", ".oga", ".opus"}
CLIP_SUFFIXES = {".mp4", ".m4v", ".mov", ".webm", ".mkv"}
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".jp2", ".pnm", ".ppm"}

# Leading bytes of the formats DALI's decoder reads.
_SIGNATURES = (
    b"\xff\xd8\xff",  # JPEG
    b"\x89PNG\r\n\x1a\n",
    b"GIF87a",
    b"GIF89a",
    b"BM",
    b"II*\x00",  # TIFF, little endian
    b"MM\x00*",  # TIFF, big endian
    b"\x00\x00\x00\x0cjP  ",  # JPEG 2000
)


def has_image_signature(path: Path) -> bool:
    try:
        with open(path, "rb") as file:
            head = file.read(16)
    except OSError:
        return False
    return head.startswith(_SIGNATURES) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP")


def is_image_file(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES or has_image_signature(path)


def is_clip_file(path: Path) -> bool:
    if path.suffix.lower() in CLIP_SUFFIXES:
        return True
    if path.suffix.lower() in IMAGE_SUFFIXES:
        return False  # e.g. AVIF and HEIC photos also start like an MP4
    try:
        with open(path, "rb") as file:
            return has_video_signature(file.read(16))
    except OSError:
        return False


def is_audio_file(path: Path) -> bool:
    if path.suffix.lower() in AUDIO_SUFFIXES:
        return True
    if path.suffix.lower() in IMAGE_SUFFIXES | CLIP_SUFFIXES:
        return False
    try:
        with open(path, "rb") as file:
            head = file.read(12)
    except OSError:
        return False
    return head[:4] in AUDIO_MAGIC and (head[:4] != b"RIFF" or head[8:12] == b"WAVE")


def media_kind(path: Path) -> str:
    """ "audio", "clip" or "image" (a file of no known kind is sent as an image, and
    refused as one)."""
    if is_audio_file(path):
        return "audio"
    return "clip" if is_clip_file(path) else "image"


def image_files(paths: Iterable[Path], clips: bool = False, audio: bool = False) -> list[Path]:
    """Folders expanded recursively to their images (and clips and audio, when asked),
    in natural order (c1, c2, c10); files named explicitly are kept as they are (a
    broken one gets its own error)."""

    def wanted(path: Path) -> bool:
        return is_image_file(path) or (clips and is_clip_file(path)) or (audio and is_audio_file(path))

    files = []
    for path in paths:
        if path.is_dir():
            files += sorted((p for p in path.rglob("*") if p.is_file() and wanted(p)), key=natural_key)
        else:
            files.append(path)
    return files
