#!/usr/bin/env python3
"""Sync HTTP: several photos in one request, top 3 of each.

python clients/example_http.py --url 127.0.0.1:8000 [IMAGE ...]
"""

import argparse
from pathlib import Path

from tritonstack.client.classifier import ClassifierClient
from tritonstack.samples.photos import PHOTOS, photo_path

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("images", nargs="*", type=Path, default=[photo_path(name) for name in PHOTOS])
parser.add_argument("--url", default="127.0.0.1:8000")
args = parser.parse_args()

# Checks that the server and the model are ready, reads input/output names and
# max_batch_size from the server; binary tensor data, padded to the longest image.
with ClassifierClient(args.url, protocol="http", timeout_s=30) as client:
    tops = client.classify([path.read_bytes() for path in args.images], top_k=3)
    for path, top in zip(args.images, tops):
        print(f"{path.name:<22}", ", ".join(f"{p.label} ({p.score:.3f})" for p in top))
