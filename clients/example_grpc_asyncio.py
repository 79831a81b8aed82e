#!/usr/bin/env python3
"""asyncio gRPC: many requests in flight from one event loop, bounded by a semaphore.
They are batch work (batch=True): served after interactive requests, never refused at the
server's latency objective.

python clients/example_grpc_asyncio.py --url 127.0.0.1:8001 --requests 64 --in-flight 16
"""

import argparse
import asyncio
import time
from collections import Counter

from tritonstack.client.aio import AsyncClassifierClient
from tritonstack.samples.photos import PHOTOS, photo_bytes


async def main(url: str, requests: int, in_flight: int) -> None:
    images = [photo_bytes(name) for name in PHOTOS]
    limit = asyncio.Semaphore(in_flight)
    async with AsyncClassifierClient(url, protocol="grpc", timeout_s=30, batch=True) as client:

        async def one(image: bytes) -> str:
            async with limit:
                return (await client.classify([image], top_k=1))[0][0].label

        started = time.monotonic()
        labels = await asyncio.gather(*(one(images[n % len(images)]) for n in range(requests)))
        elapsed = time.monotonic() - started
    print(f"{requests} requests, {in_flight} in flight: {requests / elapsed:.1f} images/s")
    for label, count in Counter(labels).most_common():
        print(f"  {count:4d} x {label}")


parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--url", default="127.0.0.1:8001")
parser.add_argument("--requests", type=int, default=64)
parser.add_argument("--in-flight", type=int, default=16)
args = parser.parse_args()
asyncio.run(main(args.url, args.requests, args.in_flight))
