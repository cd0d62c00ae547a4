"""The scheduling rules of issue 3, each decided in apply: misfires, overlap,
deadlines, retries and timeouts, lifecycle, idempotency, jitter, history."""
from __future__ import annotations

import pathlib

import msgpack
import pytest

from schedulerd.storage import keys, ops
from schedulerd.storage.layouts import RUNS
from schedulerd.storage.model import JobState, RunState
from schedulerd.storage.ops import Op
from schedulerd.timefmt import from_iso
from tests.unit.fsm_driver import S, T0, Driver

EVERY5 = {"kind": "every", "every_us": 5 * S, "anchor_us": T0}


@pytest.fixture
def d(tmp_path: pathlib.Path) -> Driver:
    return Driver(str(tmp_path / "db"))


def states(d: Driver, job_id: str) -> list[tuple[int, str, str | None]]:
    return [((r["scheduled_us"] - T0) // S, r["state"], r.get("reason")) for r in d.runs(job_id)]


# --- misfires -----------------------------------------------------------------

def test_fire_once_runs_the_latest_missed_and_records_the_rest(d: Driver) -> None:
    d.create("e", EVERY5)  # default misfire_policy fire_once
    d.claim_due(T0 + 100 * S)  # cutoff T0+95: occurrences 5..90 were missed
    got = states(d, "e")
    assert got[-1] == (90, "queued", None)
    assert got[:-1] == [(t, "skipped", "misfire_skip") for t in range(5, 90, 5)]
    assert d.job("e")["next_fire_us"] == T0 + 95 * S


def test_fire_all_runs_every_missed_occurrence_smeared(d: Driver) -> None:
    d.create("e", EVERY5, misfire_policy="fire_all")
    d.claim_due(T0 + 100 * S)
    runs = d.runs("e")
    assert [r["state"] for r in runs] == ["queued"] * 18
    released = [r["available_us"] for r in runs]
    assert released == sorted(released) and len(set(released)) == 18
    assert all(b - a == 100_000 for a, b in zip(released, released[1:]))
    assert T0 + 100 * S <= released[0] < T0 + 101 * S


def test_skip_runs_nothing_missed_but_says_so(d: Driver) -> None:
    d.create("e", EVERY5, misfire_policy="skip")
    assert d.claim_due(T0 + 100 * S) == []
    assert {s for _, s, _ in states(d, "e")} == {"skipped"}
    assert d.job("e")["next_fire_us"] == T0 + 95 * S


def test_catchup_limit_summarises_older_missed_occurrences(d: Driver) -> None:
    d.create("e", EVERY5, misfire_policy="fire_all", catchup_limit=5)
    d.claim_due(T0 + 100 * S)
    runs = d.runs("e")
    summary = runs[0]
    assert summary["state"] == RunState.SKIPPED and summary["reason"] == "catchup_limit"
    assert summary["scheduled_us"] == T0 + 5 * S and summary["skipped_until_us"] == T0 + 65 * S
    assert summary["skipped_count"] == 13
    assert [((r["scheduled_us"] - T0) // S, r["state"]) for r in runs[1:]] == \
        [(t, "queued") for t in (70, 75, 80, 85, 90)]


def test_a_long_outage_does_not_flood_history(d: Driver) -> None:
    d.create("e", {"kind": "cron", "cron": "*/1 * * * * *", "timezone": "UTC", "seconds": True})
    d.claim_due(T0 + 86_400 * S)  # a day of every-second occurrences missed
    runs = d.runs("e")
    assert len(runs) == 101  # one summary + catchup_limit (100) considered
    assert runs[0]["reason"] == "catchup_limit" and runs[0]["skipped_count"] is None  # too many to count
    assert [r["state"] for r in runs].count("queued") == 1  # fire_once


@pytest.mark.parametrize("version, latest", [(9, "2026-02-28T23:59:00"), (8, "2026-01-14T21:18:00")])
def test_a_catch_up_over_a_window_too_dense_to_walk_fires_the_latest(d: Driver, version: int, latest: str) -> None:
    # Every minute but in December, missed from the last minute of November to March.
    # The scan window grows from the first gap (a month) to years of minutes; from
    # version 9 it is narrowed to the newest, before it was cut 20,000 minutes in.
    d.create("m", {"kind": "cron", "cron": "* * * 1-11 *", "timezone": "UTC", "seconds": False},
             now=from_iso("2025-11-30T23:58:30Z"))
    (queued,) = d.apply(Op.CLAIM_BATCH, version=version, now=from_iso("2026-03-01T00:00:05Z"), grace_us=5 * S,
                        claims=[["m", from_iso("2025-11-30T23:59:00Z")]])["runs"]
    assert d.run(queued)["scheduled_us"] == from_iso(latest + "Z")
    assert d.job("m")["next_fire_us"] == from_iso("2026-03-01T00:00:00Z")


def test_late_within_grace_just_runs_late(d: Driver) -> None:
    d.create("e", EVERY5)
    d.claim_due(T0 + 8 * S)  # the T0+5 occurrence is 3 s late, under the 5 s grace
    assert states(d, "e") == [(5, "queued", None)]
    assert d.job("e")["next_fire_us"] == T0 + 10 * S


def test_one_off_missed_with_skip_policy_is_skipped(d: Driver) -> None:
    d.create("a", {"kind": "at", "at_us": T0}, misfire_policy="skip")
    d.claim_due(T0 + 60 * S)
    assert states(d, "a") == [(0, "skipped", "misfire_skip")]
    assert d.job("a")["state"] == JobState.COMPLETED


# --- deadlines, overlap ----------------------------------------------------------

def test_starting_deadline_at_claim_and_at_lease(d: Driver) -> None:
    d.create("a", {"kind": "at", "at_us": T0 + 10 * S}, starting_deadline_us=2 * S)
    d.claim_due(T0 + 13 * S)  # 3 s late: past the 2 s deadline, under the misfire grace
    assert states(d, "a") == [(10, "skipped", "deadline")]
    d.create("b", {"kind": "at", "at_us": T0 + 10 * S}, starting_deadline_us=2 * S)
    (run_id,) = d.apply(Op.CLAIM_BATCH, now=T0 + 9 * S, claims=[["b", T0 + 10 * S]])["runs"]
    assert d.lease(T0 + 13 * S, run_ids=[run_id]) == []
    assert d.run(run_id)["state"] == RunState.SKIPPED and d.run(run_id)["reason"] == "deadline"


def test_starting_deadline_is_the_jobs_at_claim_time(d: Driver) -> None:
    """A run whose time has come keeps its job's definition (update_job): the deadline too."""
    d.create("a", {"kind": "at", "at_us": T0 + 10 * S}, starting_deadline_us=2 * S)
    (run_id,) = d.apply(Op.CLAIM_BATCH, now=T0 + 10 * S, claims=[["a", T0 + 10 * S]])["runs"]
    assert d.apply(Op.UPDATE_JOB, now=T0 + 10 * S + 1, job_id="a",
                   changes={"starting_deadline_us": 60 * S})["ok"]
    assert d.lease(T0 + 13 * S, run_ids=[run_id]) == []
    assert d.run(run_id)["reason"] == "deadline"


def test_a_run_claimed_without_its_own_deadline_uses_the_jobs(d: Driver) -> None:
    """Runs claimed by a build that did not copy the deadline onto the run still honour it."""
    d.create("a", {"kind": "at", "at_us": T0 + 10 * S}, starting_deadline_us=2 * S)
    (run_id,) = d.apply(Op.CLAIM_BATCH, now=T0 + 9 * S, claims=[["a", T0 + 10 * S]])["runs"]
    with d.store.env.begin(write=True) as txn:
        run = RUNS.unpack(txn.get(keys.run_key(run_id), db=d.store.tables.runs))
        del run["starting_deadline_us"]
        txn.put(keys.run_key(run_id), msgpack.packb(run, use_bin_type=True), db=d.store.tables.runs)
    assert d.lease(T0 + 13 * S, run_ids=[run_id]) == []
    assert d.run(run_id)["reason"] == "deadline"


def test_overlap_skip_records_skipped_runs_while_one_is_open(d: Driver) -> None:
    d.create("e", EVERY5, overlap_policy="skip", max_attempts=1)
    d.claim_due(T0 + 5 * S)
    d.claim_due(T0 + 10 * S)
    assert states(d, "e") == [(5, "queued", None), (10, "skipped", "overlap")]
    (task,) = d.lease(T0 + 10 * S)
    d.claim_due(T0 + 15 * S)
    assert states(d, "e")[-1] == (15, "skipped", "overlap")
    # A worker that vanished does not block the job forever: its lease expires.
    d.apply(Op.EXPIRE_LEASES, now=task["lease_until_us"], runs=[[task["run_id"], task["fence"]]])
    d.claim_due(task["lease_until_us"])
    assert states(d, "e")[-1][1] == "queued"


def test_overlap_buffer_one_keeps_one_pending(d: Driver) -> None:
    d.create("e", EVERY5, overlap_policy="buffer_one")
    d.claim_due(T0 + 5 * S)
    d.lease(T0 + 5 * S)
    d.claim_due(T0 + 10 * S)
    d.claim_due(T0 + 15 * S)
    assert states(d, "e") == [(5, "running", None), (10, "queued", None), (15, "skipped", "overlap")]


# --- retries, timeouts, dead letters -------------------------------------------

def test_backoff_comes_from_the_job(d: Driver) -> None:
    d.create("a", {"kind": "at", "at_us": T0}, backoff={"base_ms": 10_000, "factor": 3.0, "max_ms": 60_000})
    d.claim_due(T0)
    (task,) = d.lease(T0)
    run = d.apply(Op.NACK, now=T0 + S, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="x")["run"]
    assert T0 + S + 8 * S <= run["available_us"] <= T0 + S + 12 * S


def test_timeout_caps_an_attempt_even_with_heartbeats(d: Driver) -> None:
    d.create("a", {"kind": "at", "at_us": T0}, timeout_us=10 * S)
    d.claim_due(T0)
    (task,) = d.lease(T0)
    assert task["lease_until_us"] == T0 + 10 * S
    hb = d.apply(Op.HEARTBEAT, now=T0 + 5 * S, worker_id="w", lease_until=T0 + 35 * S,
                 leases=[[task["run_id"], task["fence"]]])
    assert hb["results"][0]["lease_until_us"] == T0 + 10 * S
    d.apply(Op.EXPIRE_LEASES, now=T0 + 10 * S, runs=[[task["run_id"], task["fence"]]])
    run = d.run(task["run_id"])
    assert run["state"] == RunState.RETRY_WAIT and run["reason"] == "timeout"
    late = d.apply(Op.ACK, now=T0 + 11 * S, worker_id="w", acks=[[task["run_id"], task["fence"], None]])
    assert late["results"][0]["code"] == "stale_fence"


def test_dead_letter_is_listed_and_can_be_redriven(d: Driver) -> None:
    from schedulerd.storage import queries
    d.create("a", {"kind": "at", "at_us": T0}, max_attempts=1)
    d.claim_due(T0)
    (task,) = d.lease(T0)
    d.apply(Op.NACK, now=T0 + S, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="bad")
    with d.store.read() as txn:
        listed, _ = queries.dead_letters(txn, d.store.tables, queue=None, limit=10, after=None, scan_max=100)
    assert [r["run_id"] for r in listed] == [task["run_id"]] and listed[0]["reason"] == "max_attempts"
    res = d.apply(Op.REDRIVE_RUN, now=T0 + 2 * S, run_id=task["run_id"])
    assert res["ok"] and res["run"]["state"] == RunState.QUEUED and res["run"]["max_attempts"] == 2
    with d.store.read() as txn:
        assert queries.dead_letters(txn, d.store.tables, queue=None, limit=10, after=None, scan_max=100)[0] == []
    (again,) = d.lease(T0 + 2 * S)
    assert again["attempt"] == 2
    assert d.apply(Op.REDRIVE_RUN, now=T0 + 3 * S, run_id=task["run_id"])["code"] == "conflict"


# --- lifecycle -------------------------------------------------------------------

def test_pause_stops_occurrences_and_resume_rearms_from_now(d: Driver) -> None:
    d.create("e", EVERY5)
    assert d.apply(Op.PAUSE_JOB, now=T0 + S, job_id="e")["ok"]
    assert d.job("e")["state"] == JobState.PAUSED and d.due(T0 + 1000 * S) == []
    assert d.apply(Op.CLAIM_BATCH, now=T0 + 5 * S, claims=[["e", T0 + 5 * S]])["stale"] == 1
    assert d.apply(Op.RESUME_JOB, now=T0 + 101 * S, job_id="e")["ok"]
    job = d.job("e")
    assert job["state"] == JobState.SCHEDULED and job["next_fire_us"] == T0 + 105 * S
    assert d.runs("e") == []  # nothing from inside the pause was caught up


@pytest.mark.parametrize("policy, outcome", [("fire_once", "queued"), ("skip", "skipped")])
def test_resumed_one_off_whose_time_passed_is_missed_at_its_own_time(d: Driver, policy: str, outcome: str) -> None:
    # Its scheduled time (and so its idempotency key) is the one it was created with;
    # the misfire policy decides whether it runs late.
    d.create("a", {"kind": "at", "at_us": T0 + 10 * S}, misfire_policy=policy)
    d.apply(Op.PAUSE_JOB, now=T0, job_id="a")
    d.apply(Op.RESUME_JOB, now=T0 + 60 * S, job_id="a")
    assert d.job("a")["next_fire_us"] == T0 + 10 * S
    d.claim_due(T0 + 60 * S)
    assert states(d, "a") == [(10, outcome, None if outcome == "queued" else "misfire_skip")]
    assert d.job("a")["state"] == JobState.COMPLETED


def test_before_version_9_a_resumed_one_off_fired_at_the_resume(d: Driver) -> None:
    d.create("a", {"kind": "at", "at_us": T0 + 10 * S})
    d.apply(Op.PAUSE_JOB, now=T0, job_id="a", version=8)
    d.apply(Op.RESUME_JOB, now=T0 + 60 * S, job_id="a", version=8)
    assert d.job("a")["next_fire_us"] == T0 + 60 * S


def test_a_pause_records_what_came_due_before_it_and_was_not_claimed(d: Driver) -> None:
    # The cluster was down from T0+3 s; the pause lands before the leader's first scan.
    d.create("e", EVERY5, catchup_limit=2)
    res = d.apply(Op.PAUSE_JOB, now=T0 + 21 * S, job_id="e")
    assert res["skipped_reasons"] == {"catchup_limit": 1, "paused": 2}
    assert states(d, "e") == [(5, "skipped", "catchup_limit"), (15, "skipped", "paused"),
                              (20, "skipped", "paused")]
    assert d.runs("e")[0]["skipped_count"] == 2
    d.apply(Op.RESUME_JOB, now=T0 + 40 * S, job_id="e")
    assert d.job("e")["next_fire_us"] == T0 + 45 * S and len(d.runs("e")) == 3
    # A one-off keeps its passed time for the resume instead (above); at version 8 nothing was recorded.
    d.create("f", EVERY5)
    assert d.apply(Op.PAUSE_JOB, now=T0 + 21 * S, job_id="f", version=8)["ok"] and d.runs("f") == []


def test_a_schedule_patch_records_the_old_schedules_overdue_occurrences(d: Driver) -> None:
    d.create("e", EVERY5)
    new = {"kind": "every", "every_us": 60 * S}
    assert d.apply(Op.UPDATE_JOB, now=T0 + 12 * S, job_id="e", changes={"schedule": new})["skipped_reasons"] == {
        "rescheduled": 2}
    assert states(d, "e") == [(5, "skipped", "rescheduled"), (10, "skipped", "rescheduled")]
    assert d.job("e")["next_fire_us"] == T0 + 72 * S
    # A PATCH that keeps a passed one-off's time skips nothing: it is still to be claimed, as missed.
    d.create("a", {"kind": "at", "at_us": T0 + 2 * S})
    same = {"kind": "at", "at_us": T0 + 2 * S}
    assert d.apply(Op.UPDATE_JOB, now=T0 + 30 * S, job_id="a", changes={"schedule": same})["skipped_reasons"] == {}
    d.claim_due(T0 + 30 * S)
    assert states(d, "a") == [(2, "queued", None)]
    # Moved to a later time, the passed one is recorded and the new one runs.
    d.create("b", {"kind": "at", "at_us": T0 + 2 * S})
    later = {"kind": "at", "at_us": T0 + 90 * S}
    d.apply(Op.UPDATE_JOB, now=T0 + 30 * S, job_id="b", changes={"schedule": later, "priority": 1})
    d.claim_due(T0 + 90 * S)
    assert states(d, "b") == [(2, "skipped", "rescheduled"), (90, "queued", None)]


def test_lifecycle_on_cancelled_and_unknown_jobs(d: Driver) -> None:
    d.create("e", EVERY5)
    d.apply(Op.CANCEL_JOB, now=T0, job_id="e")
    for op in (Op.PAUSE_JOB, Op.RESUME_JOB, Op.TRIGGER_JOB):
        assert d.apply(op, now=T0, job_id="e")["code"] == "conflict"
    assert d.apply(Op.UPDATE_JOB, now=T0, job_id="e", changes={"priority": 3})["code"] == "conflict"
    assert d.apply(Op.PAUSE_JOB, now=T0, job_id="nope")["code"] == "not_found"


def test_update_recomputes_next_fire_and_keeps_claimed_runs(d: Driver) -> None:
    d.create("e", EVERY5)
    (run_id,) = d.claim_due(T0 + 5 * S)
    new = {"kind": "every", "every_us": 60 * S, "anchor_us": T0 + 6 * S}
    assert d.apply(Op.UPDATE_JOB, now=T0 + 6 * S, job_id="e",
                   changes={"schedule": new, "payload_json": '"v2"'})["ok"]
    job = d.job("e")
    assert job["next_fire_us"] == T0 + 66 * S and job["payload_json"] == '"v2"'
    assert d.run(run_id)["state"] == RunState.QUEUED
    assert d.due(T0 + 65 * S) == []


def test_update_rearms_a_completed_one_off(d: Driver) -> None:
    d.create("a", {"kind": "at", "at_us": T0})
    d.claim_due(T0)
    assert d.job("a")["state"] == JobState.COMPLETED
    d.apply(Op.UPDATE_JOB, now=T0 + S, job_id="a", changes={"schedule": {"kind": "at", "at_us": T0 + 50 * S}})
    assert d.job("a")["state"] == JobState.SCHEDULED and d.job("a")["next_fire_us"] == T0 + 50 * S


def test_updates_of_different_backoff_parts_both_land(d: Driver) -> None:
    """Two PATCHes read the same backoff and each sends only its part: apply completes
    each from the job as stored then, so the second keeps the first's change."""
    d.create("a", EVERY5)
    assert d.apply(Op.UPDATE_JOB, now=T0 + S, job_id="a", changes={"backoff": {"factor": 3.0}})["ok"]
    assert d.apply(Op.UPDATE_JOB, now=T0 + S, job_id="a", changes={"backoff": {"base_ms": 500}})["ok"]
    assert d.job("a")["backoff"] == {"base_ms": 500, "factor": 3.0, "max_ms": 300_000}


def test_a_backoff_part_that_breaks_the_stored_backoff_is_refused_whole(d: Driver) -> None:
    """max_ms below the base_ms another update stored meanwhile: refused, nothing changes,
    the other fields of the same update included."""
    d.create("a", EVERY5, backoff={"base_ms": 1000, "factor": 2.0, "max_ms": 300_000})
    assert d.apply(Op.UPDATE_JOB, now=T0 + S, job_id="a", changes={"backoff": {"base_ms": 60_000}})["ok"]
    before = d.job("a")
    result = d.apply(Op.UPDATE_JOB, now=T0 + 2 * S, job_id="a",
                     changes={"backoff": {"max_ms": 30_000}, "priority": 7})
    assert result["code"] == "invalid_job" and "backoff.max_ms (30000) must be at least" in result["message"]
    assert d.job("a") == before


def test_an_entry_from_before_backoff_parts_replaces_the_backoff(d: Driver) -> None:
    """Version 5 builds sent the whole backoff; its entries keep meaning that on replay."""
    d.create("a", EVERY5)
    whole = {"base_ms": 200, "factor": 3.0, "max_ms": 1000}
    assert d.apply(Op.UPDATE_JOB, version=5, now=T0 + S, job_id="a", changes={"backoff": whole})["ok"]
    assert d.job("a")["backoff"] == whole


def _claim_ahead(d: Driver, job_id: str, now: int, lookahead: int = 12 * S) -> str:
    """The leader's scan at `now` claims job_id's next occurrence, due within `lookahead`."""
    (run_id,) = d.apply(Op.CLAIM_BATCH, now=now, grace_us=5 * S,
                        claims=[list(item) for item in d.due(now + lookahead) if item[0] == job_id])["runs"]
    assert d.run(run_id)["scheduled_us"] > now
    return run_id


def test_pause_withdraws_an_occurrence_claimed_ahead(d: Driver) -> None:
    d.create("e", EVERY5)
    run_id = _claim_ahead(d, "e", T0 + 2 * S)  # the T0+5 occurrence, 3 s early
    assert d.apply(Op.PAUSE_JOB, now=T0 + 3 * S, job_id="e")["ok"]
    assert d.run(run_id) is None and d.runs("e") == [] and d.ready(T0 + 5 * S) == []
    assert d.job("e")["state"] == JobState.PAUSED and d.due(T0 + 1000 * S) == []
    # Resumed before its time, the occurrence is claimed again, once.
    d.apply(Op.RESUME_JOB, now=T0 + 4 * S, job_id="e")
    assert d.job("e")["next_fire_us"] == T0 + 5 * S
    d.claim_due(T0 + 5 * S)
    assert states(d, "e") == [(5, "queued", None)]


def test_pause_of_a_one_off_claimed_ahead_is_a_pause_not_a_conflict(d: Driver) -> None:
    d.create("a", {"kind": "at", "at_us": T0 + 10 * S})
    _claim_ahead(d, "a", T0 + 7 * S)
    assert d.job("a")["state"] == JobState.COMPLETED
    assert d.apply(Op.PAUSE_JOB, now=T0 + 8 * S, job_id="a")["ok"]
    assert d.job("a")["state"] == JobState.PAUSED and d.runs("a") == []
    d.apply(Op.RESUME_JOB, now=T0 + 20 * S, job_id="a")  # it never ran: it runs late, as missed, not never
    assert d.job("a")["next_fire_us"] == T0 + 10 * S
    d.claim_due(T0 + 20 * S)
    assert states(d, "a") == [(10, "queued", None)]


def test_update_reclaims_an_occurrence_claimed_ahead_with_the_new_definition(d: Driver) -> None:
    d.create("e", EVERY5)
    d.apply(Op.TRIGGER_JOB, now=T0 + 1 * S, job_id="e")
    _claim_ahead(d, "e", T0 + 2 * S)
    assert d.apply(Op.UPDATE_JOB, now=T0 + 3 * S, job_id="e", changes={"priority": 7})["ok"]
    assert states(d, "e") == [(1, "queued", None)]  # the trigger stays: it was asked for now
    assert d.job("e")["next_fire_us"] == T0 + 5 * S
    (run_id,) = d.claim_due(T0 + 5 * S)
    assert d.run(run_id)["priority"] == 7 and d.run(run_id)["scheduled_us"] == T0 + 5 * S


def test_overlap_is_decided_at_the_occurrences_time_not_when_claimed_ahead(d: Driver) -> None:
    d.create("e", EVERY5, overlap_policy="skip")
    (first,) = d.claim_due(T0 + 5 * S)
    (task,) = d.lease(T0 + 5 * S)
    ahead = d.apply(Op.CLAIM_BATCH, now=T0 + 6 * S, claims=[["e", T0 + 10 * S]])  # T0+5 still running
    assert ahead["deferred"] == [["e", T0 + 10 * S]] and ahead["skipped"] == 0
    assert d.job("e")["next_fire_us"] == T0 + 10 * S and len(d.runs("e")) == 1
    d.apply(Op.ACK, now=T0 + 8 * S, worker_id="w", acks=[[first, task["fence"], None]])
    assert d.apply(Op.CLAIM_BATCH, now=T0 + 10 * S, claims=[["e", T0 + 10 * S]])["runs"]
    # At its time, an occurrence whose predecessor is still open is skipped as before.
    d.lease(T0 + 10 * S)
    late = d.apply(Op.CLAIM_BATCH, now=T0 + 15 * S, claims=[["e", T0 + 15 * S]])
    assert late["skipped_reasons"] == {"overlap": 1} and late["deferred"] == []


def test_an_occurrence_already_due_or_leased_is_not_withdrawn(d: Driver) -> None:
    d.create("e", {"kind": "every", "every_us": S, "anchor_us": T0})
    while d.due(T0 + 3 * S):  # one step per claim: T0+1, T0+2 and, ahead, T0+3
        d.claim_due(T0 + 3 * S)
    (task,) = d.lease(T0 + S, run_ids=[d.runs("e")[0]["run_id"]])
    assert d.apply(Op.PAUSE_JOB, now=T0 + 2 * S, job_id="e")["ok"]
    assert states(d, "e") == [(1, "running", None), (2, "queued", None)]
    assert d.run(task["run_id"])["fence"] == task["fence"]


def test_entries_written_at_version_1_keep_the_rules_of_version_1(d: Driver) -> None:
    """A replica replaying the log after an upgrade must end where the others did."""
    d.create("e", EVERY5)
    run_id = _claim_ahead(d, "e", T0 + 2 * S)
    d.apply(Op.PAUSE_JOB, now=T0 + 3 * S, job_id="e", version=1)
    assert d.run(run_id)["state"] == RunState.QUEUED  # not withdrawn
    d.create("o", EVERY5, overlap_policy="skip")
    d.apply(Op.TRIGGER_JOB, now=T0 + 1 * S, job_id="o")
    ahead = d.apply(Op.CLAIM_BATCH, now=T0 + 2 * S, claims=[["o", T0 + 5 * S]], version=1)
    assert ahead["skipped_reasons"] == {"overlap": 1} and ahead["deferred"] == []  # not deferred


def test_trigger_adds_an_occurrence_with_its_own_key(d: Driver) -> None:
    d.create("e", EVERY5, overlap_policy="skip")
    d.claim_due(T0 + 5 * S)
    first = d.apply(Op.TRIGGER_JOB, now=T0 + 6 * S, job_id="e")["run"]
    second = d.apply(Op.TRIGGER_JOB, now=T0 + 6 * S, job_id="e")["run"]
    assert first["state"] == second["state"] == RunState.QUEUED and first["trigger"]
    assert first["scheduled_us"] == T0 + 6 * S and second["scheduled_us"] == T0 + 6 * S + 1
    assert d.job("e")["next_fire_us"] == T0 + 10 * S


# --- idempotency, jitter, history ---------------------------------------------------

def test_idempotency_key_returns_the_first_job_or_conflicts(d: Driver) -> None:
    spec = {"idempotency_key": "k1", "request_hash": "h1"}
    created = d.create("a", EVERY5, **spec)
    assert (created["job_id"], created["ok"], created["job"]) == ("a", True, d.job("a"))  # as stored
    assert d.create("b", EVERY5, **spec) == {"job_id": "a", "ok": True, "existing": True}
    assert d.create("c", EVERY5, idempotency_key="k1", request_hash="other")["code"] == "conflict"
    assert d.job("b") is None and d.job("c") is None


def test_jitter_is_deterministic_within_bounds_and_before_the_next_occurrence(d: Driver) -> None:
    d.create("j", {"kind": "every", "every_us": 60 * S, "anchor_us": T0}, jitter_us=10 * S)
    (run_id,) = d.apply(Op.CLAIM_BATCH, now=T0 + 59 * S, claims=[["j", T0 + 60 * S]])["runs"]
    offset = d.run(run_id)["available_us"] - (T0 + 60 * S)
    assert 0 <= offset <= 10 * S
    d.create("k", EVERY5, jitter_us=100 * S)
    (run_id,) = d.apply(Op.CLAIM_BATCH, now=T0 + 4 * S, claims=[["k", T0 + 5 * S]])["runs"]
    assert 0 <= d.run(run_id)["available_us"] - (T0 + 5 * S) < 5 * S
    other = Driver(str(d.store.path) + "-replica")
    other.create("j", {"kind": "every", "every_us": 60 * S, "anchor_us": T0}, jitter_us=10 * S)
    (run_id2,) = other.apply(Op.CLAIM_BATCH, now=T0 + 59 * S, claims=[["j", T0 + 60 * S]])["runs"]
    assert other.run(run_id2)["available_us"] - (T0 + 60 * S) == offset


def _offsets_of_jobs_jittered_past_their_gap(d: Driver, version: int) -> list[int]:
    """200 jobs every minute with an hour of jitter: each one's start offset past its occurrence."""
    every_minute = {"kind": "every", "every_us": 60 * S, "anchor_us": T0}
    for i in range(200):
        d.create(f"j{i}", every_minute, jitter_us=3600 * S)
    claims = [[f"j{i}", T0 + 60 * S] for i in range(200)]
    runs = d.apply(Op.CLAIM_BATCH, version=version, now=T0 + 59 * S, claims=claims)["runs"]
    return [d.run(run_id)["available_us"] - (T0 + 60 * S) for run_id in runs]


def test_a_jitter_past_the_gap_spreads_starts_over_the_gap(d: Driver) -> None:
    offsets = _offsets_of_jobs_jittered_past_their_gap(d, ops.VERSION)
    assert all(0 <= o < 60 * S for o in offsets)
    # Spread, not piled on the gap's last microsecond: most of the minute's 6-second bins hold some.
    assert len({o // (6 * S) for o in offsets}) == 10 and offsets.count(60 * S - 1) <= 1
    before = _offsets_of_jobs_jittered_past_their_gap(Driver(str(d.store.path) + "-old"), ops.JITTER_WITHIN_GAP_SINCE - 1)
    assert before.count(60 * S - 1) > 190  # what entries of older versions still do on replay


def test_a_bounded_interval_starts_at_its_start_and_completes_after_its_end(d: Driver) -> None:
    every = {"kind": "every", "every_us": 5 * S, "anchor_us": 0, "start_us": T0 + 12 * S, "end_us": T0 + 27 * S}
    d.create("b", every)
    assert d.job("b")["next_fire_us"] == T0 + 12 * S  # the start, whatever the entry's time
    for now in range(T0 + 12 * S, T0 + 40 * S, 5 * S):
        d.claim_due(now)
    assert [r["scheduled_us"] - T0 for r in d.runs("b")] == [12 * S, 17 * S, 22 * S, 27 * S]
    assert d.job("b")["state"] == "completed" and d.job("b")["next_fire_us"] is None


def test_a_bounded_cron_has_no_occurrence_outside_its_bounds(d: Driver) -> None:
    daily = {"kind": "cron", "cron": "0 2 * * *", "timezone": "UTC", "seconds": False}
    start, end = from_iso("2027-01-10T00:00:00Z"), from_iso("2027-01-12T02:00:00Z")
    d.create("c", {**daily, "start_us": start, "end_us": end}, now=from_iso("2027-01-01T00:00:00Z"))
    assert d.job("c")["next_fire_us"] == from_iso("2027-01-10T02:00:00Z")
    fired = []
    for day in ("10", "11", "12"):
        now = from_iso(f"2027-01-{day}T02:00:00Z")
        fired += d.claim_due(now)
    assert len(fired) == 3  # the end is inclusive: 02:00 on the 12th is the last
    assert d.job("c")["state"] == "completed"


def test_a_resume_past_the_end_completes_the_job(d: Driver) -> None:
    d.create("p", {"kind": "every", "every_us": 5 * S, "anchor_us": 0, "start_us": T0, "end_us": T0 + 10 * S})
    d.apply(Op.PAUSE_JOB, now=T0 + S, job_id="p")
    d.apply(Op.RESUME_JOB, now=T0 + 11 * S, job_id="p")
    assert (d.job("p")["state"], d.job("p")["next_fire_us"]) == ("completed", None)


def test_a_limited_job_completes_after_max_runs_and_skips_and_triggers_do_not_count(d: Driver) -> None:
    d.create("m", EVERY5, max_runs=3, overlap_policy="skip")
    d.apply(Op.TRIGGER_JOB, now=T0 + S, job_id="m")  # an extra run: not one of the three
    d.claim_due(T0 + 5 * S)  # skipped: the trigger's run is still open
    (task,) = d.lease(T0 + 5 * S)
    d.apply(Op.ACK, now=T0 + 6 * S, worker_id="w", acks=[[task["run_id"], task["fence"], None]])
    for k in (2, 3, 4, 5):
        now = T0 + 5 * k * S
        d.claim_due(now)
        for task in d.lease(now):
            d.apply(Op.ACK, now=now, worker_id="w", acks=[[task["run_id"], task["fence"], None]])
    scheduled = [(r["scheduled_us"] - T0, r["state"]) for r in d.runs("m") if not r["trigger"]]
    assert scheduled == [(5 * S, "skipped"), (10 * S, "succeeded"), (15 * S, "succeeded"), (20 * S, "succeeded")]
    assert (d.job("m")["state"], d.job("m")["next_fire_us"], d.job("m")["runs_made"]) == ("completed", None, 3)


def test_a_catch_up_makes_no_more_runs_than_the_limit_leaves(d: Driver) -> None:
    d.create("c", EVERY5, max_runs=2, misfire_policy="fire_all", catchup_limit=10)
    runs = d.claim_due(T0 + 60 * S)  # eleven missed occurrences
    assert len(runs) == 2 and [d.run(r)["scheduled_us"] - T0 for r in runs] == [5 * S, 10 * S]
    assert d.job("c")["state"] == "completed" and len(d.runs("c")) == 2  # none recorded past the limit


def test_a_patch_of_max_runs_completes_or_rearms_and_a_withdrawn_run_is_uncounted(d: Driver) -> None:
    d.create("p", EVERY5, max_runs=2)
    d.claim_due(T0 + 5 * S)
    d.apply(Op.CLAIM_BATCH, now=T0 + 6 * S, claims=[["p", T0 + 10 * S]])  # claimed ahead: counted
    assert d.job("p")["state"] == "completed"
    d.apply(Op.PAUSE_JOB, now=T0 + 7 * S, job_id="p")  # withdraws it: uncounted, re-armed, paused
    assert (d.job("p")["state"], d.job("p")["runs_made"]) == ("paused", 1)
    d.apply(Op.RESUME_JOB, now=T0 + 8 * S, job_id="p")
    d.apply(Op.UPDATE_JOB, now=T0 + 8 * S, job_id="p", changes={"max_runs": 1})
    assert (d.job("p")["state"], d.job("p")["next_fire_us"]) == ("completed", None)
    d.apply(Op.UPDATE_JOB, now=T0 + 9 * S, job_id="p", changes={"max_runs": None})
    assert (d.job("p")["state"], d.job("p")["next_fire_us"]) == ("scheduled", T0 + 10 * S)


def test_history_keeps_the_newest_terminal_runs_and_all_dead_letters(d: Driver) -> None:
    d.create("e", EVERY5, history_limit=3, max_attempts=1)
    for k in range(1, 8):
        now = T0 + 5 * k * S
        d.claim_due(now)
        (task,) = d.lease(now)
        if k == 1:
            d.apply(Op.NACK, now=now, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="x")
        else:
            d.apply(Op.ACK, now=now, worker_id="w", acks=[[task["run_id"], task["fence"], None]])
    kept = states(d, "e")
    assert kept[0] == (5, "dead_letter", "max_attempts")
    # Older terminal runs are pruned to make room before each new occurrence.
    assert [t for t, _, _ in kept[1:]] == [25, 30, 35]


def test_catch_up_over_an_occurrence_a_trigger_already_took(d: Driver) -> None:
    d.create("e", EVERY5)
    d.apply(Op.TRIGGER_JOB, now=T0 + 10 * S, job_id="e")  # lands exactly on the T0+10 occurrence
    d.claim_due(T0 + 100 * S)
    assert d.job("e")["next_fire_us"] == T0 + 95 * S
    times = [r["scheduled_us"] for r in d.runs("e")]
    assert len(times) == len(set(times))


def test_history_never_drops_an_occurrence_still_ahead(d: Driver) -> None:
    d.create("e", {"kind": "every", "every_us": S, "anchor_us": T0}, history_limit=1)
    for ahead in (1, 2, 3):  # claimed ahead, each claim making room for the next run
        d.apply(Op.CLAIM_BATCH, now=T0, claims=[["e", T0 + ahead * S]])
    assert [r["scheduled_us"] for r in d.runs("e")] == [T0 + S, T0 + 2 * S, T0 + 3 * S]


def test_an_interval_counts_from_the_creating_entry(d: Driver) -> None:
    d.create("e", {"kind": "every", "every_us": S, "anchor_us": T0 - 3_000}, now=T0)
    job = d.job("e")
    assert job["created_us"] == T0 and job["next_fire_us"] == T0 + S


def test_a_pause_over_a_triggered_occurrence_puts_its_catch_up_summary_after_it(d: Driver) -> None:
    """The summary of the occurrences beyond catchup_limit once took the first of them even
    when a trigger's run held it: the occurrence claimed twice stopped the group."""
    d.create("e", EVERY5, catchup_limit=1)
    assert d.apply(Op.TRIGGER_JOB, now=T0 + 5 * S, job_id="e")["ok"]  # lands on the 5 s occurrence
    result = d.apply(Op.PAUSE_JOB, now=T0 + 30 * S, job_id="e")
    assert result["ok"]
    summary = next(r for r in d.runs("e") if r["reason"] == "catchup_limit")
    assert summary["scheduled_us"] == T0 + 10 * S and summary["skipped_until_us"] == T0 + 25 * S
