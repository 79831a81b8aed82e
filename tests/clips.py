"""Short video clips made from the project's real photos with the ffmpeg that the
imageio-ffmpeg wheel ships (libvpx-vp9 and libx264 inside): a clip panning over a
photo, in VP9 (what DALI's CPU decoder reads) or H.264 (what it does not)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import imageio_ffmpeg

from tritonstack.samples.photos import photo_path

CODECS = {"vp9": ["-c:v", "libvpx-vp9", "-b:v", "300k"], "h264": ["-c:v", "libx264"]}


def panning_clip(photo: str, out: Path, codec: str = "vp9", seconds: float = 2.0, fps: int = 12) -> bytes:
    """A `seconds` clip of a 300x300 window moving right over `photo`, 240x240."""
    command = [
        imageio_ffmpeg.get_ffmpeg_exe(),
        "-v",
        "error",
        "-y",
        "-loop",
        "1",
        "-i",
        str(photo_path(photo)),
        "-t",
        str(seconds),
        "-r",
        str(fps),
        "-vf",
        "crop=300:300:x='t*40':y=0,scale=240:240",
        *CODECS[codec],
        "-pix_fmt",
        "yuv420p",
        str(out),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return out.read_bytes()


def without_frames(mp4: bytes) -> bytes:
    """The same MP4 with its video track's sample count set to 0."""
    stsz = mp4.index(b"stsz")
    count_at = stsz + 4 + 8  # after the box type: version/flags, sample_size, sample_count
    return mp4[:count_at] + (0).to_bytes(4, "big") + mp4[count_at + 4 :]
