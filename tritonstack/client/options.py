"""The command-line options the client tools (classify.py, evaluate.py) share:
where the server is, which model, how patiently to ask it."""

from __future__ import annotations

import argparse

from tritonstack import cli
from tritonstack.client.protocol import DEFAULT_URLS, PROTOCOLS
from tritonstack.contract import DEFAULT_MODEL


def add_server_options(
    parser: argparse.ArgumentParser, model_help: str = "a model that takes encoded images (an ensemble)"
) -> None:
    """--url, --protocol, --model, --admin-key, --retries, --timeout: as classify.py and evaluate.py take them."""
    parser.add_argument(
        "--url",
        help="Triton's address: host:port, http://host:port or grpc://host:port "
        f"(default: {DEFAULT_URLS['http']} for http, {DEFAULT_URLS['grpc']} for grpc)",
    )
    parser.add_argument("--protocol", choices=PROTOCOLS, help="default: the --url's scheme, else http")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=model_help)
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help=(
            "per-request deadline in seconds: the client stops waiting then, and the server "
            "refuses the request if it is still queued"
        ),
    )
    parser.add_argument(
        "--admin-key",
        metavar="KEY",
        help="key of the server's restricted APIs, needed with --shm "
        "system (default: $TRITONSTACK_ADMIN_KEY; write --admin-key=KEY if it starts with -)",
    )
    parser.add_argument(
        "--retries",
        type=cli.non_negative_int,
        default=3,
        metavar="N",
        help="retries when the server is unreachable or unavailable (backoff with jitter)",
    )
