"""The environment the launcher gives tritonserver and, through it, the backend
stubs it spawns: settings of the C library's allocator (docs/memory.md)."""

from __future__ import annotations

# Filled from the memory probe's findings (docs/memory.md).
STUB_ENVIRONMENT: dict[str, str] = {}
