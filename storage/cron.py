"""Where a fire time is computed. Pure: the caller passes every instant in.

Schedules are stored normalized (integers in microseconds, the cron text and
its IANA zone), and fire times are UTC epoch microseconds, so every replica
computes the same next time from the same inputs.

Cron and daylight saving time. croniter is used only to match wall-clock
times (naive, as if the zone had no DST); mapping a wall-clock time to an
instant is done here, segment by segment of constant UTC offset, because
croniter alone fires `30 1 * * *` twice on a fall-back night. The rules
(README "Time zones and DST"):

- named hours (the hour field does not cover all 24 hours) follow the wall
  clock: a time inside a spring-forward gap fires once, at the end of the
  gap; a time repeated by a fall-back fires once, at its first occurrence;
- all-hours expressions (`*/15 * * * *`, `0 * * * *`) follow elapsed time:
  they fire at every instant whose local wall-clock time matches, so both
  copies of a repeated hour fire, and a gap has nothing to fire.
"""
from __future__ import annotations

import calendar
import threading
from bisect import bisect_right
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from schedulerd.units import US_PER_S

# Offset changes are found by probing the zone every 6 h and bisecting to the
# second. No zone in tzdata changes its offset twice within 6 h.
_PROBE_S = 6 * 3600
# Steps of the segment walk in one next_after. Each step reaches a fire time,
# an offset change or a year boundary; croniter gives up after 50 years
# (about 150 steps), so hitting this means a bug, not a rare schedule.
_STEPS_MAX = 10_000
_CRON_CACHE_MAX = 4096
_NEXT_CACHE_MAX = 8192
_ZONE_YEARS_CACHE_MAX = 1024
_ALL_HOURS = frozenset(range(24))
_HOUR_FIELD = 1  # croniter's `expanded` is [minute, hour, day, month, weekday(, second)]

# A cached croniter is a mutable iterator; Raft apply threads and HTTP handlers
# may share one, so each set-and-step happens under this lock.
_CRON_LOCK = threading.Lock()


class ScheduleError(ValueError):
    """The schedule cannot be used; the message says what is allowed."""


# The shorthands of Vixie cron and Kubernetes CronJob; stored as the expression they stand for.
ALIASES = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
           "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
# Zone abbreviations people write for a region's local time. tzdata knows some of them as
# fixed offsets with no daylight saving time (EST is UTC-5 in July too); the others not at all.
_FIXED_ABBREVIATIONS = {
    "EST": "for New York's local time (EDT in summer) use 'America/New_York'",
    "MST": "for Denver's local time (MDT in summer) use 'America/Denver'; Arizona, on MST all year, is "
           "'America/Phoenix'",
    "HST": "Hawaii keeps this offset all year: 'Pacific/Honolulu' names it, and follows any change of its rules",
}
_UNKNOWN_ABBREVIATIONS = {"PST": "America/Los_Angeles", "PDT": "America/Los_Angeles", "MDT": "America/Denver",
                          "CST": "America/Chicago", "CDT": "America/Chicago", "EDT": "America/New_York",
                          "BST": "Europe/London", "CET": "Europe/Berlin", "CEST": "Europe/Berlin",
                          "IST": "Asia/Kolkata", "JST": "Asia/Tokyo", "AEST": "Australia/Sydney"}


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a tzdata folder, a name too long
        region = _UNKNOWN_ABBREVIATIONS.get(name.upper()) if isinstance(name, str) else None
        example = f"{region!r} for the local time {name!r} is used for" if region else "'Europe/Berlin' or 'UTC'"
        raise ScheduleError(f"unknown time zone {name!r}; use an IANA name like {example}") from None


def zone_warning(name: str) -> str | None:
    """What to tell someone who named a fixed-offset zone meaning a region's local time."""
    advice = _FIXED_ABBREVIATIONS.get(name)
    if advice is None:
        return None
    offset = zone(name).utcoffset(datetime(2000, 1, 1))
    hours = int(offset.total_seconds() // 3600) if offset is not None else 0
    return f"timezone {name!r} is a fixed offset (UTC{hours:+03d}:00) with no daylight saving time; {advice}"


def check_cron(expr: str, tz: str) -> dict[str, Any]:
    """Validate a cron expression (5 fields, 6 with seconds first, or a shorthand such as
    @daily) and its zone."""
    if not isinstance(expr, str) or not expr.strip():
        raise ScheduleError("cron must be a non-empty string like '0 2 * * *'")
    if expr.strip().startswith("@"):
        alias = expr.strip().lower()
        if alias not in ALIASES:
            raise ScheduleError(f"cron {expr!r} is not a shorthand schedulerd knows; use one of "
                                f"{', '.join(ALIASES)} or 5 fields like '0 2 * * *'")
        expr = ALIASES[alias]
    fields = expr.split()
    if len(fields) not in (5, 6):
        raise ScheduleError(
            f"cron {expr!r} has {len(fields)} fields; use 5 (minute hour day month weekday) "
            "or 6 (second first)"
        )
    zone(tz)
    seconds = len(fields) == 6
    if not _is_valid(expr, seconds):
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
        return next_after(schedule, schedule["anchor_us"])  # anchor + every, within the bounds
    return next_after(schedule, now_us)


def next_after(schedule: dict[str, Any], after_us: int) -> int | None:
    """The first occurrence strictly after after_us, or None when there is none.

    A schedule's bounds (`start_us`, `end_us`, from entry version 13; both inclusive):
    no occurrence before the first or after the second. An interval with a start counts
    from it (jobs.anchored puts its anchor one interval before), so the start is its
    first occurrence."""
    kind = schedule["kind"]
    if kind == "at":
        return schedule["at_us"] if schedule["at_us"] > after_us else None
    start, end = schedule.get("start_us"), schedule.get("end_us")
    if start is not None and after_us < start:
        after_us = start - 1
    if kind == "every":
        every, anchor = schedule["every_us"], schedule["anchor_us"]
        nxt = anchor + every if after_us < anchor else anchor + every * ((after_us - anchor) // every + 1)
    else:
        nxt = _cron_next(schedule["cron"], schedule["seconds"], schedule["timezone"], after_us)
    return None if nxt is None or (end is not None and nxt > end) else nxt


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


# -- cron in a zone -----------------------------------------------------------------

@dataclass(frozen=True)
class _Segment:
    """A stretch of the UTC timeline with one UTC offset."""

    offset_s: int  # local wall clock = UTC + offset_s
    end_us: int  # first instant with the next offset, or a year boundary when none is known
    next_offset_s: int  # the offset from end_us on (equal to offset_s at a year boundary)
    # Instants before this replay wall-clock times the previous segment already
    # showed (the repeated hour after a fall-back); the segment's start otherwise.
    repeat_until_us: int


# Jobs sharing an expression and zone fire at the same instants (10,000 jobs on
# `0 0 * * *` in one zone at midnight): their claims all ask for the same next
# time, ~40 µs each on every replica, in the apply thread. Pure, so memoized.
@lru_cache(maxsize=_NEXT_CACHE_MAX)
def _cron_next(expr: str, seconds: bool, tz: str, after_us: int) -> int | None:
    """The first fire time of a cron schedule strictly after after_us, by the DST rules
    in the module docstring. Walks the UTC timeline one constant-offset segment at a time."""
    named_hours = not _all_hours(expr, seconds)
    t = after_us  # exclusive lower bound; only grows
    # The segment holding t itself, not t + 1: when t is the last instant before a
    # spring-forward, the gap's fire time is t + 1, found only from the segment it ends.
    seg = _segment(tz, t)
    for _ in range(_STEPS_MAX):
        # Cron matches fall on whole seconds, so "after t" is "after floor(t)" in seconds.
        wall_s = _next_wall_s(expr, seconds, t // US_PER_S + seg.offset_s)
        if wall_s is None:
            return None
        fire_us = (wall_s - seg.offset_s) * US_PER_S
        if fire_us >= seg.end_us:
            end_s = seg.end_us // US_PER_S
            if named_hours and seg.next_offset_s > seg.offset_s and wall_s < end_s + seg.next_offset_s:
                # The named time does not exist (spring forward): run once, when the gap ends.
                return seg.end_us
            t = seg.end_us - 1  # go on in the next segment, from its first instant
            seg = _segment(tz, seg.end_us)
            continue
        if named_hours and fire_us < seg.repeat_until_us:
            # The second copy of a repeated wall-clock time: named hours ran at the first.
            t = seg.repeat_until_us - 1
            continue
        return fire_us
    raise RuntimeError(f"cron {expr!r} in {tz}: no answer after {_STEPS_MAX} steps from {after_us}")


@lru_cache(maxsize=_CRON_CACHE_MAX)
def _is_valid(expr: str, seconds: bool) -> bool:
    # Memoized like the parse: croniter.is_valid costs ~46 µs, and a batch create of
    # jobs on one expression checked it once per job on the API node's event loop.
    return croniter.is_valid(expr, second_at_beginning=seconds)


@lru_cache(maxsize=_CRON_CACHE_MAX)
def _parsed(expr: str, seconds: bool) -> croniter:
    # start_time given so croniter does not read the clock (storage/ never does).
    return croniter(expr, 0.0, ret_type=float, second_at_beginning=seconds)


@lru_cache(maxsize=_CRON_CACHE_MAX)
def _all_hours(expr: str, seconds: bool) -> bool:
    """True when the hour field covers all 24 hours (`*`, `*/1`, `0-23`, ...)."""
    hours = _parsed(expr, seconds).expanded[_HOUR_FIELD]
    return hours == ["*"] or frozenset(hours) == _ALL_HOURS


def _next_wall_s(expr: str, seconds: bool, after_wall_s: int) -> int | None:
    """The first wall-clock time matching expr strictly after after_wall_s.

    Wall-clock times are seconds counted as if the zone were UTC, so croniter
    does no DST handling of its own."""
    it = _parsed(expr, seconds)
    with _CRON_LOCK:
        try:
            return int(it.get_next(float, start_time=float(after_wall_s)))
        except CroniterBadDateError:
            return None  # never matches within croniter's 50-year search (e.g. Feb 30)


def _segment(tz: str, t_us: int) -> _Segment:
    """The constant-offset segment of zone tz that holds the instant t_us."""
    year = datetime.fromtimestamp(t_us // US_PER_S, timezone.utc).year
    changes = _changes_around(tz, year)
    index = bisect_right(changes, t_us, key=lambda change: change[0])
    if index:
        start_us, before_s, offset_s = changes[index - 1]
        repeat_until_us = start_us + max(0, before_s - offset_s) * US_PER_S
    else:
        offset_s = _offset_s(zone(tz), t_us // US_PER_S)
        repeat_until_us = t_us
    if index < len(changes):
        end_us, _, next_offset_s = changes[index]
    else:
        # No change known up to the end of year + 1: stop there and look again.
        end_us, next_offset_s = _year_start_s(year + 2) * US_PER_S, offset_s
    return _Segment(offset_s, end_us, next_offset_s, repeat_until_us)


@lru_cache(maxsize=_ZONE_YEARS_CACHE_MAX)
def _changes_around(tz: str, year: int) -> tuple[tuple[int, int, int], ...]:
    """Offset changes (instant_us, offset_before_s, offset_after_s) after the start
    of year - 1 and up to the start of year + 2 (UTC)."""
    return tuple(change for y in (year - 1, year, year + 1) for change in _year_changes(tz, y))


@lru_cache(maxsize=_ZONE_YEARS_CACHE_MAX)
def _year_changes(tz: str, year: int) -> tuple[tuple[int, int, int], ...]:
    """Offset changes after the start of `year` and up to the start of the next (UTC)."""
    info = zone(tz)
    t, end = _year_start_s(year), _year_start_s(year + 1)
    before = _offset_s(info, t)
    out: list[tuple[int, int, int]] = []
    while t < end:
        probe = min(t + _PROBE_S, end)
        after = _offset_s(info, probe)
        if after != before:
            low, high = t, probe  # offset(low) == before, offset(high) == after
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (mid, high) if _offset_s(info, mid) == before else (low, mid)
            out.append((high * US_PER_S, before, after))
            before = after
        t = probe
    return tuple(out)


def _offset_s(info: ZoneInfo, t_s: int) -> int:
    offset = datetime.fromtimestamp(t_s, info).utcoffset()
    assert offset is not None, "a ZoneInfo always has an offset"
    return offset.days * 86_400 + offset.seconds


def _year_start_s(year: int) -> int:
    return calendar.timegm((year, 1, 1, 0, 0, 0))
