"""The client side of schedulerd: what a worker process or a caller imports.

`Worker` and `Task` pull due work and ack it (worker.py, its ack batcher acks.py),
`Client` calls the HTTP API (client.py), and `http_executor` runs http-target jobs.
None of it imports the daemon, its Raft layer or its state machine: a worker needs
aiohttp, not LMDB (tests/unit/test_sdk_boundary.py holds it to that). The names are
loaded on first use, so `schedctl`, which needs only the client, starts without aiohttp."""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Client", "Task", "Worker"]
_HOMES = {"Client": "schedulerd.sdk.client", "Task": "schedulerd.sdk.worker", "Worker": "schedulerd.sdk.worker"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'schedulerd.sdk' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
