"""Finding the occurrences a job missed: the newest `limit` of them and a
count of the older ones, without walking a long outage one tick at a time.

Everything goes through cron.next_after, so the occurrences found here are
exactly the ones the job would have fired (time zones and DST included)."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from schedulerd.storage import cron
from schedulerd.units import US_PER_S

COUNT_STEPS_MAX = 1000  # past this, the count of older missed occurrences is reported as unknown
WINDOW_STEPS_MAX = 20_000


@dataclass(frozen=True)
class Missed:
    recent: list[int]  # newest `limit` missed occurrences, oldest first
    older_first: int | None  # the older ones (not considered): first, last, how many
    older_last: int | None
    older_count: int | None  # None: more than COUNT_STEPS_MAX, not counted


@dataclass(frozen=True)
class _Window:
    found: list[int]  # the newest `limit` occurrences in it, oldest first
    dropped: int | None  # the newest of the others
    dropped_count: int
    complete: bool  # False: the scan stopped at its step cap before the window's end


def missed(schedule: dict[str, Any], fire_us: int, cutoff_us: int, limit: int, exact: bool = True) -> Missed:
    """Occurrences in [fire_us, cutoff_us), fire_us being the job's next_fire_us.

    The window scanned grows backwards from cutoff_us until it holds more than `limit`.
    A window that grew past WINDOW_STEPS_MAX occurrences in one step (a cron dense in
    some months only, say) is narrowed by bisection (`exact`, entries of version 9 on);
    before, its scan stopped part-way and took the occurrences where it stopped for the
    newest, leaving those after them without a record."""
    nxt = cron.next_after(schedule, fire_us)
    gap = max(US_PER_S, (nxt - fire_us) if nxt is not None else US_PER_S)
    span = gap * (limit + 1)
    roomy = cutoff_us  # a start that leaves at most `limit` in the window
    while True:
        start = max(fire_us, cutoff_us - span)
        window = _scan(schedule, fire_us, start, cutoff_us, limit, WINDOW_STEPS_MAX)
        if exact and not window.complete:
            start, window = _narrow(schedule, fire_us, start, roomy, cutoff_us, limit)
            break
        if window.dropped_count > 0 or start == fire_us or span > cutoff_us:
            break
        roomy = start
        span *= 4
    found, dropped, dropped_count = window.found, window.dropped, window.dropped_count
    if start == fire_us and dropped_count == 0:
        return Missed(found, None, None, 0)
    if start == fire_us:
        return Missed(found, fire_us, dropped, dropped_count)
    before = _count(schedule, fire_us, start)
    return Missed(found, fire_us, dropped, None if before is None else before + dropped_count)


def _narrow(schedule: dict[str, Any], fire_us: int, crowded: int, roomy: int, cutoff: int,
            limit: int) -> tuple[int, _Window]:
    """A start in (crowded, roomy) whose window holds more than `limit` occurrences and at
    most `cap`, found by bisection: [crowded, cutoff) holds more than cap, [roomy, cutoff)
    at most limit. Moving the start by 1 µs changes the count by at most one, and the two
    ends differ by more than one, so a middle always lies strictly between them and the
    search ends. Each probe stops after `cap` steps, so the search costs less than the
    WINDOW_STEPS_MAX-step scan that found the window too full."""
    cap = 2 * (limit + 1)
    while True:
        mid = (crowded + roomy) // 2
        window = _scan(schedule, fire_us, mid, cutoff, limit, cap)
        if not window.complete:
            crowded = mid
        elif window.dropped_count > 0:
            return mid, window
        else:
            roomy = mid


def _scan(schedule: dict[str, Any], fire_us: int, start: int, cutoff: int, limit: int, steps_max: int) -> _Window:
    """The newest `limit` occurrences in [start, cutoff), the newest dropped one, and how many were dropped."""
    window: deque[int] = deque(maxlen=limit)
    t = fire_us if start == fire_us else cron.next_after(schedule, start - 1)
    dropped, dropped_count, steps = None, 0, 0
    while t is not None and t < cutoff and steps < steps_max:
        if len(window) == limit:
            dropped, dropped_count = window[0], dropped_count + 1
        window.append(t)
        t = cron.next_after(schedule, t)
        steps += 1
    return _Window(list(window), dropped, dropped_count, complete=t is None or t >= cutoff)


def _count(schedule: dict[str, Any], first_us: int, end_us: int) -> int | None:
    """Occurrences in [first_us, end_us), first_us being one; None when over COUNT_STEPS_MAX."""
    if schedule["kind"] == "every":
        every, anchor = schedule["every_us"], schedule["anchor_us"]
        return (end_us - 1 - anchor) // every - (first_us - anchor) // every + 1 if end_us > first_us else 0
    n, t = 0, first_us
    while t is not None and t < end_us:
        n += 1
        if n > COUNT_STEPS_MAX:
            return None
        t = cron.next_after(schedule, t)
    return n
