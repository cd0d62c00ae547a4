"""A backfill in apply (storage/backfill.py): a run per occurrence that has none, exactly once."""
from __future__ import annotations

import pathlib

import pytest

from schedulerd.storage import backfill, claims
from schedulerd.storage.model import RunState
from schedulerd.storage.ops import Op
from tests.unit.fsm_driver import S, T0, Driver

EVERY5 = {"kind": "every", "every_us": 5 * S, "anchor_us": T0}


@pytest.fixture
def d(tmp_path: pathlib.Path) -> Driver:
    return Driver(str(tmp_path / "db"))


def paused(d: Driver, job_id: str, **fields: object) -> None:
    """A job paused before its first occurrence: every later one is for a backfill to run."""
    d.create(job_id, EVERY5, **fields)
    d.apply(Op.PAUSE_JOB, now=T0, job_id=job_id)


def fill(d: Driver, job_id: str, times: list[int], now: int, **extra: object) -> dict:
    return d.apply(Op.BACKFILL_JOB, now=now, job_id=job_id, occurrences=times, **extra)


def test_a_backfill_runs_each_occurrence_without_a_run_once_spread_out(d: Driver) -> None:
    d.create("e", EVERY5, starting_deadline_us=S, max_runs=100)
    d.claim_due(T0 + 5 * S)  # 5 s and 10 s ran on schedule
    d.claim_due(T0 + 10 * S)
    d.apply(Op.PAUSE_JOB, now=T0 + 11 * S, job_id="e")  # 15 s and 20 s came while it was paused
    now = T0 + 3600 * S
    result = fill(d, "e", [T0 + t * S for t in (5, 10, 15, 20)], now)
    assert result["existing"] == [T0 + 5 * S, T0 + 10 * S] and len(result["runs"]) == 2
    runs = [d.run(run_id) for run_id in result["runs"]]
    assert [r["scheduled_us"] for r in runs] == [T0 + 15 * S, T0 + 20 * S]
    assert all(r["state"] == RunState.QUEUED and r["starting_deadline_us"] is None for r in runs)  # late on purpose
    assert runs[1]["available_us"] - runs[0]["available_us"] == claims.BACKFILL_SPACING_US
    assert now <= runs[0]["available_us"] < now + claims.BACKFILL_SPREAD_US
    assert d.job("e")["runs_made"] == 2  # an operator's extra runs do not count toward max_runs
    leased = d.lease(now + 2 * S)
    assert {t["run_id"] for t in leased} == set(result["runs"])  # no deadline skips them at lease either
    again = fill(d, "e", [T0 + t * S for t in (15, 20)], now + 3 * S)
    assert again["runs"] == [] and again["existing"] == [T0 + 15 * S, T0 + 20 * S]


def test_a_time_that_is_no_occurrence_or_not_yet_passed_by_the_jobs_claims_is_left(d: Driver) -> None:
    d.create("e", EVERY5)
    d.claim_due(T0 + 5 * S)  # the job's next fire time is now 10 s: the scheduler claims that one
    result = fill(d, "e", [T0 + 5 * S, T0 + 7 * S, T0 + 10 * S], T0 + 60 * S)
    assert result["left"] == [T0 + 7 * S, T0 + 10 * S] and result["existing"] == [T0 + 5 * S]


def test_the_jobs_overlap_policy_applies_unless_the_backfill_names_one(d: Driver) -> None:
    paused(d, "s", overlap_policy="skip")
    result = fill(d, "s", [T0 + t * S for t in (5, 10, 15)], T0 + 60 * S)
    assert len(result["runs"]) == 1 and result["skipped_reasons"] == {"overlap": 2}
    paused(d, "o", overlap_policy="skip")
    assert len(fill(d, "o", [T0 + t * S for t in (5, 10, 15)], T0 + 60 * S, overlap_policy="allow")["runs"]) == 3
    assert d.job("o")["overlap_policy"] == "skip"
    paused(d, "b", overlap_policy="buffer_all")
    made = fill(d, "b", [T0 + t * S for t in (5, 10, 15)], T0 + 60 * S)["runs"]
    assert [bool(d.run(r).get("buffered")) for r in made] == [False, True, True]


def test_a_backfill_of_a_cancelled_or_unknown_job_is_refused(d: Driver) -> None:
    d.create("e", EVERY5)
    d.apply(Op.CANCEL_JOB, now=T0, job_id="e")
    assert fill(d, "e", [T0 + 5 * S], T0 + 60 * S)["code"] == "conflict"
    assert fill(d, "nope", [T0 + 5 * S], T0 + 60 * S)["code"] == "not_found"


def test_occurrences_in_a_range_end_excluded_and_one_over_the_limit() -> None:
    assert backfill.occurrences(EVERY5, T0 + 5 * S, T0 + 20 * S, 10) == [T0 + 5 * S, T0 + 10 * S, T0 + 15 * S]
    assert len(backfill.occurrences(EVERY5, T0, T0 + 3600 * S, 10)) == 11
    one_off = {"kind": "at", "at_us": T0 + 7 * S}
    assert backfill.occurrences(one_off, T0, T0 + 60 * S, 10) == [T0 + 7 * S]
    assert backfill.occurs_at(one_off, T0 + 7 * S) and not backfill.occurs_at(EVERY5, T0 + 7 * S)
