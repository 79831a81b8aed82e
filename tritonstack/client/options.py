"""The command-line options the client tools (classify, evaluate) share on where the
server is: its address, the protocol, the key of its restricted APIs. How to ask it
(the model, batches, patience) is tritonstack.client.runner.RunSettings'."""

from __future__ import annotations

from dataclasses import dataclass

from tritonstack import cli
from tritonstack.address import endpoint
from tritonstack.client.protocol import DEFAULT_URLS, PROTOCOLS
from tritonstack.contract import admin_headers


@dataclass(frozen=True)
class ServerOptions:
    """--url, --protocol, --admin-key: as classify and evaluate take them."""

    url: str | None = cli.option(
        None,
        "--url",
        help="Triton's address: host:port, http://host:port or grpc://host:port "
        f"(default: {DEFAULT_URLS['http']} for http, {DEFAULT_URLS['grpc']} for grpc)",
    )
    protocol: str | None = cli.option(
        None, "--protocol", choices=PROTOCOLS, help="default: the --url's scheme, else http"
    )
    admin_key: str | None = cli.option(
        None,
        "--admin-key",
        metavar="KEY",
        help="key of the server's restricted APIs, needed with --shm "
        "system (default: $TRITONSTACK_ADMIN_KEY; write --admin-key=KEY if it starts with -)",
    )

    def endpoint(self) -> tuple[str, str]:
        """The address and the protocol: given, or the defaults (tritonstack.address.endpoint)."""
        return endpoint(self.url, self.protocol, DEFAULT_URLS)

    def run_fields(self) -> dict:
        """RunSettings' fields these options set: cli.from_args(RunSettings, args, **options.run_fields())."""
        url, protocol = self.endpoint()
        return {"url": url, "protocol": protocol, "headers": admin_headers(protocol, self.admin_key)}
