#!/usr/bin/env python3
"""Classify image files and folders with a running Triton server.

    python clients/classify.py photo.jpg photos/ --url 127.0.0.1:8000 --top-k 5
    python clients/classify.py photos/ --protocol grpc --batch-size 8 --concurrency 4 --format jsonl
    python clients/classify.py photos/ --async --shm system --retries 8 --timeout 30

Folders are searched recursively for images (by extension, or by content for
files named otherwise). Results go to stdout, one per input file, in order; a
progress bar and a closing summary go to stderr. A broken or unreadable file
gets an error line and the run goes on.

Exit codes: 0 every file classified, 1 some file failed, 2 nothing could run
(no server, no image files, bad arguments).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import TextIO

from tritonstack.client.protocol import DEFAULT_URLS, PROTOCOLS, SHM_MODES
from tritonstack.contract import admin_headers, DEFAULT_MODEL
from tritonstack.client.images import image_files
from tritonstack.client.retry import RetryPolicy, ServerUnavailableError
from tritonstack.client.runner import classify_files, FileResult, Progress, RunSettings

FORMATS = ("table", "jsonl", "csv")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="image files or folders")
    parser.add_argument("--url", help="HOST:PORT (default 127.0.0.1:8000 for http, 127.0.0.1:8001 for grpc)")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="http")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--top-k", type=positive_int, default=5)
    parser.add_argument("--batch-size", type=positive_int, default=1, help="images per request")
    parser.add_argument("--concurrency", type=positive_int, default=1, help="requests in flight")
    parser.add_argument("--shm", choices=SHM_MODES, default="none", help="send and receive tensors in shared memory")
    parser.add_argument("--async", dest="use_async", action="store_true", help="asyncio client instead of threads")
    parser.add_argument("--format", choices=FORMATS, default="table")
    parser.add_argument("--timeout", type=float, default=None, metavar="S", help="per-request timeout in seconds")
    parser.add_argument("--admin-key", help="key of the server's restricted APIs, needed with --shm system "
                        "(default: $TRITONSTACK_ADMIN_KEY)")
    parser.add_argument("--retries", type=int, default=3, metavar="N",
                        help="retries when the server is unreachable or unavailable (backoff with jitter)")
    return parser.parse_args(argv)


class ResultWriter:
    """Formats results on stdout: one line (or CSV row) per file."""

    def __init__(self, fmt: str, top_k: int, out: TextIO | None = None):
        self.fmt = fmt
        self.out = out or sys.stdout
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
            self.out.write(f"{result.path}  error: {result.error}\n")
        else:
            self.out.write(f"{result.path}  " + ", ".join(f"{p.label} ({p.score:.3f})" for p in result.top) + "\n")
        self.out.flush()


def _as_dict(result: FileResult) -> dict:
    if result.error is not None:
        return {"path": str(result.path), "error": result.error}
    return {
        "path": str(result.path),
        "top": [{"label": p.label, "index": p.index, "score": p.score} for p in result.top],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    files = image_files(args.paths)
    if not files:
        print(f"no image files in {' '.join(map(str, args.paths))}", file=sys.stderr)
        return 2
    settings = RunSettings(
        url=args.url or DEFAULT_URLS[args.protocol],
        protocol=args.protocol,
        model=args.model,
        top_k=args.top_k,
        batch_size=args.batch_size,
        concurrency=args.concurrency,
        shm=args.shm,
        use_async=args.use_async,
        timeout_s=args.timeout,
        retry=RetryPolicy(retries=args.retries),
        headers=admin_headers(args.protocol, args.admin_key),
    )
    writer = ResultWriter(args.format, args.top_k)
    progress = Progress(len(files))
    try:
        for result in classify_files(files, settings):
            writer.write(result)
            progress.update(result)
    except ServerUnavailableError as error:  # raised before the first result
        print(error, file=sys.stderr)
        return 2
    progress.close()
    return 1 if progress.failed else 0


if __name__ == "__main__":
    sys.exit(main())
