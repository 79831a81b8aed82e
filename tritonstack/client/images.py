"""Which files are images: by extension, or by their first bytes for files named
otherwise (camera dumps, downloads without a suffix)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tritonstack.cli import natural_key

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


def image_files(paths: Iterable[Path]) -> list[Path]:
    """Folders expanded recursively to their images, in natural order (c1, c2,
    c10); files named explicitly are kept as they are (a broken one gets its own
    error)."""
    files = []
    for path in paths:
        if path.is_dir():
            files += sorted((p for p in path.rglob("*") if p.is_file() and is_image_file(p)), key=natural_key)
        else:
            files.append(path)
    return files
