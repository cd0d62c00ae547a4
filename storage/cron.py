"""Where a fire time is computed. Pure: the caller passes every instant in.

Schedules are stored normalized (integers in microseconds, the cron text and
its IANA zone), and fire times are UTC epoch microseconds, so every replica
computes the same next time from the same inputs."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

US = 1_000_000


class ScheduleError(ValueError):
    """The schedule cannot be used; the message says what is allowed."""


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"unknown time zone {name!r}; use an IANA name like 'Europe/Berlin' or 'UTC'") from None


def check_cron(expr: str, tz: str) -> dict[str, Any]:
    """Validate a cron expression (5 fields, or 6 with seconds first) and its zone."""
    if not isinstance(expr, str) or not expr.strip():
        raise ScheduleError("cron must be a non-empty string like '0 2 * * *'")
    fields = expr.split()
    if len(fields) not in (5, 6):
        raise ScheduleError(
            f"cron {expr!r} has {len(fields)} fields; use 5 (minute hour day month weekday) "
            "or 6 (second first)"
        )
    zone(tz)
    seconds = len(fields) == 6
    if not croniter.is_valid(expr, second_at_beginning=seconds):
        raise ScheduleError(f"cron {expr!r} is not a valid expression")
    return {"kind": "cron", "cron": " ".join(fields), "timezone": tz, "seconds": seconds}


def first_fire(schedule: dict[str, Any], now_us: int) -> int | None:
    """The first occurrence of a new job created at now_us.

    A one-off time in the past fires at once (it was accepted, so it runs late
    rather than never); an interval counts from creation."""
    kind = schedule["kind"]
    if kind == "at":
        return schedule["at_us"]
    if kind == "every":
        return schedule["anchor_us"] + schedule["every_us"]
    return next_after(schedule, now_us)


def next_after(schedule: dict[str, Any], after_us: int) -> int | None:
    """The first occurrence strictly after after_us, or None when there is none."""
    kind = schedule["kind"]
    if kind == "at":
        return schedule["at_us"] if schedule["at_us"] > after_us else None
    if kind == "every":
        every, anchor = schedule["every_us"], schedule["anchor_us"]
        if after_us < anchor:
            return anchor + every
        return anchor + every * ((after_us - anchor) // every + 1)
    return _cron_next(schedule, after_us)


def _cron_next(schedule: dict[str, Any], after_us: int) -> int | None:
    tz = zone(schedule["timezone"])
    start = datetime.fromtimestamp(after_us / US, tz=timezone.utc).astimezone(tz)
    it = croniter(schedule["cron"], start, second_at_beginning=schedule["seconds"])
    try:
        nxt: datetime = it.get_next(datetime)
    except Exception:
        # croniter gives up on expressions that never match (e.g. Feb 30): no next time.
        return None
    return _to_us(nxt)


def _to_us(dt: datetime) -> int:
    delta = dt.astimezone(timezone.utc) - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * US + delta.microseconds


def preview(schedule: dict[str, Any], after_us: int, n: int) -> list[int]:
    out: list[int] = []
    t = after_us
    for _ in range(n):
        nxt = next_after(schedule, t)
        if nxt is None:
            break
        out.append(nxt)
        t = nxt
    return out
