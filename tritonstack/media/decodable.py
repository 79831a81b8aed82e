"""Which encoded images DALI's CPU image decoder will refuse, told from their bytes
without decoding them.

Why it matters: a decoder failure invalidates the DALI pipeline, and the backend
must build a new one; DALI 2.4's image decoder keeps a little memory of every
pipeline destroyed after it has decoded (docs/memory.md#decode-budget), so a client
sending garbage would make the stub grow for as long as it sends. The dali backend
therefore refuses, before the pipeline runs, what DALI 2.4's
`fn.decoders.image(device="cpu")` is certain to refuse: bytes of no image format,
image formats it does not read, a JPEG cut before its end-of-image marker, a PNG
whose chunks are cut or fail their CRC. Anything else, including images Pillow
cannot parse but whose header names a format the decoder reads, is left to the
decoder. The check costs a small fraction of a decode
(docs/decisions.md#undecodable-inputs-are-refused-before-the-pipeline).

A JPEG's header is read with nvImageCodec, the library DALI's image decoder parses it
with (it comes with DALI), at about a tenth of Pillow's cost (2.7 against 22 us an image
in process); anything else, and any JPEG nvImageCodec cannot parse, goes through Pillow.
Without nvImageCodec (a client-only install) Pillow reads every header.
"""

from __future__ import annotations

import io

from PIL import Image, UnidentifiedImageError

try:
    from nvidia import nvimgcodec
except ImportError:  # no DALI here
    nvimgcodec = None

# Pillow's names of the formats DALI's CPU decoder reads (JPEG, PNG, BMP, TIFF,
# WebP, JPEG 2000 and PNM decode; GIF, TGA, ICO, PCX, QOI, DDS and SGI fail).
# MPO is Pillow's name for a camera's multi-picture JPEG.
DECODER_FORMATS = ("JPEG", "MPO", "PNG", "BMP", "TIFF", "WEBP", "JPEG2000", "PPM")
DECODER_FORMATS_TEXT = "JPEG, PNG, BMP, TIFF, WebP, JPEG 2000, PNM"
_JPEG_SOI, _JPEG_SOS, _JPEG_EOI = b"\xff\xd8", b"\xff\xda", b"\xff\xd9"  # start of image, of scan; end
TRUNCATED_JPEG = "it is a truncated JPEG (no scan, or no end-of-image marker after its last scan)"
# Enough of a file's start for every Pillow plugin's magic-number check.
_PREFIX_BYTES = 16


def undecodable_reason(encoded) -> str | None:
    """Why the image decoder would fail on these bytes, or None when it may not."""
    return inspect_encoded(encoded)[0]


def inspect_encoded(encoded) -> tuple[str | None, tuple[int, int] | None]:
    """Why the decoder would fail on these bytes (None: it may not), and the (width,
    height) their header declares (None: not an image Pillow knows). One header
    parse answers both, the decode budget's question and this module's."""
    data = bytes(encoded)
    if not data:
        return "it is empty (0 bytes)", None
    jpeg = _jpeg_header(data)
    if jpeg is not None:
        return jpeg
    try:
        image = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        if _claimed_format(data[:_PREFIX_BYTES]) is not None:
            return None, None  # a readable format's magic number: the decoder judges it
        return f"it is not an image in a format the decoder reads ({DECODER_FORMATS_TEXT})", None
    with image:
        return _format_reason(image, data), image.size


def _jpeg_header(data: bytes) -> tuple[str | None, tuple[int, int]] | None:
    """A JPEG's verdict and (width, height) from nvImageCodec's header parse; None where
    it is not a JPEG nvImageCodec parses (Pillow then reads it)."""
    if nvimgcodec is None or not data.startswith(_JPEG_SOI):
        return None
    try:  # the header is parsed when it is first asked about
        stream = nvimgcodec.CodeStream(data)
        codec, size = stream.codec_name, (stream.width, stream.height)
    except RuntimeError:  # "Failed to get image info"
        return None
    if codec != "jpeg":
        return None
    return (None if _jpeg_ends(data) else TRUNCATED_JPEG), size


def _format_reason(image: Image.Image, data: bytes) -> str | None:
    if image.format not in DECODER_FORMATS:
        return f"it is a {image.format} image; the decoder reads {DECODER_FORMATS_TEXT}"
    if image.format in ("JPEG", "MPO") and not _jpeg_ends(data):
        return TRUNCATED_JPEG
    if image.format == "PNG":
        try:
            image.verify()  # every chunk present and its CRC right; nothing is decompressed
        except Exception as error:  # Pillow raises OSError, SyntaxError or struct.error
            return f"it is a truncated or corrupt PNG ({error})"
    return None


def _jpeg_ends(data: bytes) -> bool:
    """A scan, and the end-of-image marker after the last one. Inside a scan 0xFF is
    always followed by 0x00 or a restart marker, so neither marker occurs there: the last
    end-of-image marker (near the file's end) with a scan before it and none after."""
    end = data.rfind(_JPEG_EOI)
    return end > 0 and data.find(_JPEG_SOS, 0, end) >= 0 and data.find(_JPEG_SOS, end) < 0


def _claimed_format(prefix: bytes) -> str | None:
    """The decoder-readable format whose magic number the bytes start with."""
    Image.init()
    for name in DECODER_FORMATS:
        accept = Image.OPEN.get(name, (None, None))[1]
        if accept is not None and accept(prefix):
            return name
    return None
