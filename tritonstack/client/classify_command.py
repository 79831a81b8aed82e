"""Classify image files and folders with a running Triton server.

    tritonstack classify photo.jpg my_photos/ --url 127.0.0.1:8000 --top-k 5
    tritonstack classify my_photos/ --url grpc://127.0.0.1:8001 --batch-size 8 --concurrency 4 --format jsonl
    tritonstack classify my_photos/ --async --shm system --retries 8 --timeout 30

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
from pathlib import Path
from typing import TextIO

from tritonstack import cli
from tritonstack.address import endpoint
from tritonstack.client.images import image_files
from tritonstack.client.options import add_server_options
from tritonstack.client.preflight import check_model
from tritonstack.client.protocol import DEFAULT_URLS, SHM_MODES
from tritonstack.client.retry import RetryPolicy
from tritonstack.client.runner import FileResult, Progress, RunSettings, classify_files
from tritonstack.contract import admin_headers

FORMATS = ("table", "jsonl", "csv")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.parser(__doc__)
    parser.add_argument("paths", nargs="+", type=Path, help="image files or folders")
    add_server_options(parser)
    parser.add_argument("--top-k", type=cli.positive_int, default=5, help="classes shown per image")
    parser.add_argument("--batch-size", type=cli.positive_int, default=1, help="images per request")
    parser.add_argument("--concurrency", type=cli.positive_int, default=1, help="requests in flight")
    parser.add_argument("--shm", choices=SHM_MODES, default="none", help="send and receive tensors in shared memory")
    parser.add_argument("--async", dest="use_async", action="store_true", help="asyncio client instead of threads")
    parser.add_argument("--format", choices=FORMATS, default="table", help="table: aligned text; jsonl and csv: "
                        "one record per file")
    return parser.parse_intermixed_args(argv)


class ResultWriter:
    """Formats results on stdout: one line (or CSV row) per file."""

    def __init__(self, fmt: str, top_k: int, out: TextIO | None = None, path_width: int = 0):
        self.fmt = fmt
        self.out = out or sys.stdout
        self.path_width = path_width  # table: the paths' column, as wide as the longest
        if fmt == "csv":
            self._csv = csv.writer(self.out)
            ranks = [f"{field}_{rank}" for rank in range(1, top_k + 1) for field in ("label", "index", "score")]
            self._csv.writerow(["path", "error", *ranks])

    def write(self, result: FileResult) -> None:
        if self.fmt == "jsonl":
            self.out.write(json.dumps(_as_dict(result)) + "\n")
        elif self.fmt == "csv":
            cells = [str(result.path), result.error or ""]
            for p in result.top or []:
                cells += [p.label, p.index, f"{p.score:.6f}"]
            self._csv.writerow(cells)
        elif result.error is not None:
            self.out.write(f"{str(result.path):<{self.path_width}}  error: {result.error}\n")
        else:
            self.out.write(f"{str(result.path):<{self.path_width}}  "
                           + ", ".join(f"{p.label} ({p.score:.3f})" for p in result.top) + "\n")
        self.out.flush()


def _as_dict(result: FileResult) -> dict:
    if result.error is not None:
        return {"path": str(result.path), "error": result.error}
    return {
        "path": str(result.path),
        "top": [{"label": p.label, "index": p.index, "score": p.score} for p in result.top],
    }


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(classify, argv)


def classify(argv: list[str] | None) -> int:
    args = parse_args(argv)
    url, protocol = endpoint(args.url, args.protocol, DEFAULT_URLS)
    files = image_files(cli.existing_paths(args.paths))
    if not files:
        raise cli.UsageError(f"no image files in {' '.join(map(str, args.paths))}")
    settings = RunSettings(
        url=url,
        protocol=protocol,
        model=args.model,
        top_k=args.top_k,
        batch_size=args.batch_size,
        concurrency=args.concurrency,
        shm=args.shm,
        use_async=args.use_async,
        timeout_s=args.timeout,
        retry=RetryPolicy(retries=args.retries),
        headers=admin_headers(protocol, args.admin_key),
    )
    check_model(url, protocol, args.model, settings.headers, settings.retry)
    writer = ResultWriter(args.format, args.top_k, path_width=max(len(str(path)) for path in files))
    progress = Progress(len(files))
    for result in classify_files(files, settings):
        with progress.above():
            writer.write(result)
        progress.update(result)
    progress.close()
    return 1 if progress.failed else 0


if __name__ == "__main__":
    sys.exit(main())
