"""Times on the wire are ISO 8601 UTC strings; inside they are integer
microseconds since the Unix epoch (what storage/ keys and compares)."""
from __future__ import annotations

from datetime import datetime, timezone
from functools import lru_cache

US_PER_S = 1_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def to_iso(us: int | None) -> str | None:
    """Render epoch microseconds as `2026-11-30T02:00:00Z` (`.ffffff` only when not zero)."""
    if us is None:
        return None
    seconds, micros = divmod(us, US_PER_S)
    text = _second(seconds)
    return f"{text}.{micros:06d}Z" if micros else f"{text}Z"


@lru_cache(maxsize=4096)
def _second(seconds: int) -> str:
    # Cached: a busy node renders thousands of times a second, mostly within the same few seconds.
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def from_iso(text: str) -> int:
    """Parse an ISO 8601 time with an explicit offset (or Z) into epoch microseconds.

    Raises ValueError for a naive time: a job's wall-clock time without a zone is
    ambiguous, and guessing the server's zone is how 2am backups run at 3am."""
    if not isinstance(text, str):
        raise ValueError(f"expected an ISO 8601 string, got {type(text).__name__}")
    dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if dt.tzinfo is None:
        raise ValueError(f"time {text!r} has no zone; add 'Z' or an offset like +01:00")
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * US_PER_S + delta.microseconds


def from_datetime(dt: datetime) -> int:
    if dt.tzinfo is None:
        raise ValueError("naive datetime: attach a tzinfo")
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * US_PER_S + delta.microseconds
