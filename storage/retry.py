"""Backoff between attempts. Jitter is derived from the occurrence and the
attempt (crc32), not drawn at random, so every replica computes the same
available_at for the same retry."""
from __future__ import annotations

import zlib
from typing import Any

DEFAULT_BACKOFF = {"base_ms": 1000, "factor": 2.0, "max_ms": 300_000}
JITTER_SPREAD = 0.2  # delays land in [0.8, 1.2) of the exponential value, capped at max_ms


def backoff_problem(backoff: dict[str, Any]) -> str | None:
    """What is wrong with a whole backoff, or None: the API checks a request with it, and
    apply checks an update's parts laid over the backoff stored (jobs.update_job)."""
    if backoff["max_ms"] < backoff["base_ms"]:
        return f"backoff.max_ms ({backoff['max_ms']}) must be at least backoff.base_ms ({backoff['base_ms']})"
    return None


def backoff_us(backoff: dict[str, Any] | None, job_id: str, scheduled_us: int, attempt: int) -> int:
    """Delay before attempt+1 after `attempt` failed (attempt counts from 1)."""
    b = backoff or DEFAULT_BACKOFF
    try:
        grown = b["base_ms"] * b["factor"] ** max(0, attempt - 1)
    except OverflowError:  # a run re-driven past attempt ~300 with factor 10: long past max_ms
        grown = b["max_ms"]
    raw_ms = min(b["max_ms"], grown)
    seed = zlib.crc32(f"{job_id}:{scheduled_us}:{attempt}".encode())
    fraction = (seed % 10_000) / 10_000
    jittered = raw_ms * (1 - JITTER_SPREAD + 2 * JITTER_SPREAD * fraction)
    return int(min(b["max_ms"], jittered) * 1000)
