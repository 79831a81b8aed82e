"""tritonstack.media.video_header on real clips (made by the imageio-ffmpeg wheel's ffmpeg):
what the dali backend reads from a clip's container before DALI decodes it."""

from __future__ import annotations

import subprocess

import imageio_ffmpeg
import pytest

from tests import clips
from tritonstack.media.video_header import CPU_CODECS, GPU_CODECS, ClipHeader, read_header, unreadable_reason


@pytest.fixture(scope="module")
def vp9_mp4(tmp_path_factory):
    return clips.panning_clip("chelsea.png", tmp_path_factory.mktemp("header") / "pan.mp4", seconds=1, fps=10)


def remux(data: bytes, tmp_path, suffix: str, codec: list[str]) -> bytes:
    source, out = tmp_path / "in.mp4", tmp_path / f"out{suffix}"
    source.write_bytes(data)
    subprocess.run(
        [imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-y", "-i", str(source), *codec, str(out)],
        check=True,
        timeout=120,
    )
    return out.read_bytes()


def test_mp4_header_gives_codec_size_and_frames(vp9_mp4):
    assert read_header(vp9_mp4) == ClipHeader("MP4", "VP9", 240, 240, 10)
    assert unreadable_reason(vp9_mp4) is None


def test_webm_and_matroska_headers_give_codec_and_size(vp9_mp4, tmp_path):
    webm = remux(vp9_mp4, tmp_path, ".webm", ["-c", "copy"])
    assert read_header(webm) == ClipHeader("WebM/Matroska", "VP9", 240, 240, None)
    mkv = remux(vp9_mp4, tmp_path, ".mkv", ["-c:v", "libx264"])
    assert read_header(mkv).codec == "H.264"
    assert "H.264" in unreadable_reason(mkv, CPU_CODECS) and unreadable_reason(mkv, GPU_CODECS) is None


@pytest.mark.parametrize(
    "data, words",
    [
        (b"", "not a video"),
        (b"\x89PNG\r\n\x1a\n" + bytes(64), "not a video"),
    ],
)
def test_what_is_no_video_says_so(data, words):
    assert words in unreadable_reason(data)


def test_a_clip_cut_before_its_header_or_without_frames_is_named(vp9_mp4):
    assert "cut short" in unreadable_reason(vp9_mp4[: len(vp9_mp4) // 2])
    assert unreadable_reason(clips.without_frames(vp9_mp4)) == "it has no frames"
