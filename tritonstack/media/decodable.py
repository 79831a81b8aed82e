"""Which encoded images DALI's CPU image decoder will refuse, told from their bytes
without decoding them.

Why it matters: a decoder failure invalidates the DALI pipeline, and the backend
must build a new one; DALI 2.4's image decoder keeps about 2.3 KB of every pipeline
destroyed after it has decoded (measured in docs/memory.md: 300 rebuilds, +0.68 MiB
of live malloc, with no Triton involved). A client sending garbage would make the
stub grow for as long as it sends. The dali backend therefore refuses, before the
pipeline runs, what the decoder is certain to refuse (measured with
`fn.decoders.image(device="cpu")`, DALI 2.4): bytes of no image format, image
formats it does not read, a JPEG cut before its end-of-image marker, a PNG whose
chunks are cut or fail their CRC. Anything else, including images Pillow cannot
parse but whose header names a format the decoder reads, is left to the decoder.

Its price, per image on the request path (measured on the project's photos): 70 us for
a 110 KB JPEG, 280-290 us for a 240-470 KB PNG (`verify()` reads every chunk and its
CRC), against ~6 ms of CPU for DALI to decode and preprocess one image; the header
read that the decode budget also makes costs 25-40 us of it.

Standard library and Pillow only: the dali backend imports it in the stub.
"""

from __future__ import annotations

import io

from PIL import Image, UnidentifiedImageError

# Pillow's names of the formats DALI's CPU decoder reads (JPEG, PNG, BMP, TIFF,
# WebP, JPEG 2000 and PNM decode; GIF, TGA, ICO, PCX, QOI, DDS and SGI fail).
# MPO is Pillow's name for a camera's multi-picture JPEG.
DECODER_FORMATS = ("JPEG", "MPO", "PNG", "BMP", "TIFF", "WEBP", "JPEG2000", "PPM")
DECODER_FORMATS_TEXT = "JPEG, PNG, BMP, TIFF, WebP, JPEG 2000, PNM"
_JPEG_SOS, _JPEG_EOI = b"\xff\xda", b"\xff\xd9"  # start of scan, end of image
# Enough of a file's start for every Pillow plugin's magic-number check.
_PREFIX_BYTES = 16


def undecodable_reason(encoded) -> str | None:
    """Why the image decoder would fail on these bytes, or None when it may not."""
    data = bytes(encoded)
    if not data:
        return "it is empty (0 bytes)"
    try:
        image = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        if _claimed_format(data[:_PREFIX_BYTES]) is not None:
            return None  # a readable format's magic number: the decoder judges it
        return f"it is not an image in a format the decoder reads ({DECODER_FORMATS_TEXT})"
    with image:
        if image.format not in DECODER_FORMATS:
            return f"it is a {image.format} image; the decoder reads {DECODER_FORMATS_TEXT}"
        if image.format in ("JPEG", "MPO") and not _jpeg_ends(data):
            return "it is a truncated JPEG (no scan, or no end-of-image marker after its last scan)"
        if image.format == "PNG":
            try:
                image.verify()  # every chunk present and its CRC right; nothing is decompressed
            except Exception as error:  # Pillow raises OSError, SyntaxError or struct.error
                return f"it is a truncated or corrupt PNG ({error})"
    return None


def _jpeg_ends(data: bytes) -> bool:
    """A scan, and the end-of-image marker after the last one. Inside a scan 0xFF is
    always followed by 0x00 or a restart marker, so neither marker occurs there."""
    last_scan = data.rfind(_JPEG_SOS)
    return last_scan >= 0 and data.rfind(_JPEG_EOI) > last_scan


def _claimed_format(prefix: bytes) -> str | None:
    """The decoder-readable format whose magic number the bytes start with."""
    Image.init()
    for name in DECODER_FORMATS:
        accept = Image.OPEN.get(name, (None, None))[1]
        if accept is not None and accept(prefix):
            return name
    return None
