"""Times on the wire are ISO 8601 UTC strings; inside they are integer
microseconds since the Unix epoch (what storage/ keys and compares)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from functools import lru_cache

from schedulerd.units import US_PER_S

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# The times a request may name. Storage keys hold times as unsigned 64-bit integers, so
# nothing before the epoch; and the views must render whatever a time leads to (a retry's
# backoff, a lease), so nothing near datetime's year 9999 either.
TIME_MIN_TEXT, TIME_MAX_TEXT = "1970-01-01T00:00:00Z", "2999-12-31T23:59:59Z"
TIME_MIN_US, TIME_MAX_US = 0, (datetime(3000, 1, 1, tzinfo=timezone.utc) - _EPOCH) // timedelta(microseconds=1) - 1


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
    ambiguous, and guessing the server's zone is how 2am backups run at 3am. And for a
    time outside TIME_MIN_TEXT..TIME_MAX_TEXT."""
    if not isinstance(text, str):
        raise ValueError(f"expected an ISO 8601 string, got {type(text).__name__}")
    dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if dt.tzinfo is None:
        raise ValueError(f"time {text!r} has no zone; add 'Z' or an offset like +01:00")
    us = from_datetime(dt)
    if not TIME_MIN_US <= us <= TIME_MAX_US:
        raise ValueError(f"time {text!r} is outside {TIME_MIN_TEXT} .. {TIME_MAX_TEXT}")
    return us


def from_datetime(dt: datetime) -> int:
    if dt.tzinfo is None:
        raise ValueError("naive datetime: attach a tzinfo")
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * US_PER_S + delta.microseconds
