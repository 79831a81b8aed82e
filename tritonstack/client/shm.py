"""System shared memory regions for one in-flight request: the encoded images go
in one region, the probabilities come back in another, and the request carries
only their names.

A region lives in /dev/shm (created and destroyed here) and is known to the
server only while registered; the clients in tritonstack.client.classifier and
tritonstack.client.aio register it before use, register it again after a server
restart (a new server knows no region), and always unregister and destroy it on
close. Each region keeps its own registration state: what one request learns about
its regions says nothing about another's.
"""

from __future__ import annotations

import logging
import os
import uuid

import numpy as np
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import triton_to_np_dtype

PREFIX = "tritonstack"
LOGGER = logging.getLogger("tritonstack.client")


class RegionsLeftRegistered(RuntimeError):
    """A client's close could not unregister regions that the server still has: their
    memory stays mapped in the server until it restarts."""


class SharedMemoryRegion:
    """One named region that grows when a request does not fit."""

    def __init__(self, role: str):
        self.name = f"{PREFIX}_{os.getpid()}_{uuid.uuid4().hex[:8]}_{role}"
        self.key = f"/{self.name}"
        self.byte_size = 0
        self.registered = False
        self._handle = None

    @property
    def allocated(self) -> bool:
        return self._handle is not None

    def fits(self, byte_size: int) -> bool:
        return self._handle is not None and byte_size <= self.byte_size

    def allocate(self, byte_size: int) -> None:
        """(Re)create the region locally; the caller registers it."""
        self.destroy()
        # Round up so that batches of similar size reuse the region.
        self.byte_size = max(4096, 1 << (byte_size - 1).bit_length())
        self._handle = shm.create_shared_memory_region(self.name, self.key, self.byte_size)

    def write(self, array: np.ndarray) -> None:
        shm.set_shared_memory_region(self._handle, [np.ascontiguousarray(array)])

    def read(self, datatype: str, shape: list[int]) -> np.ndarray:
        # A copy: the region is overwritten by the next request.
        return np.array(shm.get_contents_as_numpy(self._handle, triton_to_np_dtype(datatype), shape))

    def destroy(self) -> None:
        if self._handle is not None:
            shm.destroy_shared_memory_region(self._handle)
            self._handle = None
            self.byte_size = 0


class RequestRegions:
    """The input and the output region of one in-flight request."""

    def __init__(self):
        self.input = SharedMemoryRegion("input")
        self.output = SharedMemoryRegion("output")

    def __iter__(self):
        return iter((self.input, self.output))

    def forget_registration(self) -> None:
        """The server said it does not know one of them (a new server after a restart):
        register both again, unregistering first in case it still has the other."""
        for region in self:
            region.registered = False

    def destroy(self) -> None:
        for region in self:
            region.destroy()


def registered_names(status) -> set[str]:
    """The region names in get_system_shared_memory_status's answer: a list over HTTP,
    {"regions": {name: region}} over gRPC (as_json)."""
    regions = status.get("regions", {}).values() if isinstance(status, dict) else status
    return {region["name"] for region in regions}


def check_released(failures: dict[str, BaseException], status) -> None:
    """After a close whose unregister of some regions failed (`failures`, by name):
    raise RegionsLeftRegistered for those the server still lists (`status`, its answer
    to get_system_shared_memory_status), or log them all when it could not be asked
    (`status`, the error): never leave a region behind silently."""
    if isinstance(status, BaseException):
        for name, error in failures.items():
            LOGGER.error("shared-memory region %s may still be registered on the server (%s; %s)", name, error, status)
        return
    left = {name: error for name, error in failures.items() if name in registered_names(status)}
    if left:
        raise RegionsLeftRegistered(
            "the server still has shared-memory regions this client could not unregister: "
            + "; ".join(f"{name} ({error})" for name, error in left.items())
        )
