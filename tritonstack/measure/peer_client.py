"""The client the load loops drive the peer with (tritonstack.benchmark.peer_service's
own API: the encoded image as the body), beside ours over "http" and "grpc"."""

from __future__ import annotations

import aiohttp
import numpy as np

PEER_PROTOCOL = "peer"  # what the load loops call the peer's HTTP, beside "http" and "grpc"


class PeerClient:
    """The peer's client in the load loops: aiohttp, as tritonclient's HTTP aio
    client is, one connection per request in flight."""

    def __init__(self, url: str, model: str, timeout_s: float, max_connections: int = 100):
        self.endpoint = f"http://{url}/classify/{model}"
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "PeerClient":
        connector = aiohttp.TCPConnector(limit=self.max_connections)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._session.close()

    async def probabilities(self, images: list[bytes]) -> np.ndarray:
        """The top-5 probabilities the peer answers for one image (its whole answer)."""
        (image,) = images
        async with self._session.post(self.endpoint, data=image) as response:
            if response.status != 200:
                raise RuntimeError(f"peer answered {response.status}: {await response.text()}")
            answer = await response.json()
        return np.asarray([[probability for _, probability in answer["top5"]]], dtype=np.float32)
