"""Purging a finished job (and creating its id again), discarding a dead letter, and a
cancel that leaves no phantom history: the state machine's rules, on a temp LMDB."""
from __future__ import annotations

import pathlib
from typing import Any

import pytest

from schedulerd.jobspec import JOB_DEFAULTS
from storage import keys
from storage.model import JobState, RunState
from storage.ops import Op
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
    spec = dict(JOB_DEFAULTS, job_id="a", schedule=AT, schedule_spec={}, queue="q", payload_json="{}")
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
