"""tritonstack.media.decodable against the decoder it speaks for: every input it refuses,
DALI's CPU image decoder (run here, in this process) refuses too, and every input
the decoder reads passes. The inputs: the bad-input suite's cases, every image
format Pillow writes, and cut or corrupted files."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from nvidia.dali import fn, pipeline_def, types
from PIL import Image

from tests.test_bad_input import CASES, chelsea, encode, jpeg
from tritonstack.media import decodable
from tritonstack.media.decodable import undecodable_reason
from tritonstack.samples.photos import bad_samples, photo_bytes


def corrupt_png_with_valid_crcs() -> bytes:
    """A PNG whose compressed pixels are zeroed and whose chunk CRCs are recomputed:
    every chunk checks out, the deflate stream does not. Only decoding can tell."""
    out = io.BytesIO()
    Image.new("RGB", (16, 16), (1, 2, 3)).save(out, format="PNG")
    png = out.getvalue()
    start = png.index(b"IDAT") - 4
    length = struct.unpack(">I", png[start : start + 4])[0]
    data = png[start + 8 : start + 10] + bytes(length - 2)  # the zlib header kept
    chunk = b"IDAT" + data
    return png[: start + 4] + chunk + struct.pack(">I", zlib.crc32(chunk)) + png[start + 12 + length :]


def cut(data: bytes, fraction: float) -> bytes:
    return data[: int(len(data) * fraction)]


MORE_CASES = {
    **{
        f"format_{name.lower()}": (lambda name=name: encode(chelsea(), name))
        for name in ("JPEG2000", "PPM", "TGA", "ICO", "PCX", "QOI", "SGI", "GIF")
    },
    "jpeg_without_eoi": lambda: jpeg()[:-2],
    "jpeg_cut_99pc": lambda: cut(jpeg(), 0.99),
    "jpeg_cut_then_eoi": lambda: cut(jpeg(), 0.5) + b"\xff\xd9",  # the decoder reads what is there
    "jpeg_trailing_bytes": lambda: jpeg() + b"\x00" * 64,
    "png_cut_half": lambda: cut(photo_bytes("coffee.png"), 0.5),
    "png_without_iend": lambda: photo_bytes("coffee.png")[: photo_bytes("coffee.png").rfind(b"IEND") - 4],
    "png_corrupt_valid_crcs": corrupt_png_with_valid_crcs,
    "jpeg_magic_then_garbage": lambda: b"\xff\xd8\xff" + b"garbage" * 20,
}
INPUTS = {name: make for name, (make, _) in CASES.items() if name != "decompression_bomb"}  # 10 GB to decode
INPUTS.update(MORE_CASES)
# What must be refused without decoding: the soak's bad inputs and every failure the
# decoder's input shows in its bytes. Left to the decoder: failures only decoding shows.
SCREENED = {
    "zero_length",
    "random_bytes",
    "text",
    "truncated_jpeg",
    "header_only_jpeg",
    "gif",
    "format_tga",
    "format_ico",
    "format_pcx",
    "format_qoi",
    "format_sgi",
    "format_gif",
    "jpeg_without_eoi",
    "jpeg_cut_99pc",
    "png_cut_half",
    "png_without_iend",
}


@pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1)
def decoder():
    return fn.decoders.image(fn.external_source(name="ENCODED", dtype=types.UINT8, ndim=1), device="cpu")


def dali_decodes(data: bytes) -> bool:
    pipeline = decoder()
    pipeline.build()
    pipeline.feed_input("ENCODED", [np.frombuffer(data, np.uint8)])
    try:
        pipeline.run()
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_refused_exactly_when_screened_and_never_what_the_decoder_reads(name):
    data = INPUTS[name]()
    reason = undecodable_reason(data)
    decodes = dali_decodes(data)
    if reason is not None:
        assert not decodes, f"{name}: refused ({reason}) but DALI decodes it"
    assert (reason is not None) == (name in SCREENED), (name, reason, decodes)


def test_the_soaks_bad_inputs_never_reach_the_pipeline():
    for sample in bad_samples():
        assert undecodable_reason(sample.data), sample.name


def test_reasons_name_what_is_wrong():
    assert undecodable_reason(b"") == "it is empty (0 bytes)"
    assert "GIF image" in undecodable_reason(encode(chelsea(), "GIF"))
    assert "truncated JPEG" in undecodable_reason(jpeg()[:-2])
    assert "PNG" in undecodable_reason(cut(photo_bytes("coffee.png"), 0.5))
    assert "JPEG, PNG" in undecodable_reason(b"text " * 10)


def jpeg_variants() -> dict[str, bytes]:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: the header's size is the stored one either way
    mpo = io.BytesIO()
    chelsea().save(mpo, format="MPO", save_all=True, append_images=[chelsea()])
    return {
        "plain": jpeg(),
        "exif_rotated": jpeg(exif=exif.tobytes()),
        "progressive": jpeg(progressive=True),
        "gray": encode(chelsea().convert("L"), "JPEG"),
        "cmyk": encode(chelsea().convert("CMYK"), "JPEG"),
        "mpo": mpo.getvalue(),
        **{name: INPUTS[name]() for name in INPUTS if "jpeg" in name},
    }


@pytest.mark.parametrize("name", sorted(jpeg_variants()))
def test_a_jpeg_header_read_by_nvimgcodec_gets_pillows_verdict_and_size(name, monkeypatch):
    data = jpeg_variants()[name]
    fast = decodable.inspect_encoded(data)
    monkeypatch.setattr(decodable, "nvimgcodec", None)  # what a client-only install reads
    assert fast == decodable.inspect_encoded(data), name
