"""Server addresses as people type them: `host:port`, `http://host:port` or
`grpc://host:port`, the one parser every command line uses.

    >>> parse_address("grpc://127.0.0.1:8001")
    Address(host='127.0.0.1', port=8001, scheme='grpc')
    >>> parse_address("localhost:8000").hostport
    'localhost:8000'

tritonclient wants bare `host:port` (it refuses a scheme), Locust wants
`http://host:port`, a Prometheus scrape wants `http://host:port/metrics`: each
caller takes the form it needs from the one Address.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

SCHEMES = ("http", "grpc")
METRICS_PATH = "/metrics"


class AddressError(ValueError):
    """An address that is not `[http://|grpc://]host:port`."""


@dataclass(frozen=True)
class Address:
    host: str
    port: int
    scheme: str | None = None  # as typed; None for a bare host:port

    @property
    def hostport(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # IPv6
        return f"{host}:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.hostport}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.hostport}{METRICS_PATH}"


def parse_address(text: str, allowed_paths: tuple[str, ...] = ("", "/")) -> Address:
    """`[scheme://]host:port[path]` -> Address; AddressError says what is wrong."""
    text = text.strip()
    scheme, separator, rest = text.partition("://")
    if not separator:
        scheme, rest = "", text
    scheme = scheme.lower()
    if scheme and scheme not in SCHEMES:
        supported = " or ".join(f"{s}://" for s in SCHEMES)
        raise AddressError(f"address {text!r}: scheme {scheme}:// is not supported (use host:port, {supported})")
    try:
        parts = urlsplit(f"//{rest}")
        port = parts.port
    except ValueError:  # a port that is not a number, or out of range
        raise AddressError(
            f"address {text!r}: the port must be a number from 0 to 65535, e.g. 127.0.0.1:8000"
        ) from None
    if not parts.hostname or port is None:
        raise AddressError(f"address {text!r}: expected host:port, e.g. 127.0.0.1:8000")
    if parts.path not in allowed_paths or parts.query or parts.fragment:
        raise AddressError(f"address {text!r}: unexpected path {parts.path or '?' + parts.query!r}; expected host:port")
    return Address(parts.hostname, port, scheme or None)


def parse_metrics_url(text: str) -> str:
    """A Prometheus endpoint: `host:port` or `http://host:port[/metrics]` -> the full URL."""
    address = parse_address(text, allowed_paths=("", "/", METRICS_PATH))
    if address.scheme == "grpc":
        raise AddressError(f"address {text!r}: Triton's metrics are served over HTTP, not gRPC")
    return address.metrics_url


def resolve_protocol(address: Address | None, protocol: str | None, default: str = "http") -> str:
    """The protocol the scheme or --protocol names (they must agree), else `default`."""
    if address and address.scheme and protocol and address.scheme != protocol:
        raise AddressError(
            f"address {address.scheme}://{address.hostport} and protocol {protocol} disagree: "
            "drop the scheme or the protocol (--protocol)"
        )
    return (address.scheme if address else None) or protocol or default


def endpoint(url: str | None, protocol: str | None, default_urls: dict[str, str]) -> tuple[str, str]:
    """(host:port, protocol) from --url and --protocol as typed: the scheme names
    the protocol; without --url, the protocol's default address."""
    address = parse_address(url) if url else None
    protocol = resolve_protocol(address, protocol)
    return (address.hostport if address else default_urls[protocol]), protocol
