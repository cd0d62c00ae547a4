"""storage/catchup.py: the missed occurrences a catch-up considers, against a plain walk
of every occurrence in the window."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedulerd.storage import catchup, cron

MIN = 60 * 1_000_000


def us(iso: str) -> int:
    return int(datetime.fromisoformat(iso).replace(tzinfo=timezone.utc).timestamp()) * 1_000_000


def every_occurrence(schedule: dict, fire_us: int, cutoff_us: int) -> list[int]:
    out, t = [], fire_us
    while t is not None and t < cutoff_us:
        out.append(t)
        t = cron.next_after(schedule, t)
    return out


def test_a_cron_dense_only_after_a_long_gap_fires_its_latest_occurrence() -> None:
    # Every minute but in December, down from the last minute of November to March: the
    # first gap is a month, so the first window spans years and holds millions of minutes.
    schedule = cron.check_cron("* * * 1-11 *", "UTC")
    fire, cutoff = us("2025-11-30T23:59:00"), us("2026-03-01T00:00:00")
    found = catchup.missed(schedule, fire, cutoff, 100)
    assert found.recent == [cutoff - k * MIN for k in range(100, 0, -1)]
    assert (found.older_first, found.older_last) == (fire, cutoff - 101 * MIN)
    # Before entry version 9 the scan stopped 20,000 minutes in, in mid-January.
    stopped = catchup.missed(schedule, fire, cutoff, 100, exact=False)
    assert stopped.recent[-1] < us("2026-01-15T00:00:00")


EXPRESSIONS = st.sampled_from(["* * * * *", "* 9-10 * * 1-5", "*/7 * 1,15 * *", "* * * 1-11 *", "0,1,2 3 * * *",
                               "*/20 * * * * *", "* 0 1 * *"])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(expr=EXPRESSIONS, zone=st.sampled_from(["UTC", "Europe/Berlin"]),
       start_min=st.integers(0, 400 * 24 * 60), length_min=st.integers(1, 20 * 24 * 60),
       limit=st.sampled_from([1, 2, 5, 20]))
def test_missed_is_the_newest_occurrences_and_a_count_of_the_rest(monkeypatch: pytest.MonkeyPatch, expr: str,
                                                                 zone: str, start_min: int, length_min: int,
                                                                 limit: int) -> None:
    # Small caps, so that windows past them (and their narrowing) come up in every run.
    monkeypatch.setattr(catchup, "WINDOW_STEPS_MAX", 60)
    monkeypatch.setattr(catchup, "COUNT_STEPS_MAX", 300)
    schedule = cron.check_cron(expr, zone)
    fire = cron.next_after(schedule, us("2025-01-01T00:00:00") + start_min * MIN - 1)
    cutoff = fire + length_min * MIN
    walked = every_occurrence(schedule, fire, cutoff)
    found = catchup.missed(schedule, fire, cutoff, limit)
    assert found.recent == walked[-limit:]
    older = walked[:-limit]
    if not older:
        assert (found.older_first, found.older_last, found.older_count) == (None, None, 0)
        return
    assert (found.older_first, found.older_last) == (older[0], older[-1])
    assert found.older_count == len(older) or (found.older_count is None and len(older) > 300)
