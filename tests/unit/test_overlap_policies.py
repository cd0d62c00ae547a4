"""Overlap policies that hold or replace runs (storage/overlap.py), one run's cancel
(storage/run_cancel.py) and pause_on_failure, each decided in apply."""
from __future__ import annotations

import pathlib
from typing import Any

import pytest

from schedulerd.storage import overlap
from schedulerd.storage.model import JobState, RunState
from schedulerd.storage.ops import Op
from tests.unit.fsm_driver import S, T0, Driver

EVERY5 = {"kind": "every", "every_us": 5 * S, "anchor_us": T0}


@pytest.fixture
def d(tmp_path: pathlib.Path) -> Driver:
    return Driver(str(tmp_path / "db"))


def states(d: Driver, job_id: str) -> list[tuple[int, str, str | None, bool]]:
    """Each run as (seconds after T0 it was scheduled, state, reason, buffered), oldest first."""
    return sorted(((r["scheduled_us"] - T0) // S, r["state"], r.get("reason"), r.get("buffered", False))
                  for r in d.runs(job_id))


def ack(d: Driver, task: dict[str, Any], now: int) -> dict[str, Any]:
    return d.apply(Op.ACK, now=now, worker_id="w", acks=[[task["run_id"], task["fence"], "null"]])["results"][0]


def heartbeat(d: Driver, task: dict[str, Any], now: int) -> dict[str, Any]:
    return d.apply(Op.HEARTBEAT, now=now, lease_until=now + 30 * S, worker_id="w",
                   leases=[[task["run_id"], task["fence"]]])["results"][0]


# --- buffer_one, buffer_all -----------------------------------------------------

def test_buffer_one_waits_behind_the_running_run_and_skips_a_second(d: Driver) -> None:
    d.create("e", EVERY5, overlap_policy="buffer_one")
    d.claim_due(T0 + 5 * S)
    (first,) = d.lease(T0 + 5 * S)
    d.claim_due(T0 + 10 * S)
    d.claim_due(T0 + 15 * S)
    assert states(d, "e") == [(5, "running", None, False), (10, "queued", None, True),
                              (15, "skipped", "overlap", False)]
    assert d.ready(T0 + 20 * S) == []  # no worker may lease it beside the running one
    ack(d, first, T0 + 16 * S)
    (released,) = d.ready(T0 + 16 * S)
    assert d.run(released)["scheduled_us"] == T0 + 10 * S and not d.run(released).get("buffered")
    assert d.run(released)["available_us"] == T0 + 16 * S
    assert d.stored_stats("e") == {"pending": 1, "running": 0, "runs": 3}  # no buffered count left


def test_buffer_one_before_version_17_let_its_waiting_run_be_leased(d: Driver) -> None:
    d.create("e", EVERY5, overlap_policy="buffer_one")
    d.claim_due(T0 + 5 * S)
    d.lease(T0 + 5 * S)
    d.apply(Op.CLAIM_BATCH, version=16, now=T0 + 10 * S, claims=[["e", T0 + 10 * S]])
    assert len(d.ready(T0 + 10 * S)) == 1


def test_buffer_all_runs_every_occurrence_one_after_another_in_order(d: Driver) -> None:
    d.create("e", EVERY5, overlap_policy="buffer_all")
    d.claim_due(T0 + 5 * S)
    (task,) = d.lease(T0 + 5 * S)
    for t in (10, 15, 20):
        d.claim_due(T0 + t * S)
    assert [s[3] for s in states(d, "e")] == [False, True, True, True]
    ran = [task["scheduled_us"]]
    for step in range(3):
        now = T0 + (21 + step) * S
        ack(d, task, now)
        (task,) = d.lease(now)  # exactly one becomes leasable each time
        ran.append(task["scheduled_us"])
    assert ran == [T0 + t * S for t in (5, 10, 15, 20)]
    assert all(not s[3] for s in states(d, "e"))


def test_buffer_all_skips_past_its_limit(d: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(overlap, "BUFFERED_MAX", 2)
    d.create("e", EVERY5, overlap_policy="buffer_all")
    d.claim_due(T0 + 5 * S)
    d.lease(T0 + 5 * S)
    for t in (10, 15, 20):
        d.claim_due(T0 + t * S)
    assert states(d, "e")[-1] == (20, "skipped", "overlap", False)


def test_a_retry_keeps_the_buffered_run_waiting_and_a_dead_letter_releases_it(d: Driver) -> None:
    d.create("e", EVERY5, overlap_policy="buffer_one", max_attempts=2, backoff={"base_ms": 1000, "factor": 1.0,
                                                                                 "max_ms": 1000})
    d.claim_due(T0 + 5 * S)
    (task,) = d.lease(T0 + 5 * S)
    d.claim_due(T0 + 10 * S)
    d.apply(Op.NACK, now=T0 + 11 * S, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="x")
    (retry,) = d.lease(T0 + 13 * S)  # only the retry is leasable
    assert retry["run_id"] == task["run_id"]
    d.apply(Op.NACK, now=T0 + 14 * S, worker_id="w", run_id=retry["run_id"], fence=retry["fence"], error="x")
    assert d.run(task["run_id"])["state"] == RunState.DEAD_LETTER
    (released,) = d.lease(T0 + 14 * S)
    assert released["scheduled_us"] == T0 + 10 * S


def test_patching_away_from_a_buffering_policy_releases_every_buffered_run(d: Driver) -> None:
    d.create("e", EVERY5, overlap_policy="buffer_all")
    d.claim_due(T0 + 5 * S)
    d.lease(T0 + 5 * S)
    d.claim_due(T0 + 10 * S)
    d.claim_due(T0 + 15 * S)
    assert d.apply(Op.UPDATE_JOB, now=T0 + 16 * S, job_id="e", changes={"overlap_policy": "allow"})["ok"]
    assert len(d.ready(T0 + 16 * S)) == 2


def test_cancelling_the_job_cancels_its_buffered_runs(d: Driver) -> None:
    d.create("e", EVERY5, overlap_policy="buffer_all")
    d.claim_due(T0 + 5 * S)
    d.lease(T0 + 5 * S)
    d.claim_due(T0 + 10 * S)
    assert d.apply(Op.CANCEL_JOB, now=T0 + 11 * S, job_id="e")["cancelled_runs"] == 1
    assert states(d, "e")[1] == (10, "cancelled", "job_cancelled", False)
    assert "buffered" not in d.stored_stats("e")


# --- cancel_other -----------------------------------------------------------------

def test_cancel_other_cancels_the_running_run_and_runs_the_new_occurrence(d: Driver) -> None:
    d.create("e", EVERY5, overlap_policy="cancel_other")
    d.claim_due(T0 + 5 * S)
    (old,) = d.lease(T0 + 5 * S)
    (new_run,) = d.claim_due(T0 + 10 * S)
    assert states(d, "e") == [(5, "cancelled", "overlap", False), (10, "queued", None, False)]
    beat = heartbeat(d, old, T0 + 11 * S)
    assert beat["code"] == "stale_fence" and "was cancelled (overlap)" in beat["message"]
    assert ack(d, old, T0 + 12 * S)["code"] == "stale_fence"  # its late ack is refused
    assert d.ready(T0 + 12 * S) == [new_run]


def test_cancel_other_is_not_decided_ahead_of_the_occurrences_time(d: Driver) -> None:
    d.create("e", EVERY5, overlap_policy="cancel_other")
    d.claim_due(T0 + 5 * S)
    (old,) = d.lease(T0 + 5 * S)
    ahead = d.apply(Op.CLAIM_BATCH, now=T0 + 9 * S, claims=[["e", T0 + 10 * S]])
    assert ahead["deferred"] == [["e", T0 + 10 * S]] and d.run(old["run_id"])["state"] == RunState.RUNNING
    ack(d, old, T0 + 9 * S + S // 2)  # done before the next occurrence: nothing is cancelled
    d.claim_due(T0 + 10 * S)
    assert [s[1] for s in states(d, "e")] == ["succeeded", "queued"]


# --- one run's cancel -----------------------------------------------------------

def test_cancel_run_stops_a_queued_run_at_once(d: Driver) -> None:
    d.create("a", {"kind": "at", "at_us": T0})
    (run_id,) = d.claim_due(T0)
    result = d.apply(Op.CANCEL_RUN, now=T0 + S, run_id=run_id)
    assert result["ok"] and result["run"]["state"] == RunState.CANCELLED and result["run"]["reason"] == "run_cancelled"
    assert d.ready(T0 + S) == []
    repeat = d.apply(Op.CANCEL_RUN, now=T0 + 2 * S, run_id=run_id)
    assert repeat["ok"] and repeat["repeated"] and repeat["run"]["finished_us"] == T0 + S


def test_cancel_run_revokes_a_running_runs_lease(d: Driver) -> None:
    d.create("a", {"kind": "at", "at_us": T0})
    d.claim_due(T0)
    (task,) = d.lease(T0)
    assert d.apply(Op.CANCEL_RUN, now=T0 + S, run_id=task["run_id"])["ok"]
    beat = heartbeat(d, task, T0 + 2 * S)
    assert not beat["ok"] and "was cancelled (run_cancelled)" in beat["message"]
    nack = d.apply(Op.NACK, now=T0 + 3 * S, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="x")
    assert nack["code"] == "stale_fence"
    assert d.run(task["run_id"])["state"] == RunState.CANCELLED
    with d.store.read() as txn:
        assert not list(txn.cursor(db=d.store.tables.leases))  # out of the expiry index


def test_cancel_run_of_a_retry_waiting_run(d: Driver) -> None:
    d.create("a", {"kind": "at", "at_us": T0})
    d.claim_due(T0)
    (task,) = d.lease(T0)
    d.apply(Op.NACK, now=T0 + S, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="x")
    assert d.apply(Op.CANCEL_RUN, now=T0 + 2 * S, run_id=task["run_id"])["ok"]
    assert d.ready(T0 + 3600 * S) == []


def test_cancel_run_refuses_what_is_not_open(d: Driver) -> None:
    d.create("a", {"kind": "at", "at_us": T0}, max_attempts=1)
    d.claim_due(T0)
    (task,) = d.lease(T0)
    d.apply(Op.NACK, now=T0 + S, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="x")
    dead = d.apply(Op.CANCEL_RUN, now=T0 + 2 * S, run_id=task["run_id"])
    assert dead["code"] == "conflict" and "dead letter" in dead["message"]
    d.create("b", {"kind": "at", "at_us": T0})
    d.claim_due(T0)
    (done,) = d.lease(T0)
    ack(d, done, T0 + S)
    finished = d.apply(Op.CANCEL_RUN, now=T0 + 2 * S, run_id=done["run_id"])
    assert finished["code"] == "conflict" and "is succeeded" in finished["message"]
    assert d.apply(Op.CANCEL_RUN, now=T0, run_id="0-99-0")["code"] == "not_found"


def test_cancelling_the_running_run_of_a_buffering_job_releases_the_next(d: Driver) -> None:
    d.create("e", EVERY5, overlap_policy="buffer_one")
    d.claim_due(T0 + 5 * S)
    (task,) = d.lease(T0 + 5 * S)
    d.claim_due(T0 + 10 * S)
    d.apply(Op.CANCEL_RUN, now=T0 + 11 * S, run_id=task["run_id"])
    (released,) = d.lease(T0 + 11 * S)
    assert released["scheduled_us"] == T0 + 10 * S


# --- pause_on_failure -------------------------------------------------------------

def test_a_dead_letter_pauses_a_job_with_pause_on_failure_until_it_is_resumed(d: Driver) -> None:
    d.create("e", EVERY5, max_attempts=1, pause_on_failure=True)
    d.claim_due(T0 + 5 * S)
    (task,) = d.lease(T0 + 5 * S)
    d.apply(Op.NACK, now=T0 + 6 * S, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="boom")
    job = d.job("e")
    assert job["state"] == JobState.PAUSED and job["pause_cause"] == {"run_id": task["run_id"], "at_us": T0 + 6 * S}
    assert d.apply(Op.RESUME_JOB, now=T0 + 7 * S, job_id="e")["ok"]
    assert d.job("e")["state"] == JobState.SCHEDULED and "pause_cause" not in d.job("e")


def test_an_expired_last_attempt_pauses_it_too(d: Driver) -> None:
    d.create("e", EVERY5, max_attempts=1, pause_on_failure=True)
    d.claim_due(T0 + 5 * S)
    (task,) = d.lease(T0 + 5 * S)
    d.apply(Op.EXPIRE_LEASES, now=task["lease_until_us"], runs=[[task["run_id"], task["fence"]]])
    assert d.job("e")["state"] == JobState.PAUSED


def test_without_pause_on_failure_a_dead_letter_leaves_the_job_scheduled(d: Driver) -> None:
    d.create("e", EVERY5, max_attempts=1)
    d.claim_due(T0 + 5 * S)
    (task,) = d.lease(T0 + 5 * S)
    d.apply(Op.NACK, now=T0 + 6 * S, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="boom")
    assert d.job("e")["state"] == JobState.SCHEDULED


def test_a_cancel_other_catch_up_runs_only_the_newest_missed_occurrence(d: Driver) -> None:
    d.create("e", EVERY5, overlap_policy="cancel_other", misfire_policy="fire_all", catchup_limit=3)
    d.claim_due(T0 + 60 * S)  # an outage: the newest three missed occurrences are considered
    newest = [s[1:3] for s in states(d, "e")[-3:]]
    assert newest == [("skipped", "overlap"), ("skipped", "overlap"), ("queued", None)]
