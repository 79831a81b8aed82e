"""Which of Triton's APIs need the admin key, and the flags that say so.

Locked down by default: the model-repository (model control), shared-memory,
statistics, trace and logging APIs answer only requests carrying the admin key
header (tritonstack.contract.admin_headers); inference, health and metadata stay
open. The key comes from $TRITONSTACK_ADMIN_KEY, else a random one per server.
"""

from __future__ import annotations

import os
import re
import secrets

from tritonstack.contract import ADMIN_HEADER, ADMIN_KEY_ENV

# Everything that changes the server or reveals more than inference needs.
RESTRICTED_APIS = ("model-repository", "shared-memory", "statistics", "trace", "logging")
_KEY = re.compile(r"[A-Za-z0-9._~-]+")


def admin_key(given: str | None = None) -> str:
    """The key given, else $TRITONSTACK_ADMIN_KEY, else a random one; refused if
    Triton would misparse it."""
    # Hex, not token_urlsafe: one urlsafe key in 64 starts with "-", which argparse
    # then takes for an option in `classify.py --admin-key KEY`.
    key = given or os.environ.get(ADMIN_KEY_ENV) or secrets.token_hex(24)
    if not _KEY.fullmatch(key):
        # Triton parses the flag as <apis>:<header>=<key>.
        raise ValueError(f"the admin key (${ADMIN_KEY_ENV}) may hold only letters, digits and . _ ~ -")
    return key


def restriction_flags(apis: tuple[str, ...], key: str) -> list[str]:
    """tritonserver flags that put `apis` behind the key, on HTTP and gRPC alike."""
    if not apis:
        return []
    listed = ",".join(apis)
    # Same key for both; Triton prefixes the gRPC metadata name itself.
    return [
        f"--http-restricted-api={listed}:{ADMIN_HEADER}={key}",
        f"--grpc-restricted-protocol={listed}:{ADMIN_HEADER}={key}",
    ]
