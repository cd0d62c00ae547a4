"""Holiday calendars: named lists of days, in the calendar's own time zone, on which the
occurrences of a job naming one (`skip_calendar`) are skipped.

A calendar lives in the metadata group's state (storage/meta.py) as sorted, disjoint,
inclusive ranges of days, `[["2026-12-24", "2026-12-26"], ...]`. The data groups never read
the metadata: the leader that proposes a claim copies into the entry the calendars its jobs
name (`carried`), and apply decides by the entry alone (`falls_on`), so every replica decides
alike whatever its own metadata view holds. A calendar the entry does not carry skips nothing."""
from __future__ import annotations

from bisect import bisect_right
from datetime import date, datetime, timedelta, timezone
from itertools import islice
from typing import Any, Iterator

import lmdb

from schedulerd.storage import cron
from schedulerd.storage.layouts import JOBS
from schedulerd.storage.model import JobState
from schedulerd.storage.tables import Tables

# name -> {"timezone": IANA zone, "ranges": [[first_day, last_day], ...]}, as an entry carries them.
Calendars = dict[str, dict[str, Any]]
# A job in one of these states may still claim an occurrence: it uses the calendar it names.
USING_STATES = frozenset({JobState.SCHEDULED.value, JobState.PAUSED.value})


def parse_day(text: Any, what: str) -> date:
    """A day written YYYY-MM-DD (and only so: fromisoformat also takes 20261225); ValueError names `what`."""
    if not isinstance(text, str) or len(text) != 10 or text[4] != "-" or text[7] != "-":
        raise ValueError(f"{what} must be a date YYYY-MM-DD, not {text!r}")
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a date") from None


def normalise(dates: Any) -> list[list[str]]:
    """Days ("YYYY-MM-DD") and ranges ({"from": day, "to": day}, inclusive) as sorted disjoint
    ranges, overlapping and adjacent ones merged; ValueError names the item at fault."""
    if not isinstance(dates, list):
        raise ValueError("dates must be a list of \"YYYY-MM-DD\" days and {\"from\": day, \"to\": day} ranges")
    spans: list[tuple[date, date]] = []
    for i, item in enumerate(dates):
        if isinstance(item, dict):
            if set(item) != {"from", "to"}:
                raise ValueError(f"dates[{i}] must be a day or a range {{\"from\": day, \"to\": day}}")
            first, last = parse_day(item["from"], f"dates[{i}].from"), parse_day(item["to"], f"dates[{i}].to")
            if last < first:
                raise ValueError(f"dates[{i}] ends ({last}) before it starts ({first})")
        else:
            first = last = parse_day(item, f"dates[{i}]")
        spans.append((first, last))
    merged: list[tuple[date, date]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + timedelta(days=1):
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return [[first.isoformat(), last.isoformat()] for first, last in merged]


def local_day(fire_us: int, tz: str) -> str:
    """The day (YYYY-MM-DD) an instant falls on in zone `tz`."""
    utc = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=fire_us)
    return utc.astimezone(cron.zone(tz)).date().isoformat()


def falls_on(calendar: dict[str, Any], fire_us: int) -> bool:
    """Whether the occurrence at `fire_us` falls on a day the calendar lists, in its zone."""
    ranges = calendar["ranges"]
    day = local_day(fire_us, calendar["timezone"])
    i = bisect_right(ranges, day, key=lambda r: r[0]) - 1  # ISO days order as strings
    return i >= 0 and day <= ranges[i][1]


def skips(calendars: Calendars, job: dict[str, Any], fire_us: int) -> bool:
    """Whether the calendar the job names, as the entry carries it, skips this occurrence."""
    name = job.get("skip_calendar")
    calendar = calendars.get(name) if name is not None else None
    return calendar is not None and falls_on(calendar, fire_us)


def carried(state_calendars: Calendars, names: set[str]) -> Calendars:
    """What a claim entry carries of the metadata's calendars: those named, as stored."""
    return {name: {"timezone": state_calendars[name]["timezone"], "ranges": state_calendars[name]["ranges"]}
            for name in sorted(names) if name in state_calendars}


def users(txn: lmdb.Transaction, t: Tables, name: str, limit: int) -> list[str]:
    """Up to `limit` ids of the jobs of this group that name calendar `name` and may still
    claim an occurrence. Reads every job: for a calendar's delete, which is rare."""
    return list(islice(_naming(txn, t, name), limit))


def _naming(txn: lmdb.Transaction, t: Tables, name: str) -> Iterator[str]:
    with txn.cursor(db=t.jobs) as cur:
        for _, raw in cur:
            job = JOBS.unpack(raw)
            if job.get("skip_calendar") == name and job["state"] in USING_STATES:
                yield job["job_id"]

