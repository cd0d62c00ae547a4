"""Purging a finished job (and creating its id again), discarding a dead letter, and a
cancel that leaves no phantom history: the state machine's rules, on a temp LMDB."""
from __future__ import annotations

import pathlib
from typing import Any

import pytest

from schedulerd.storage import ops, queries, records, retention
from schedulerd.storage.jobs import SPEC_DEFAULTS
from schedulerd.storage.model import JobState, RunState
from schedulerd.storage.ops import Op
from tests.unit.fsm_driver import S, T0, Driver

AT = {"kind": "at", "at_us": T0 + 10 * S}
EVERY = {"kind": "every", "every_us": 5 * S, "anchor_us": T0}


@pytest.fixture
def d(tmp_path: pathlib.Path) -> Driver:
    return Driver(str(tmp_path / "store"))


def purge(d: Driver, job_id: str, now: int, runs_max: int = 100) -> dict[str, Any]:
    return d.apply(Op.PURGE_JOB, now=now, job_id=job_id, runs_max=runs_max)


def finish(d: Driver, now: int, outcome: str = "ack") -> dict[str, Any]:
    """Lease what is ready at `now` and ack (or nack) each."""
    tasks = d.lease(now)
    for task in tasks:
        if outcome == "ack":
            d.apply(Op.ACK, now=now, worker_id="w", acks=[[task["run_id"], task["fence"], None]])
        else:
            d.apply(Op.NACK, now=now, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="boom")
    return tasks[0] if tasks else {}


def table_sizes(d: Driver) -> dict[str, int]:
    with d.store.read() as txn:
        return {name: txn.stat(getattr(d.store.tables, name))["entries"]
                for name in ("jobs", "due", "runs", "occurrences", "ready", "leases", "job_stats", "dead_letters",
                             "idempotency")}


def test_purge_takes_a_job_its_runs_its_indexes_and_its_idempotency_key(d: Driver) -> None:
    before = table_sizes(d)
    d.create("a", AT, idempotency_key="k-1", request_hash="h")
    d.claim_due(T0 + 10 * S)
    task = finish(d, T0 + 10 * S)
    assert d.job("a")["state"] == JobState.COMPLETED and d.run(task["run_id"])["state"] == RunState.SUCCEEDED
    assert purge(d, "a", T0 + 20 * S) == {"ok": True, "done": True, "deleted_runs": 1}
    assert d.job("a") is None and d.run(task["run_id"]) is None and d.runs("a") == []
    assert table_sizes(d) == before and d.state_counts() == {}


def test_a_purged_id_and_key_can_be_created_again_and_a_stale_ack_is_not_found(d: Driver) -> None:
    d.create("a", AT, idempotency_key="k-1", request_hash="h")
    d.claim_due(T0 + 10 * S)
    (old,) = d.lease(T0 + 10 * S)
    d.apply(Op.NACK, now=T0 + 11 * S, worker_id="w", run_id=old["run_id"], fence=old["fence"], error="x")
    d.apply(Op.CANCEL_JOB, now=T0 + 11 * S, job_id="a")
    assert purge(d, "a", T0 + 12 * S)["done"]
    again = d.create("a", {"kind": "at", "at_us": T0 + 20 * S}, now=T0 + 12 * S, idempotency_key="k-1",
                     request_hash="h2")
    assert again["ok"] and not again.get("existing"), "the key went with the job: this is a new request"
    assert d.stored_stats("a") is None, "no counts linger from the first job"
    d.claim_due(T0 + 20 * S)
    (new,) = d.lease(T0 + 20 * S)
    assert new["run_id"] != old["run_id"]
    # The first job's worker comes back with its old lease.
    stale = d.apply(Op.ACK, now=T0 + 21 * S, worker_id="w", acks=[[old["run_id"], old["fence"], None]])
    assert stale["results"][0]["code"] == "not_found"
    assert d.run(new["run_id"])["state"] == RunState.RUNNING, "the new job's run is untouched"


def test_purge_refuses_a_live_job_and_one_with_runs_still_open(d: Driver) -> None:
    d.create("rec", EVERY)
    assert purge(d, "rec", T0)["code"] == "conflict"
    d.apply(Op.PAUSE_JOB, now=T0, job_id="rec")
    assert purge(d, "rec", T0)["code"] == "conflict"
    d.create("one", AT)
    d.claim_due(T0 + 10 * S)
    assert d.job("one")["state"] == JobState.COMPLETED
    assert "1 run(s) waiting" in purge(d, "one", T0 + 10 * S)["message"]
    (task,) = d.lease(T0 + 10 * S)
    d.apply(Op.CANCEL_JOB, now=T0 + 10 * S, job_id="one")
    assert "1 running" in purge(d, "one", T0 + 10 * S)["message"]
    assert purge(d, "ghost", T0)["code"] == "not_found"
    d.apply(Op.ACK, now=T0 + 11 * S, worker_id="w", acks=[[task["run_id"], task["fence"], None]])
    assert purge(d, "one", T0 + 12 * S)["done"]


def test_a_long_history_is_purged_in_bounded_entries(d: Driver) -> None:
    d.create("rec", EVERY, history_limit=50)
    for k in range(1, 8):
        d.claim_due(T0 + 5 * k * S)
        finish(d, T0 + 5 * k * S)
    d.apply(Op.CANCEL_JOB, now=T0 + 36 * S, job_id="rec")
    assert len(d.runs("rec")) == 7
    steps = []
    while True:
        result = purge(d, "rec", T0 + 40 * S, runs_max=3)
        steps.append(result["deleted_runs"])
        if result["done"]:
            break
    assert steps == [3, 3, 1] and d.job("rec") is None and d.stored_stats("rec") is None
    assert table_sizes(d)["occurrences"] == 0 and d.state_counts() == {}


def test_a_dead_letter_is_discarded_and_nothing_else_is(d: Driver) -> None:
    d.create("a", AT, max_attempts=1)
    d.claim_due(T0 + 10 * S)
    dead = finish(d, T0 + 10 * S, outcome="nack")
    assert d.run(dead["run_id"])["state"] == RunState.DEAD_LETTER
    d.create("b", AT)
    (queued,) = d.claim_due(T0 + 10 * S)
    assert d.apply(Op.DISCARD_RUN, now=T0 + 11 * S, run_id=queued)["code"] == "conflict"
    assert d.apply(Op.DISCARD_RUN, now=T0 + 11 * S, run_id="0-999-0")["code"] == "not_found"
    assert d.apply(Op.DISCARD_RUN, now=T0 + 11 * S, run_id=dead["run_id"])["ok"]
    assert d.run(dead["run_id"]) is None and table_sizes(d)["dead_letters"] == 0
    assert d.job("a")["state"] == JobState.COMPLETED, "the job stays; only the dead letter went"


def test_discarding_a_dead_letter_at_the_head_of_a_history_keeps_pruning_exact(d: Driver) -> None:
    d.create("rec", EVERY, max_attempts=1, history_limit=2)
    dead = []
    for k in range(1, 4):
        d.claim_due(T0 + 5 * k * S)
        dead.append(finish(d, T0 + 5 * k * S, outcome="nack")["run_id"])
    assert d.stored_stats("rec").get("dead_behind"), "pruning skips the dead letters at the head"
    for run_id in dead:
        assert d.apply(Op.DISCARD_RUN, now=T0 + 20 * S, run_id=run_id)["ok"]
    assert "dead_behind" not in d.stored_stats("rec") and d.stored_stats("rec")["runs"] == 0
    for k in range(4, 8):
        d.claim_due(T0 + 5 * k * S)
        finish(d, T0 + 5 * k * S)
    assert len(d.runs("rec")) == 2, "history_limit holds again"


def test_a_cancel_withdraws_what_was_claimed_ahead_instead_of_recording_it(d: Driver) -> None:
    spec = dict(SPEC_DEFAULTS, job_id="a", schedule=AT, schedule_spec={}, queue="q", payload_json="{}")
    made = d.apply(Op.CREATE_JOBS, now=T0, jobs=[spec], claim_ahead_us=12 * S, grace_us=5 * S)
    assert made["runs"], "claimed ahead by the create"
    assert d.apply(Op.CANCEL_JOB, now=T0 + 1 * S, job_id="a") == {"ok": True, "cancelled_runs": 0}
    assert d.runs("a") == [] and d.job("a")["state"] == JobState.CANCELLED
    assert purge(d, "a", T0 + 2 * S)["done"]


def test_replicas_delete_the_same_records_at_the_same_index(tmp_path: pathlib.Path) -> None:
    stores = [Driver(str(tmp_path / f"r{i}")) for i in range(2)]
    for r in stores:
        r.create("rec", EVERY, max_attempts=1)
        for k in range(1, 5):
            r.claim_due(T0 + 5 * k * S)
            finish(r, T0 + 5 * k * S, outcome="nack" if k % 2 else "ack")
        r.apply(Op.CANCEL_JOB, now=T0 + 30 * S, job_id="rec")
        purge(r, "rec", T0 + 31 * S, runs_max=2)
    assert stores[0].digest() == stores[1].digest()
    for r in stores:
        purge(r, "rec", T0 + 32 * S, runs_max=2)
    assert stores[0].digest() == stores[1].digest() and stores[0].job("rec") is None


# -- expiry by TTL -------------------------------------------------------------------------------

TTL = 60 * S
KEEP = {"finished_ttl_us": TTL, "history_ttl_us": TTL, "keep_dead_letters": False}


def sweep(d: Driver, now: int, runs_max: int = 2000, only: set[str] | None = None) -> dict[str, Any]:
    """What the leader does: judge the due keys on the store, then propose naming the verdicts
    (with `only`, naming just those runs, as if it had archived no others)."""
    with d.store.read() as txn:
        due = queries.expiry_due(txn, d.store.tables, now, 1000)
        verdicts = retention.plan(records.Ctx(txn, d.store.tables, 0, 0, ops.VERSION), due, now, runs_max)
    checks = [[c, j, [r for r in v.runs if only is None or r in only], v.job] for c, j, v in verdicts]
    return d.apply(Op.SWEEP_EXPIRED, now=now, runs_max=runs_max, checks=checks)


def expiry_keys(d: Driver) -> list[tuple[int, str]]:
    with d.store.read() as txn:
        return queries.expiry_due(txn, d.store.tables, 2**63, 10_000)


def one_off(d: Driver, job_id: str, outcome: str, **fields: Any) -> str:
    """A one-off at T0 + 10 s whose run ends at T0 + 10 s: acked, nacked to a dead letter, or
    skipped (its starting deadline passed before a worker came)."""
    d.create(job_id, AT, **{**KEEP, "max_attempts": 1, "starting_deadline_us": 1 * S, **fields})
    (run_id,) = d.claim_due(T0 + 10 * S)
    if outcome == "skip":
        assert d.lease(T0 + 10 * S + 1 * S + 1) == []
        assert d.run(run_id)["state"] == RunState.SKIPPED
        return run_id
    return finish(d, T0 + 10 * S, outcome)["run_id"]


@pytest.mark.parametrize("outcome", ["ack", "nack", "skip"])
def test_a_finished_one_off_goes_a_ttl_after_it_finished(d: Driver, outcome: str) -> None:
    run_id = one_off(d, "a", outcome, idempotency_key="k", request_hash="h")
    ended = d.run(run_id)["finished_us"]
    assert sweep(d, ended + TTL - 1) == {"deleted_jobs": 0, "deleted_runs": 0}
    assert d.job("a") is not None
    assert sweep(d, ended + TTL) == {"deleted_jobs": 1, "deleted_runs": 1}
    assert d.job("a") is None and d.run(run_id) is None and expiry_keys(d) == []
    assert table_sizes(d)["idempotency"] == 0 and d.state_counts() == {}


def test_a_kept_dead_letter_keeps_its_job(d: Driver) -> None:
    run_id = one_off(d, "a", "nack", keep_dead_letters=True)
    assert sweep(d, T0 + 10 * S + 2 * TTL)["deleted_jobs"] == 0
    assert d.run(run_id)["state"] == RunState.DEAD_LETTER and expiry_keys(d), "looked at again later"
    d.apply(Op.DISCARD_RUN, now=T0 + 3 * TTL, run_id=run_id)
    assert sweep(d, T0 + 10 * S + 4 * TTL)["deleted_jobs"] == 1


def test_a_dead_letter_re_driven_within_the_ttl_runs_and_then_its_job_goes(d: Driver) -> None:
    run_id = one_off(d, "a", "nack")
    d.apply(Op.REDRIVE_RUN, now=T0 + 30 * S, run_id=run_id)
    assert sweep(d, T0 + 10 * S + TTL)["deleted_jobs"] == 0, "its run is queued again: not finished"
    (task,) = d.lease(T0 + 10 * S + TTL)
    d.apply(Op.ACK, now=T0 + 10 * S + TTL, worker_id="w", acks=[[task["run_id"], task["fence"], None]])
    assert sweep(d, T0 + 10 * S + 2 * TTL - 1)["deleted_jobs"] == 0, "a TTL after the run ended, not before"
    assert sweep(d, T0 + 10 * S + 3 * TTL)["deleted_jobs"] == 1


def test_a_cancelled_repeating_job_goes_with_all_its_runs(d: Driver) -> None:
    d.create("rec", EVERY, **{**KEEP, "history_ttl_us": 0})
    for k in range(1, 5):
        d.claim_due(T0 + 5 * k * S)
        finish(d, T0 + 5 * k * S)
    d.apply(Op.CANCEL_JOB, now=T0 + 21 * S, job_id="rec")
    assert sweep(d, T0 + 21 * S + TTL) == {"deleted_jobs": 1, "deleted_runs": 4}
    assert table_sizes(d)["occurrences"] == 0 and d.stored_stats("rec") is None


def test_a_repeating_jobs_history_ages_whatever_history_limit_allows(d: Driver) -> None:
    d.create("rec", EVERY, **{**KEEP, "history_ttl_us": 12 * S}, history_limit=100)
    for k in range(1, 9):
        d.claim_due(T0 + 5 * k * S)
        finish(d, T0 + 5 * k * S)
    assert len(d.runs("rec")) == 8
    result = sweep(d, T0 + 41 * S)
    # Runs that ended at 5..25 s are 16..36 s old: more than 12 s. 30..40 s ones stay.
    assert result == {"deleted_jobs": 0, "deleted_runs": 5}
    assert [r["scheduled_us"] for r in d.runs("rec")] == [T0 + 30 * S, T0 + 35 * S, T0 + 40 * S]
    assert d.stored_stats("rec")["runs"] == 3 and d.job("rec")["state"] == JobState.SCHEDULED
    assert min(t for t, _ in expiry_keys(d)) == T0 + 42 * S, "next look: when the oldest left turns 12 s"


def test_a_large_backlog_goes_in_bounded_entries(d: Driver) -> None:
    d.create("rec", EVERY, **{**KEEP, "history_ttl_us": 0}, history_limit=100)
    for k in range(1, 11):
        d.claim_due(T0 + 5 * k * S)
        finish(d, T0 + 5 * k * S)
    d.apply(Op.CANCEL_JOB, now=T0 + 51 * S, job_id="rec")
    steps = []
    while d.job("rec") is not None:
        steps.append(sweep(d, T0 + 51 * S + TTL, runs_max=4)["deleted_runs"])
    assert steps == [4, 4, 2]


def test_only_what_the_proposer_named_is_deleted(d: Driver) -> None:
    d.create("rec", EVERY, **{**KEEP, "history_ttl_us": 0})
    names = []
    for k in range(1, 4):
        d.claim_due(T0 + 5 * k * S)
        names.append(finish(d, T0 + 5 * k * S)["run_id"])
    d.apply(Op.CANCEL_JOB, now=T0 + 16 * S, job_id="rec")
    assert sweep(d, T0 + 16 * S + TTL, only={names[0]}) == {"deleted_jobs": 0, "deleted_runs": 1}
    assert d.job("rec") is not None, "a run it did not archive is still there: the job stays"
    assert sweep(d, T0 + 16 * S + TTL) == {"deleted_jobs": 1, "deleted_runs": 2}


def test_a_ttl_of_zero_keeps_forever_and_an_update_sets_one(d: Driver) -> None:
    one_off(d, "a", "ack", finished_ttl_us=0, history_ttl_us=0)
    assert expiry_keys(d) == []
    d.apply(Op.UPDATE_JOB, now=T0 + 20 * S, job_id="a", changes={"finished_ttl_us": 5 * S})
    assert sweep(d, T0 + 25 * S)["deleted_jobs"] == 1


def test_a_key_left_behind_by_a_purge_judges_the_job_created_again(d: Driver) -> None:
    one_off(d, "a", "ack")
    assert purge(d, "a", T0 + 11 * S)["done"] and expiry_keys(d)
    d.create("a", EVERY, **KEEP)
    assert sweep(d, T0 + 10 * S + TTL)["deleted_jobs"] == 0 and d.job("a")["state"] == JobState.SCHEDULED


def test_replicas_sweep_the_same_records_at_the_same_index(tmp_path: pathlib.Path) -> None:
    stores = [Driver(str(tmp_path / f"r{i}")) for i in range(2)]
    for r in stores:
        one_off(r, "a", "ack")
        one_off(r, "b", "nack", keep_dead_letters=True)
        r.create("rec", EVERY, **{**KEEP, "history_ttl_us": 8 * S})
        for k in range(3, 6):
            r.claim_due(T0 + 5 * k * S)
            finish(r, T0 + 5 * k * S)
        sweep(r, T0 + 10 * S + TTL, runs_max=3)
    assert stores[0].digest() == stores[1].digest()
    for r in stores:
        sweep(r, T0 + 10 * S + TTL)
    assert stores[0].digest() == stores[1].digest() and stores[0].job("a") is None and stores[0].job("b")
