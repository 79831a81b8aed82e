#!/usr/bin/env python3
"""System shared memory: the images go to the server, and the probabilities come
back, through /dev/shm regions; the request carries only their names. Works when
client and server share a machine.

    TRITONSTACK_ADMIN_KEY=... python clients/example_shared_memory.py --url 127.0.0.1:8000 [--protocol grpc]

Registering a region is a restricted API on servers started by tritonstack.serve:
the key comes from --admin-key or $TRITONSTACK_ADMIN_KEY.
"""

import argparse

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tritonstack.client.classifier import ClassifierClient
from tritonstack.client.shm import PREFIX
from tritonstack.contract import admin_headers
from tritonstack.samples.photos import PHOTOS, photo_bytes

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--url", default="127.0.0.1:8000")
parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
parser.add_argument("--admin-key", help="default: $TRITONSTACK_ADMIN_KEY")
args = parser.parse_args()
headers = admin_headers(args.protocol, args.admin_key)
names = list(PHOTOS)
api = httpclient if args.protocol == "http" else grpcclient


def registered_regions() -> list[str]:
    status = api.InferenceServerClient(args.url).get_system_shared_memory_status(
        headers=headers, **({"as_json": True} if args.protocol == "grpc" else {})
    )
    regions = status if args.protocol == "http" else status.get("regions", {}).values()
    return sorted(region["name"] for region in regions if region["name"].startswith(PREFIX))


with ClassifierClient(args.url, protocol=args.protocol, shm="system", headers=headers) as client:
    probabilities = client.probabilities([photo_bytes(name) for name in names])
    print(f"probabilities {probabilities.shape} read from shared memory")
    for name, top in zip(names, client.classify([photo_bytes(name) for name in names], top_k=1)):
        print(f"  {name:<22} {top[0].label} ({top[0].score:.3f})")
    print(f"regions registered while in use: {len(registered_regions())}")
# Leaving the block unregisters the regions and removes them from /dev/shm.
print(f"regions registered after close: {len(registered_regions())}")
