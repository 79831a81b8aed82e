#!/usr/bin/env python3
"""Classify images with a running Triton server.

    python clients/classify.py photo.jpg photos/ --url 127.0.0.1:8000 --top-k 5
    python clients/classify.py photo.jpg --protocol grpc --url 127.0.0.1:8001
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tritonstack.client import DEFAULT_MODEL, PROTOCOLS, ClassifierClient

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp"}


def image_files(paths: list[Path]) -> list[Path]:
    files = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        else:
            files.append(path)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="image files or folders")
    parser.add_argument("--url", help="HOST:PORT (default 127.0.0.1:8000 for http, :8001 for grpc)")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="http")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args(argv)
    url = args.url or ("127.0.0.1:8000" if args.protocol == "http" else "127.0.0.1:8001")

    failures = 0
    with ClassifierClient(url, args.protocol, args.model) as client:
        for path in image_files(args.paths):
            try:
                top = client.classify([path.read_bytes()], top_k=args.top_k)[0]
            except Exception as error:  # one bad file must not stop the run
                failures += 1
                print(f"{path}: error: {error}", file=sys.stderr)
                continue
            print(f"{path}: " + ", ".join(f"{p.label} ({p.score:.3f})" for p in top))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
