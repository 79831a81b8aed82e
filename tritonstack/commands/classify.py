"""Classify image files, video clips, audio and folders with a running Triton server.

    tritonstack classify photo.jpg my_photos/ --url 127.0.0.1:8000 --top-k 5
    tritonstack classify my_photos/ --url grpc://127.0.0.1:8001 --batch-size 8 --concurrency 4 --format jsonl
    tritonstack classify my_photos/ --async --shm system --retries 8 --timeout 30
    tritonstack classify clip.mp4 --model ensemble_video_efficientnet_lite0 --format jsonl --per-frame
    tritonstack classify street.jpg --boxes boxes.json --format csv
    tritonstack classify speech.wav talk.flac --format jsonl

Clips (.mp4, .webm, .mkv, .mov, or by content) go to the video model, photos to
the image model: --model names either kind (a video model's name starts with
ensemble_video_), --video-model the one for clips. A clip's line ranks the mean
of its frames' probabilities; --per-frame adds a line per frame.

Audio (.wav, .flac, .ogg, .opus, or by content) goes to the audio model
(--audio-model, default ensemble_audio_silero_vad): its line holds the clip's speech
segments, start and end in seconds with their mean speech probability (jsonl:
"segments": [{"start_s", "end_s", "probability"}]; csv: a row per segment); with
--per-frame, jsonl adds each 32 ms frame's speech probability.

--boxes BOXES.json (a JSON list of [x0, y0, x1, y1] in the image's pixels, after EXIF
orientation) classifies each box of one image with a regions model (default:
ensemble_regions_efficientnet_lite0 unless --model names another), the image sent
once: one line per box, in order.

--url takes host:port, http://host:port or grpc://host:port (the scheme sets the
protocol). Folders are searched recursively for images (by extension, or by
content for files named otherwise), in natural order (c1, c2, c10). Results go to
stdout, one per input file, in order; on a terminal a progress bar and, always,
a closing summary go to stderr. A broken or unreadable file gets an error line
and the run goes on.

Exit codes: 0 every file classified, 1 some file failed, 2 nothing could run
(no server, wrong port or protocol, unknown model, no image files, bad options).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TextIO

from tritonstack import cli
from tritonstack.client.classifier import ClassifierClient
from tritonstack.client.images import image_files, media_kind
from tritonstack.client.options import ServerOptions
from tritonstack.client.preflight import check_model
from tritonstack.client.protocol import Prediction
from tritonstack.client.retry import describe_error
from tritonstack.client.runner import FileResult, Progress, RunSettings, classify_files
from tritonstack.contract import (
    DEFAULT_MODEL,
    DEFAULT_REGIONS_MODEL,
    is_audio_model,
    is_video_model,
)

FORMATS = ("table", "jsonl", "csv")


@dataclass(frozen=True)
class ClassifyOptions(ServerOptions):
    """What to classify and how to show it; how to ask the server is RunSettings'."""

    paths: list[Path] = cli.option(
        None, "paths", nargs="+", type=Path, help="image files, video clips, audio files or folders"
    )
    boxes: Path | None = cli.option(
        None,
        "--boxes",
        type=Path,
        metavar="BOXES.json",
        help=f"a JSON list of [x0, y0, x1, y1]: each box of the one image given, a line each, with a regions "
        f"model (default: {DEFAULT_REGIONS_MODEL})",
    )
    format: str = cli.option(
        "table", "--format", choices=FORMATS, help="table: aligned text; jsonl and csv: one record per file"
    )


def parser() -> argparse.ArgumentParser:
    parser = cli.parser(__doc__, intermixed=True)
    cli.add_options(parser, ClassifyOptions)
    cli.add_options(parser, RunSettings)
    return parser


class ResultWriter:
    """Formats results on stdout: one line (or CSV row) per file."""

    def __init__(
        self,
        fmt: str,
        top_k: int,
        out: TextIO | None = None,
        path_width: int = 0,
        per_frame: bool = False,
        boxes: bool = False,
        audio: bool = False,
    ):
        self.fmt = fmt
        self.per_frame = per_frame
        self.out = out or sys.stdout
        self.path_width = path_width  # table: the paths' column, as wide as the longest
        if fmt == "csv":
            self._csv = csv.writer(self.out)
            ranks = [f"{field}_{rank}" for rank in range(1, top_k + 1) for field in ("label", "index", "score")]
            part = ["frame"] if per_frame else ["box", "x0", "y0", "x1", "y1"] if boxes else []
            # Audio: a row per speech segment, label "speech", index the segment's, score its probability.
            self._header = ["path", *part, "error", *ranks, *(["start_s", "end_s"] if audio else [])]
            self._csv.writerow(self._header)

    def write_box(self, path: Path, index: int, box: list[float], top: list[Prediction]) -> None:
        """One box of an image: its index in the boxes given, its corners and its ranking."""
        if self.fmt == "jsonl":
            record = {"path": str(path), "box": index, "region": box}
            self.out.write(json.dumps({**record, **_as_dict(path, None, top, None, None)}) + "\n")
        elif self.fmt == "csv":
            cells = [str(path), index, *box, ""]
            for p in top:
                cells += [p.label, p.index, f"{p.score:.6f}"]
            self._csv.writerow(cells)
        else:
            shown = f"{path} [box {index}]"
            ranking = ", ".join(f"{p.label} ({p.score:.3f})" for p in top)
            self.out.write(f"{shown:<{self.path_width}}  {ranking}\n")
        self.out.flush()

    def write(self, result: FileResult) -> None:
        if result.segments is not None:
            self._write_speech(result)
            self.out.flush()
            return
        self._write_line(result.path, result.error, result.top, frames=len(result.frames or []) or None)
        if self.per_frame:
            for frame, top in enumerate(result.frames or []):
                self._write_line(result.path, None, top, frame=frame)
        self.out.flush()

    def _write_line(
        self,
        path: Path,
        error: str | None,
        top: list[Prediction] | None,
        frame: int | None = None,
        frames: int | None = None,
    ) -> None:
        if self.fmt == "jsonl":
            self.out.write(json.dumps(_as_dict(path, error, top, frame, frames)) + "\n")
        elif self.fmt == "csv":
            cells = [str(path), *([] if not self.per_frame else ["" if frame is None else frame]), error or ""]
            for p in top or []:
                cells += [p.label, p.index, f"{p.score:.6f}"]
            self._csv.writerow(cells)
        else:
            shown = str(path) if frame is None else f"{path} [frame {frame}]"
            answer = f"error: {error}" if error is not None else ", ".join(f"{p.label} ({p.score:.3f})" for p in top)
            self.out.write(f"{shown:<{self.path_width}}  {answer}\n")

    def _write_speech(self, result: FileResult) -> None:
        segments = result.segments
        if self.fmt == "jsonl":
            record = {"path": str(result.path), "segments": [asdict(segment) for segment in segments]}
            if result.frame_probabilities is not None:
                record["frame_probabilities"] = result.frame_probabilities
            self.out.write(json.dumps(record) + "\n")
        elif self.fmt == "csv":
            frame = [""] if self.per_frame else []
            for index, segment in enumerate(segments):
                cells = [str(result.path), *frame, "", "speech", index, f"{segment.probability:.6f}"]
                padding = [""] * (len(self._header) - len(cells) - 2)
                self._csv.writerow([*cells, *padding, f"{segment.start_s:.3f}", f"{segment.end_s:.3f}"])
            if not segments:
                self._csv.writerow([str(result.path), *frame, ""])
        else:
            spans = ", ".join(f"{s.start_s:.2f}-{s.end_s:.2f} s ({s.probability:.2f})" for s in segments)
            self.out.write(f"{str(result.path):<{self.path_width}}  {'speech ' + spans if spans else 'no speech'}\n")


def _as_dict(
    path: Path, error: str | None, top: list[Prediction] | None, frame: int | None, frames: int | None
) -> dict:
    record = {"path": str(path)}
    if frame is not None:
        record["frame"] = frame
    if error is not None:
        return {**record, "error": error}
    record["top"] = [{"label": p.label, "index": p.index, "score": p.score} for p in top]
    if frames is not None:  # a clip's line: how many frames its ranking averages
        record["frames"] = frames
    return record


def run(args: argparse.Namespace) -> int:
    options = cli.from_args(ClassifyOptions, args)
    settings = cli.from_args(RunSettings, args, **options.run_fields())
    if options.boxes is not None:
        return classify_boxes(options, settings)
    files = image_files(cli.existing_paths(options.paths), clips=True, audio=True)
    if not files:
        raise cli.UsageError(f"no image, clip or audio files in {' '.join(map(str, options.paths))}")
    settings = media_models(settings)
    for model in settings.models_for(files):
        check_model(settings.url, settings.protocol, model, settings.headers, settings.retry)
    frame_width = len(" [frame 99]") if settings.frame_probabilities else 0
    writer = ResultWriter(
        options.format,
        settings.top_k,
        path_width=max(len(str(path)) for path in files) + frame_width,
        per_frame=settings.frame_probabilities,
        audio=any(media_kind(path) == "audio" for path in files),
    )
    progress = Progress(len(files))
    for result in classify_files(files, settings):
        with progress.above():
            writer.write(result)
        progress.update(result)
    progress.close()
    return 1 if progress.failed else 0


def media_models(settings: RunSettings) -> RunSettings:
    """--model naming a video (audio) model: clips (audio) go to it, photos to the default model."""
    if is_video_model(settings.model):
        return replace(settings, model=DEFAULT_MODEL, video_model=settings.model)
    if is_audio_model(settings.model):
        return replace(settings, model=DEFAULT_MODEL, audio_model=settings.model)
    return settings


def classify_boxes(options: ClassifyOptions, settings: RunSettings) -> int:
    """One image and its boxes in one request: a line per box, in order, or one error line."""
    (image_path, *others) = cli.existing_paths(options.paths)
    if others or not image_path.is_file():
        raise cli.UsageError("--boxes takes one image file, the one its boxes are drawn on")
    boxes = read_boxes(options.boxes)
    model = DEFAULT_REGIONS_MODEL if settings.model == DEFAULT_MODEL else settings.model
    check_model(settings.url, settings.protocol, model, settings.headers, settings.retry, boxes=True)
    width = len(str(image_path)) + len(" [box 999]")
    writer = ResultWriter(options.format, settings.top_k, path_width=width, boxes=True)
    client_options = {"timeout_s": settings.timeout_s, "retry": settings.retry, "headers": settings.headers}
    try:
        with ClassifierClient(settings.url, settings.protocol, model, **client_options) as client:
            answer = client.classify_regions(image_path.read_bytes(), boxes, top_k=settings.top_k)
    except Exception as error:  # the image's one request failed: its error line, as for a file that fails
        writer.write(FileResult(image_path, error=describe_error(error, settings.timeout_s)))
        return 1
    for index, (box, top) in enumerate(zip(boxes, answer)):
        writer.write_box(image_path, index, box, top)
    return 0


def read_boxes(path: Path) -> list[list[float]]:
    """A JSON list of [x0, y0, x1, y1]; refused in one line otherwise."""
    try:
        boxes = json.loads(cli.existing_paths([path])[0].read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise cli.UsageError(f"{path}: not JSON ({error})") from error
    if not isinstance(boxes, list) or not all(
        isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box) for box in boxes
    ):
        raise cli.UsageError(f"{path}: need a JSON list of [x0, y0, x1, y1] boxes, numbers in the image's pixels")
    return [[float(value) for value in box] for box in boxes]


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
