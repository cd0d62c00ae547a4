"""Every apply rule of the state machine, on a real temp LMDB."""
from __future__ import annotations

import pathlib
from typing import Any

import pytest

from schedulerd import jobspec
from schedulerd.limits import Limits
from schedulerd.storage import codec, fsm, keys, ops, queries
from schedulerd.storage.jobs import SPEC_DEFAULTS
from schedulerd.storage.leases import FAIR_EVERY
from schedulerd.storage.model import (JOB_TRANSITIONS, RUN_TRANSITIONS, IllegalTransition, JobEvent, JobState,
                           RunEvent, RunState, job_transition, run_transition)
from schedulerd.storage.ops import Op
from tests.unit.fsm_driver import S, T0, Driver

AT = {"kind": "at", "at_us": T0 + 10 * S}
EVERY = {"kind": "every", "every_us": 5 * S, "anchor_us": T0}
CRON = {"kind": "cron", "cron": "*/1 * * * * *", "timezone": "UTC", "seconds": True}


@pytest.fixture
def d(tmp_path: pathlib.Path) -> Driver:
    return Driver(str(tmp_path / "db"))


def test_create_sets_first_fire_and_due_index(d: Driver) -> None:
    assert d.create("a", AT)["ok"]
    assert d.create("b", EVERY)["ok"]
    assert d.job("a")["next_fire_us"] == T0 + 10 * S
    assert d.job("b")["next_fire_us"] == T0 + 5 * S
    assert sorted(d.due(T0 + 10 * S)) == [("a", T0 + 10 * S), ("b", T0 + 5 * S)]
    assert d.due(T0 + 9 * S) == [("b", T0 + 5 * S)]


def test_create_existing_id_is_a_conflict_and_changes_nothing(d: Driver) -> None:
    d.create("a", AT)
    before = d.job("a")
    result = d.create("a", EVERY, payload_json='"other"')
    assert result == {"job_id": "a", "ok": False, "code": "conflict", "message": "job 'a' already exists (scheduled)"}
    assert d.job("a") == before


def test_creating_the_id_of_a_cancelled_job_says_so_and_how_to_free_the_id(d: Driver) -> None:
    d.create("a", EVERY)
    d.apply(Op.CANCEL_JOB, now=T0 + S, job_id="a")
    message = d.create("a", EVERY)["message"]
    assert message == ("job 'a' already exists and is cancelled; purge it to create the id again "
                       "(DELETE /v1/jobs/{id}?purge=true, schedctl cancel --purge)")


def test_labels_and_a_description_are_stored_and_a_patch_replaces_them(d: Driver) -> None:
    d.create("a", EVERY, labels={"team": "billing", "env": "prod"}, description="invoices")
    d.apply(Op.UPDATE_JOB, now=T0 + S, job_id="a", changes={"labels": {"team": "search"}, "description": "search"})
    assert (d.job("a")["labels"], d.job("a")["description"]) == ({"team": "search"}, "search")


def test_one_bulk_entry_acts_on_each_job_and_says_which_changed(d: Driver) -> None:
    for job_id in ("a", "b", "c"):
        d.create(job_id, EVERY)
    d.apply(Op.PAUSE_JOB, now=T0 + S, job_id="b")
    d.apply(Op.CANCEL_JOB, now=T0 + S, job_id="c")
    paused = d.apply(Op.JOBS_ACTION, now=T0 + 2 * S, action="pause", job_ids=["a", "b", "c", "gone"])
    assert paused == {"ok": True, "changed": ["a"], "skipped_reasons": {}}
    assert [d.job(j)["state"] for j in "abc"] == ["paused", "paused", "cancelled"]
    resumed = d.apply(Op.JOBS_ACTION, now=T0 + 3 * S, action="resume", job_ids=["a", "b"])
    assert resumed["changed"] == ["a", "b"] and d.job("a")["state"] == "scheduled"
    assert d.apply(Op.JOBS_ACTION, now=T0 + 3 * S, action="delete", job_ids=["a"])["code"] == "invalid_request"


def test_one_off_in_the_past_fires_at_once(d: Driver) -> None:
    d.create("late", {"kind": "at", "at_us": T0 - 60 * S})
    assert d.due(T0) == [("late", T0 - 60 * S)]


def test_claim_creates_one_run_and_completes_one_off(d: Driver) -> None:
    d.create("a", AT)
    runs = d.claim_due(T0 + 10 * S)
    assert len(runs) == 1
    run = d.run(runs[0])
    assert run["state"] == RunState.QUEUED and run["scheduled_us"] == T0 + 10 * S and run["attempt"] == 0
    job = d.job("a")
    assert job["state"] == JobState.COMPLETED and job["next_fire_us"] is None
    assert d.due(T0 + 1000 * S) == []


def _create_claiming(d: Driver, job_id: str, schedule: dict[str, Any], ahead_s: int = 12,
                     version: int = ops.VERSION, **fields: Any) -> dict[str, Any]:
    """A create as the API proposes it: claiming what is due within the lookahead."""
    spec = dict(SPEC_DEFAULTS, job_id=job_id, schedule=schedule, schedule_spec={}, queue="q", payload_json="{}",
                **fields)
    return d.apply(Op.CREATE_JOBS, now=T0, jobs=[spec], claim_ahead_us=ahead_s * S, grace_us=5 * S,
                   version=version)


def _stored_job_bytes(d: Driver, job_id: str) -> bytes:
    with d.store.read() as txn:
        return bytes(txn.get(keys.job_key(job_id), db=d.store.tables.jobs))


def test_a_create_entry_carries_only_what_was_given_and_stores_the_whole_job(tmp_path: pathlib.Path) -> None:
    """Version 5 entries carry each job's given fields; the job stored is byte for byte the
    one an older entry carrying every field stored (both as maps: before version 10)."""
    now = 1_800_000_000 * S
    spec = jobspec.parse_job({"job_id": "a", "schedule": {"every": "30s"}, "queue": "q", "priority": 0}, now, Limits())
    assert sorted(spec) == ["job_id", "priority", "queue", "schedule", "schedule_spec"]
    whole = dict(SPEC_DEFAULTS, **spec)
    assert len(codec.pack(spec)) < len(codec.pack(whole)) / 2
    old, new = Driver(str(tmp_path / "old")), Driver(str(tmp_path / "new"))
    old.apply(Op.CREATE_JOBS, now=now, jobs=[whole], version=4)
    new.apply(Op.CREATE_JOBS, now=now, jobs=[spec], version=ops.ARRAY_RECORDS_SINCE - 1)
    assert _stored_job_bytes(new, "a") == _stored_job_bytes(old, "a")
    assert new.job("a")["max_attempts"] == 3 and new.job("a")["backoff"] == SPEC_DEFAULTS["backoff"]


def test_an_entry_before_version_5_fills_in_no_defaults(d: Driver) -> None:
    """An old entry replayed by this build stores what the others stored then."""
    spec = {"job_id": "old", "schedule": AT, "schedule_spec": {}, "queue": "q", "payload_json": "{}"}
    d.apply(Op.CREATE_JOBS, now=T0, jobs=[spec], version=4)
    d.apply(Op.CREATE_JOBS, now=T0, jobs=[dict(spec, job_id="new")])
    assert "max_attempts" not in d.job("old") and d.job("new")["max_attempts"] == 3


def test_the_defaults_a_create_entry_leaves_out_are_those_of_version_5() -> None:
    """Changing a default changes what an entry of version 5 means: it needs a new version."""
    assert ops.SPEC_DEFAULTS_SINCE == 5
    assert SPEC_DEFAULTS == {
        "queue": "default", "payload_json": "null", "max_attempts": 3, "priority": 0, "misfire_policy": "fire_once",
        "catchup_limit": 100, "starting_deadline_us": None, "overlap_policy": "allow",
        "backoff": {"base_ms": 1000, "factor": 2.0, "max_ms": 300_000}, "timeout_us": None, "jitter_us": 0,
        "history_limit": 100, "target": None}


def test_a_new_run_is_stored_with_its_fields_in_the_order_earlier_builds_wrote(d: Driver) -> None:
    """Replicas of different builds must store the same bytes (queries.state_digest), and
    msgpack keeps a map's key order."""
    d.create("a", AT)
    stored = d.run(d.claim_due(T0 + 10 * S)[0])  # decoded from the stored bytes, in their order
    assert list(stored) == ["run_id", "job_id", "scheduled_us", "state", "attempt", "queue", "priority",
                            "max_attempts", "backoff", "timeout_us", "available_us", "worker_id", "fence",
                            "lease_until_us", "attempt_deadline_us", "created_us", "finished_us", "result_json",
                            "error", "reason", "trigger", "starting_deadline_us"]


def test_create_claims_a_first_occurrence_due_within_the_lookahead(d: Driver) -> None:
    result = _create_claiming(d, "a", AT)  # due in 10 s
    (run_id,) = result["runs"]
    run = d.run(run_id)
    assert run["state"] == RunState.QUEUED and run["scheduled_us"] == run["available_us"] == T0 + 10 * S
    assert d.job("a")["state"] == JobState.COMPLETED and d.job("a")["next_fire_us"] is None
    assert d.due(T0 + 1000 * S) == [] and d.ready(T0 + 10 * S) == [run_id]
    assert d.apply(Op.CLAIM_BATCH, now=T0 + 10 * S, claims=[["a", T0 + 10 * S]])["stale"] == 1
    assert d.state_counts() == {"completed": 1}


def test_create_claims_what_a_scan_at_the_same_instant_would(d: Driver, tmp_path: pathlib.Path) -> None:
    """The same jobs created by one entry that claims, or by one that does not and a scan
    right after: the same jobs, runs and indexes (run ids aside, which name the entry)."""
    schedules = [AT, EVERY, CRON, {"kind": "at", "at_us": T0 - 2 * S}, {"kind": "at", "at_us": T0 + 13 * S}]
    scanned = Driver(str(tmp_path / "scanned"))
    for i, schedule in enumerate(schedules):
        _create_claiming(d, f"j{i}", schedule, jitter_us=500_000)
        scanned.create(f"j{i}", schedule, jitter_us=500_000)
    scanned.apply(Op.CLAIM_BATCH, now=T0, grace_us=5 * S, claims=[list(c) for c in scanned.due(T0 + 12 * S)])
    for i in range(len(schedules)):
        job, other = d.job(f"j{i}"), scanned.job(f"j{i}")
        assert {**job, "raft_index": 0} == {**other, "raft_index": 0}
        assert [{**r, "run_id": ""} for r in d.runs(f"j{i}")] == [{**r, "run_id": ""} for r in scanned.runs(f"j{i}")]
    assert sorted(d.due(T0 + 100 * S)) == sorted(scanned.due(T0 + 100 * S))
    assert d.state_counts() == scanned.state_counts()


def test_a_one_off_claimed_ahead_reads_as_scheduled_until_its_time(d: Driver) -> None:
    _create_claiming(d, "a", AT)
    _create_claiming(d, "b", {"kind": "at", "at_us": T0 - S})

    def seen(now: int, state: str) -> list[str]:
        with d.store.read() as txn:
            jobs, _ = queries.list_jobs(txn, d.store.tables, state=state, queue=None, limit=10, after=None,
                                        scan_max=100, now_us=now)
        return [j["job_id"] for j in jobs]

    assert d.job("a")["state"] == JobState.COMPLETED
    assert (queries.as_seen(d.job("a"), T0)["state"], queries.as_seen(d.job("a"), T0)["next_fire_us"]) == \
        (JobState.SCHEDULED, T0 + 10 * S)
    assert seen(T0, "scheduled") == ["a"] and seen(T0, "completed") == ["b"]
    assert queries.as_seen(d.job("a"), T0 + 10 * S) == d.job("a")
    assert seen(T0 + 10 * S, "scheduled") == [] and seen(T0 + 10 * S, "completed") == ["a", "b"]


def test_resuming_a_one_off_claimed_ahead_is_a_no_op_as_for_a_scheduled_job(d: Driver) -> None:
    _create_claiming(d, "a", AT)
    job, runs = d.job("a"), d.runs("a")
    assert d.apply(Op.RESUME_JOB, now=T0, job_id="a") == {"ok": True}
    assert d.job("a") == job and d.runs("a") == runs
    assert d.apply(Op.RESUME_JOB, now=T0, job_id="a", version=2)["code"] == "conflict"  # it read as completed then
    assert d.apply(Op.RESUME_JOB, now=T0 + 10 * S, job_id="a")["code"] == "conflict"  # its time has come


def test_create_leaves_a_missed_first_occurrence_to_the_scan(d: Driver) -> None:
    """Older than the grace, the misfire policy decides, in the claim as always."""
    result = _create_claiming(d, "late", {"kind": "at", "at_us": T0 - 60 * S}, misfire_policy="skip")
    assert result["runs"] == [] and d.due(T0) == [("late", T0 - 60 * S)]
    assert d.apply(Op.CLAIM_BATCH, now=T0, grace_us=5 * S, claims=[["late", T0 - 60 * S]])["skipped"] == 1


def test_create_at_version_2_claims_nothing(d: Driver) -> None:
    assert _create_claiming(d, "a", AT, version=2)["runs"] == []
    assert d.job("a")["state"] == JobState.SCHEDULED and d.due(T0 + 10 * S) == [("a", T0 + 10 * S)]


def test_create_claim_skips_a_first_occurrence_past_its_starting_deadline(d: Driver) -> None:
    result = _create_claiming(d, "a", {"kind": "at", "at_us": T0 - 3 * S}, starting_deadline_us=S)
    assert result["runs"] == [] and result["skipped_reasons"] == {"deadline": 1}
    assert [r["state"] for r in d.runs("a")] == [RunState.SKIPPED]


def test_second_claim_of_an_occurrence_is_rejected(d: Driver) -> None:
    d.create("a", AT)
    claim = [["a", T0 + 10 * S]]
    first = d.apply(Op.CLAIM_BATCH, now=T0 + 10 * S, claims=claim)
    second = d.apply(Op.CLAIM_BATCH, now=T0 + 10 * S, claims=claim)
    assert len(first["runs"]) == 1 and second == {"runs": [], "skipped": 0, "stale": 1, "skipped_reasons": {}, "deferred": []}
    assert len(d.runs("a")) == 1


def test_claim_with_wrong_fire_time_is_stale(d: Driver) -> None:
    d.create("a", AT)
    stale = {"runs": [], "skipped": 0, "stale": 1, "skipped_reasons": {}, "deferred": []}
    assert d.apply(Op.CLAIM_BATCH, now=T0, claims=[["a", T0 + 9 * S]]) == stale
    assert d.apply(Op.CLAIM_BATCH, now=T0, claims=[["missing", T0]]) == stale


def test_recurring_claim_advances_to_next_occurrence(d: Driver) -> None:
    d.create("e", EVERY)
    d.claim_due(T0 + 5 * S)
    assert d.job("e")["next_fire_us"] == T0 + 10 * S
    assert d.job("e")["state"] == JobState.SCHEDULED


def test_cron_with_seconds_field(d: Driver) -> None:
    d.create("c", CRON, now=T0)
    assert d.job("c")["next_fire_us"] == T0 + S
    d.claim_due(T0 + S)
    assert d.job("c")["next_fire_us"] == T0 + 2 * S


def test_run_is_not_leasable_before_its_time(d: Driver) -> None:
    d.create("a", AT)
    (run_id,) = d.apply(Op.CLAIM_BATCH, now=T0 + 9 * S, claims=[["a", T0 + 10 * S]])["runs"]
    assert d.ready(T0 + 9 * S) == []
    assert d.lease(T0 + 9 * S, run_ids=[run_id]) == []
    assert d.ready(T0 + 10 * S) == [run_id]


def test_lease_sets_fence_attempt_and_lease_index(d: Driver) -> None:
    d.create("a", AT, payload_json='{"x":1}')
    d.claim_due(T0 + 10 * S)
    (task,) = d.lease(T0 + 11 * S)
    assert task["state"] == RunState.RUNNING and task["attempt"] == 1
    assert task["fence"] == d.index and "payload_json" not in task, "the proposing node adds the payload"
    assert task["lease_until_us"] == T0 + 41 * S
    assert d.ready(T0 + 11 * S) == []
    assert d.lease(T0 + 11 * S, worker="other", run_ids=[task["run_id"]]) == []


def test_the_proposing_node_reads_payload_and_target_of_each_granted_job(d: Driver) -> None:
    target = {"kind": "http", "url": "https://example.test/hook", "method": "POST", "headers": {}}
    d.create("a", AT, payload_json='{"x":1}', target=target)
    d.create("b", AT)
    legacy = {k: v for k, v in d.job("b").items() if k != "target"}  # a record from before targets
    with d.store.env.begin(write=True) as txn:
        txn.put(b"b", codec.pack(legacy), db=d.store.tables.jobs)
    with d.store.read() as txn:
        parts = queries.task_parts(txn, d.store.tables, ["a", "b", "gone", "a"])
    assert parts == {"a": queries.TaskPart('{"x":1}', target), "b": queries.TaskPart("{}", None), "gone": None}


def _running(d: Driver) -> dict:
    d.create("a", AT, max_attempts=2)
    d.claim_due(T0 + 10 * S)
    (task,) = d.lease(T0 + 10 * S)
    return task


def test_heartbeat_extends_and_rejects_stale_fence(d: Driver) -> None:
    task = _running(d)
    ok = d.apply(Op.HEARTBEAT, now=T0 + 20 * S, worker_id="w", lease_until=T0 + 50 * S,
                 leases=[[task["run_id"], task["fence"]]])
    assert ok["results"][0]["ok"] and d.run(task["run_id"])["lease_until_us"] == T0 + 50 * S
    stale = d.apply(Op.HEARTBEAT, now=T0 + 20 * S, worker_id="w", lease_until=T0 + 60 * S,
                    leases=[[task["run_id"], task["fence"] - 1]])
    assert stale["results"][0]["code"] == "stale_fence"
    other = d.apply(Op.HEARTBEAT, now=T0 + 20 * S, worker_id="intruder", lease_until=T0 + 60 * S,
                    leases=[[task["run_id"], task["fence"]]])
    assert other["results"][0]["code"] == "stale_fence"
    assert d.run(task["run_id"])["lease_until_us"] == T0 + 50 * S


def test_ack_succeeds_once_and_repeated_late_or_stale_acks_change_nothing(d: Driver) -> None:
    task = _running(d)
    bad = d.apply(Op.ACK, now=T0 + 11 * S, worker_id="w", acks=[[task["run_id"], task["fence"] + 1, None]])
    assert bad["results"][0]["code"] == "stale_fence"
    good = d.apply(Op.ACK, now=T0 + 12 * S, worker_id="w", acks=[[task["run_id"], task["fence"], '"done"']])
    assert good["results"][0]["ok"]
    run = d.run(task["run_id"])
    assert run["state"] == RunState.SUCCEEDED and run["result_json"] == '"done"' and run["finished_us"] == T0 + 12 * S
    # The same lease repeating its ack (its first answer lost) is told ok; nothing changes.
    again = d.apply(Op.ACK, now=T0 + 60 * S, worker_id="w", acks=[[task["run_id"], task["fence"], None]])
    assert again["results"][0]["ok"] and again["results"][0]["repeated"]
    other = d.apply(Op.ACK, now=T0 + 13 * S, worker_id="intruder", acks=[[task["run_id"], task["fence"], None]])
    assert other["results"][0]["code"] == "stale_fence"
    nack = d.apply(Op.NACK, now=T0 + 13 * S, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="x")
    assert nack["code"] == "stale_fence"
    assert d.run(task["run_id"]) == run


def test_ack_after_lease_expired_is_rejected(d: Driver) -> None:
    task = _running(d)
    late = d.apply(Op.ACK, now=task["lease_until_us"], worker_id="w", acks=[[task["run_id"], task["fence"], None]])
    assert late["results"][0]["code"] == "stale_fence"
    assert d.run(task["run_id"])["state"] == RunState.RUNNING


def test_nack_retries_with_backoff_then_dead_letters(d: Driver) -> None:
    task = _running(d)
    r1 = d.apply(Op.NACK, now=T0 + 11 * S, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="boom")
    run = r1["run"]
    assert run["state"] == RunState.RETRY_WAIT and run["error"] == "boom"
    assert T0 + 11 * S + int(0.8 * S) <= run["available_us"] <= T0 + 11 * S + int(1.2 * S)
    assert d.ready(run["available_us"] - 1) == []
    (task2,) = d.lease(run["available_us"])
    assert task2["attempt"] == 2 and task2["fence"] > task["fence"]
    r2 = d.apply(Op.NACK, now=run["available_us"] + S, worker_id="w", run_id=task2["run_id"],
                 fence=task2["fence"], error="boom again")
    assert r2["run"]["state"] == RunState.DEAD_LETTER
    assert d.ready(T0 + 10_000 * S) == []


def test_a_nack_repeated_by_its_lease_is_ok_and_changes_nothing(d: Driver) -> None:
    """The worker retries a nack whose answer it never got; that nack had landed."""
    task = _running(d)
    first = d.apply(Op.NACK, now=T0 + 11 * S, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="boom")
    run = d.run(task["run_id"])
    again = d.apply(Op.NACK, now=T0 + 12 * S, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="boom")
    assert again["ok"] and again["repeated"] and again["run"] == first["run"] == run
    assert d.run(task["run_id"]) == run
    for worker, fence, error in (("intruder", task["fence"], "boom"), ("w", task["fence"] + 1, "boom"),
                                 ("w", task["fence"], "another failure")):
        other = d.apply(Op.NACK, now=T0 + 12 * S, worker_id=worker, run_id=task["run_id"], fence=fence, error=error)
        assert other["code"] == "stale_fence", (worker, fence, error)
    assert d.run(task["run_id"]) == run


def test_a_nack_after_its_lease_expired_is_still_stale(d: Driver) -> None:
    """The reaper failed the attempt first: the worker's nack did not land, and is told so."""
    task = _running(d)
    d.apply(Op.EXPIRE_LEASES, now=task["lease_until_us"], runs=[[task["run_id"], task["fence"]]])
    run = d.run(task["run_id"])
    assert run["state"] == RunState.RETRY_WAIT
    late = d.apply(Op.NACK, now=task["lease_until_us"] + 1, worker_id="w", run_id=task["run_id"],
                   fence=task["fence"], error="boom")
    assert late["code"] == "stale_fence" and d.run(task["run_id"]) == run


def test_a_run_redriven_past_attempt_300_still_fails_its_attempts_with_backoff(d: Driver) -> None:
    """base * factor ** (attempt - 1) overflows a float there (factor 10): the delay is
    max_ms, as long before, and the nack applies instead of stopping every replica."""
    from schedulerd.storage.retry import backoff_us
    assert backoff_us({"base_ms": 1000, "factor": 10.0, "max_ms": 300_000}, "j", T0, 310) <= 300_000 * 1000
    assert backoff_us(None, "j", T0, 1100) <= 300_000 * 1000
    daily = {"kind": "every", "every_us": 86_400 * S, "anchor_us": T0}
    d.create("j", daily, max_attempts=100, backoff={"base_ms": 1, "factor": 10.0, "max_ms": 1000})
    (run_id,) = d.claim_due(T0 + 86_400 * S)
    now = T0 + 86_400 * S
    for _ in range(310):
        if d.run(run_id)["state"] == RunState.DEAD_LETTER:
            assert d.apply(Op.REDRIVE_RUN, now=now, run_id=run_id)["ok"]
        now = max(now, d.run(run_id)["available_us"])
        (task,) = d.lease(now, run_ids=[run_id])
        d.apply(Op.NACK, now=now, worker_id="w", run_id=run_id, fence=task["fence"], error="boom")
    run = d.run(run_id)
    assert run["attempt"] == 310 and run["state"] == RunState.RETRY_WAIT
    assert run["available_us"] - now <= 1000 * 1000


def test_backoff_is_deterministic_and_grows() -> None:
    from schedulerd.storage.retry import backoff_us
    a = [backoff_us(None, "job", T0, n) for n in range(1, 6)]
    assert a == [backoff_us(None, "job", T0, n) for n in range(1, 6)]
    assert a[0] < a[2] < a[4]
    assert backoff_us({"base_ms": 1000, "factor": 2.0, "max_ms": 5000}, "job", T0, 20) <= 5000 * 1000


def test_expired_lease_requeues_and_old_fence_is_dead(d: Driver) -> None:
    task = _running(d)
    not_yet = d.apply(Op.EXPIRE_LEASES, now=task["lease_until_us"] - 1, runs=[[task["run_id"], task["fence"]]])
    assert not_yet == {"expired": 0, "dead_letter": 0}
    done = d.apply(Op.EXPIRE_LEASES, now=task["lease_until_us"], runs=[[task["run_id"], task["fence"]]])
    assert done == {"expired": 1, "dead_letter": 0}
    run = d.run(task["run_id"])
    assert run["state"] == RunState.RETRY_WAIT and "lease expired" in run["error"]
    late_ack = d.apply(Op.ACK, now=task["lease_until_us"] + 1, worker_id="w",
                       acks=[[task["run_id"], task["fence"], None]])
    assert late_ack["results"][0]["code"] == "stale_fence"


def test_expiry_of_a_lease_that_was_renewed_is_ignored(d: Driver) -> None:
    task = _running(d)
    d.apply(Op.HEARTBEAT, now=T0 + 20 * S, worker_id="w", lease_until=T0 + 80 * S,
            leases=[[task["run_id"], task["fence"]]])
    stale = d.apply(Op.EXPIRE_LEASES, now=task["lease_until_us"], runs=[[task["run_id"], task["fence"]]])
    assert stale == {"expired": 0, "dead_letter": 0}


def test_last_attempt_expiring_dead_letters(d: Driver) -> None:
    d.create("a", AT, max_attempts=1)
    d.claim_due(T0 + 10 * S)
    (task,) = d.lease(T0 + 10 * S)
    res = d.apply(Op.EXPIRE_LEASES, now=T0 + 100 * S, runs=[[task["run_id"], task["fence"]]])
    assert res == {"expired": 1, "dead_letter": 1}
    assert d.run(task["run_id"])["state"] == RunState.DEAD_LETTER


def test_cancel_stops_future_runs_and_cancels_queued_not_running(d: Driver) -> None:
    d.create("e", EVERY, max_attempts=3)
    (queued,) = d.claim_due(T0 + 5 * S)
    (running_task,) = d.lease(T0 + 5 * S)
    (queued,) = d.claim_due(T0 + 10 * S)
    res = d.apply(Op.CANCEL_JOB, now=T0 + 11 * S, job_id="e")
    assert res == {"ok": True, "cancelled_runs": 1}
    assert d.job("e")["state"] == JobState.CANCELLED and d.job("e")["next_fire_us"] is None
    assert d.run(queued)["state"] == RunState.CANCELLED
    assert d.run(running_task["run_id"])["state"] == RunState.RUNNING
    assert d.due(T0 + 10_000 * S) == [] and d.ready(T0 + 10_000 * S) == []
    assert d.apply(Op.CANCEL_JOB, now=T0 + 12 * S, job_id="e") == {"ok": True, "cancelled_runs": 0}


def test_cancel_unknown_and_completed_jobs(d: Driver) -> None:
    assert d.apply(Op.CANCEL_JOB, now=T0, job_id="nope")["code"] == "not_found"
    d.create("a", AT, max_attempts=1)
    d.claim_due(T0 + 10 * S)
    (task,) = d.lease(T0 + 10 * S)
    d.apply(Op.ACK, now=T0 + 11 * S, worker_id="w", acks=[[task["run_id"], task["fence"], None]])
    assert d.apply(Op.CANCEL_JOB, now=T0 + 12 * S, job_id="a")["code"] == "conflict"


def test_cancel_completed_one_off_with_queued_run_cancels_it(d: Driver) -> None:
    """Its run came due: it is cancelled, and says so."""
    d.create("a", AT)
    (run_id,) = d.apply(Op.CLAIM_BATCH, now=T0 + 9 * S, claims=[["a", T0 + 10 * S]])["runs"]
    assert d.job("a")["state"] == JobState.COMPLETED
    assert d.apply(Op.CANCEL_JOB, now=T0 + 11 * S, job_id="a") == {"ok": True, "cancelled_runs": 1}
    assert d.run(run_id)["state"] == RunState.CANCELLED


def test_before_version_11_a_cancel_records_runs_claimed_ahead_as_cancelled(d: Driver) -> None:
    d.create("a", AT)
    (run_id,) = d.apply(Op.CLAIM_BATCH, now=T0 + 9 * S, claims=[["a", T0 + 10 * S]])["runs"]
    assert d.apply(Op.CANCEL_JOB, now=T0 + 9 * S, job_id="a", version=10) == {"ok": True, "cancelled_runs": 1}
    assert d.run(run_id)["state"] == RunState.CANCELLED


def test_cancel_of_a_one_off_whose_run_is_running_cancels_it_and_its_retry(d: Driver) -> None:
    _create_claiming(d, "a", AT)
    (task,) = d.lease(T0 + 10 * S)
    assert d.job("a")["state"] == JobState.COMPLETED
    assert d.apply(Op.CANCEL_JOB, now=T0 + 11 * S, job_id="a") == {"ok": True, "cancelled_runs": 0}
    assert d.job("a")["state"] == JobState.CANCELLED
    assert d.run(task["run_id"])["state"] == RunState.RUNNING  # the attempt may finish...
    d.apply(Op.NACK, now=T0 + 12 * S, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="x")
    assert d.run(task["run_id"])["state"] == RunState.CANCELLED  # ...and is not retried
    assert d.lease(T0 + 3600 * S) == []


def test_an_entry_from_before_version_7_keeps_the_conflict_for_a_running_one_off(d: Driver) -> None:
    _create_claiming(d, "a", AT)
    (task,) = d.lease(T0 + 10 * S)
    res = d.apply(Op.CANCEL_JOB, version=ops.CANCEL_RUNNING_SINCE - 1, now=T0 + 11 * S, job_id="a")
    assert res["code"] == "conflict" and d.job("a")["state"] == JobState.COMPLETED


def test_a_dead_letter_of_a_cancelled_job_is_not_redriven_from_version_8(d: Driver) -> None:
    """DELETE promises no run starts after it; an entry of version 7 still re-drives."""
    d.create("j", EVERY, max_attempts=1)
    (run_id,) = d.claim_due(T0 + 5 * S)
    (task,) = d.lease(T0 + 5 * S)
    d.apply(Op.NACK, now=T0 + 6 * S, worker_id="w", run_id=run_id, fence=task["fence"], error="x")
    assert d.run(run_id)["state"] == RunState.DEAD_LETTER
    assert d.apply(Op.CANCEL_JOB, now=T0 + 7 * S, job_id="j")["ok"]
    refused = d.apply(Op.REDRIVE_RUN, now=T0 + 8 * S, run_id=run_id)
    assert refused["code"] == "conflict" and "cancelled" in refused["message"]
    assert d.run(run_id)["state"] == RunState.DEAD_LETTER and d.lease(T0 + 3600 * S) == []
    old = d.apply(Op.REDRIVE_RUN, version=ops.REDRIVE_CANCELLED_SINCE - 1, now=T0 + 9 * S, run_id=run_id)
    assert old["ok"] and d.run(run_id)["state"] == RunState.QUEUED


def _fail_or_finish(d: Driver, k: int, fail: bool, version: int = ops.VERSION) -> str:
    now = T0 + 5 * k * S
    d.apply(Op.CLAIM_BATCH, version=version, now=now, grace_us=5 * S, claims=[list(due) for due in d.due(now)])
    (task,) = d.lease(now)
    if fail:
        d.apply(Op.NACK, now=now, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="x")
    else:
        d.apply(Op.ACK, now=now, worker_id="w", acks=[[task["run_id"], task["fence"], None]])
    return task["run_id"]


def test_history_stays_near_its_limit_behind_33_dead_letters(d: Driver) -> None:
    """Before version 8 the 32 oldest dead letters filled every prune's scan, and the job
    kept a run per occurrence from then on."""
    d.create("e", {"kind": "every", "every_us": 5 * S, "anchor_us": T0}, history_limit=3, max_attempts=1)
    dead = [_fail_or_finish(d, k, fail=True) for k in range(1, 34)]
    for k in range(34, 94):
        _fail_or_finish(d, k, fail=False)
    states = [r["state"] for r in d.runs("e")]
    assert states.count("dead_letter") == 33 and len(states) - 33 <= 3, states
    # A re-drive puts a run behind where pruning starts: it starts from the oldest again.
    assert d.apply(Op.REDRIVE_RUN, now=T0 + 500 * S, run_id=dead[0])["ok"]
    assert "dead_until_us" not in d.stored_stats("e")
    for k in range(100, 110):
        _fail_or_finish(d, k, fail=False)
    states = [r["state"] for r in d.runs("e") if r["run_id"] != dead[0]]
    assert states.count("dead_letter") == 32 and len(states) - 32 <= 3, states


def test_an_entry_before_version_8_prunes_as_before(d: Driver) -> None:
    d.create("e", {"kind": "every", "every_us": 5 * S, "anchor_us": T0}, history_limit=3, max_attempts=1)
    for k in range(1, 34):
        _fail_or_finish(d, k, fail=True, version=7)
    for k in range(34, 44):
        _fail_or_finish(d, k, fail=False, version=7)
    assert len(d.runs("e")) == 43 and "dead_until_us" not in d.stored_stats("e")


def test_a_one_off_stores_no_run_counts_through_its_life(d: Driver) -> None:
    (run_id,) = _create_claiming(d, "a", AT)["runs"]
    (task,) = d.lease(T0 + 10 * S)
    d.apply(Op.ACK, now=T0 + 11 * S, worker_id="w", acks=[[task["run_id"], task["fence"], None]])
    assert d.run(run_id)["state"] == RunState.SUCCEEDED and d.stored_stats("a") is None
    d.create("b", {"kind": "at", "at_us": T0 + 100 * S})
    d.claim_due(T0 + 100 * S)
    assert d.stored_stats("b") is None


def test_a_cancel_finds_the_queued_run_of_a_one_off_without_stored_counts(d: Driver) -> None:
    (run_id,) = _create_claiming(d, "a", AT)["runs"]
    assert d.apply(Op.CANCEL_JOB, now=T0 + 11 * S, job_id="a") == {"ok": True, "cancelled_runs": 1}
    assert d.run(run_id)["state"] == RunState.CANCELLED and d.stored_stats("a") is None


def test_repeating_jobs_store_their_run_counts(d: Driver) -> None:
    d.create("e", EVERY)
    d.claim_due(T0 + 5 * S)
    assert d.stored_stats("e") == {"pending": 1, "running": 0, "runs": 1}
    d.lease(T0 + 5 * S)
    assert d.stored_stats("e") == {"pending": 0, "running": 1, "runs": 1}


def test_a_triggered_one_off_stores_its_counts_from_the_runs_it_has(d: Driver) -> None:
    _create_claiming(d, "a", AT)
    d.lease(T0 + 10 * S)
    assert d.apply(Op.TRIGGER_JOB, now=T0 + 11 * S, job_id="a")["ok"]
    assert d.stored_stats("a") == {"pending": 1, "running": 1, "runs": 2}


def test_before_version_4_a_one_off_stores_its_counts(d: Driver) -> None:
    _create_claiming(d, "a", AT, version=3)
    assert d.stored_stats("a") == {"pending": 1, "running": 0, "runs": 1}
    d.lease(T0 + 10 * S)
    assert d.stored_stats("a") == {"pending": 0, "running": 1, "runs": 1}


def test_a_one_off_made_to_repeat_counts_its_earlier_run_for_overlap_and_history(d: Driver) -> None:
    """Its claimed run was never counted in a stored record: the overlap rule and the first
    stored counts still see it."""
    _create_claiming(d, "a", AT)
    d.lease(T0 + 10 * S)
    d.apply(Op.UPDATE_JOB, now=T0 + 11 * S, job_id="a",
            changes={"schedule": EVERY, "overlap_policy": "skip", "history_limit": 5})
    d.claim_due(T0 + 16 * S)
    assert [r["reason"] for r in d.runs("a")] == [None, "overlap"]
    assert d.stored_stats("a") == {"pending": 0, "running": 1, "runs": 2}


def test_replaying_an_applied_index_is_a_no_op(d: Driver) -> None:
    d.create("a", AT)
    blob = ops.encode(Op.CREATE_JOBS, {"now": T0, "jobs": [{"job_id": "b", "schedule": AT, "schedule_spec": {},
                                                            "queue": "q", "payload_json": "{}",
                                                            "max_attempts": 1, "priority": 0}]})
    assert fsm.apply(d.store, d.index, blob) == (None, fsm.ALREADY_APPLIED)
    assert d.job("b") is None


def test_corrupt_or_unknown_entries_are_fatal(d: Driver) -> None:
    with pytest.raises(fsm.FatalApplyError):
        fsm.apply(d.store, 1, b"\xc1garbage")
    import msgpack
    with pytest.raises(fsm.FatalApplyError, match="unknown op"):
        fsm.apply(d.store, 1, msgpack.packb([250, ops.VERSION, {}]))
    newer = ops.VERSION + 1
    with pytest.raises(fsm.FatalApplyError, match=f"entry version {newer}"):  # from a newer build
        fsm.apply(d.store, 1, msgpack.packb([int(Op.PAUSE_JOB), newer, {"now": T0, "job_id": "a"}]))
    assert d.store.last_applied() == 0


def test_entries_written_at_version_1_still_apply(d: Driver) -> None:
    d.create("a", AT)
    assert d.apply(Op.PAUSE_JOB, now=T0, job_id="a", version=1)["ok"]
    assert d.job("a")["state"] == "paused"


def test_same_commands_give_byte_identical_replicas(tmp_path: pathlib.Path) -> None:
    replicas = [Driver(str(tmp_path / f"r{i}")) for i in range(2)]
    for r in replicas:
        r.create("a", AT)
        r.create("e", EVERY)
        r.claim_due(T0 + 10 * S)
        tasks = r.lease(T0 + 10 * S)
        r.apply(Op.NACK, now=T0 + 11 * S, worker_id="w", run_id=tasks[0]["run_id"], fence=tasks[0]["fence"], error="x")
        r.apply(Op.CANCEL_JOB, now=T0 + 12 * S, job_id="e")
    assert replicas[0].digest() == replicas[1].digest()


def test_priority_orders_the_ready_queue(d: Driver) -> None:
    d.create("low", AT, priority=0)
    d.create("high", AT, priority=9)
    runs = d.claim_due(T0 + 10 * S)
    by_job = {d.run(r)["job_id"]: r for r in runs}
    assert d.ready(T0 + 10 * S) == [by_job["high"], by_job["low"]]


@pytest.mark.parametrize("state", list(RunState))
@pytest.mark.parametrize("event", list(RunEvent))
def test_run_transition_table(state: RunState, event: RunEvent) -> None:
    if (state, event) in RUN_TRANSITIONS:
        assert run_transition(state.value, event) == RUN_TRANSITIONS[(state, event)].value
    else:
        with pytest.raises(IllegalTransition):
            run_transition(state.value, event)


@pytest.mark.parametrize("state", list(JobState))
@pytest.mark.parametrize("event", list(JobEvent))
def test_job_transition_table(state: JobState, event: JobEvent) -> None:
    if (state, event) in JOB_TRANSITIONS:
        assert job_transition(state.value, event) == JOB_TRANSITIONS[(state, event)].value
    else:
        with pytest.raises(IllegalTransition):
            job_transition(state.value, event)


def test_terminal_run_states_have_no_way_out() -> None:
    from schedulerd.storage.model import TERMINAL_RUN_STATES
    assert not [k for k in RUN_TRANSITIONS if k[0] in TERMINAL_RUN_STATES]


def test_oldest_first_serves_long_waiting_low_priority_runs(d: Driver) -> None:
    from schedulerd.storage import queries
    d.create("low", AT, priority=0)
    d.claim_due(T0 + 10 * S)
    d.create("high", {"kind": "at", "at_us": T0 + 20 * S}, priority=9)
    d.claim_due(T0 + 20 * S)
    with d.store.read() as txn:
        by_priority = queries.ready(txn, d.store.tables, ["q"], T0 + 30 * S, 1)
        oldest = queries.ready(txn, d.store.tables, ["q"], T0 + 30 * S, 1, oldest_first=True)
    assert d.run(by_priority[0][1])["job_id"] == "high"
    assert d.run(oldest[0][1])["job_id"] == "low"


def _lease_ready(d: Driver, now: int, grants: list[list[Any]]) -> dict[str, Any]:
    return d.apply(Op.LEASE_READY, now=now, lease_until=now + 30 * S, grants=grants)


def _pad_to_fair_entry(d: Driver, fair: bool) -> None:
    """Apply empty entries until the next one is (or is not) a longest-waiting-first entry."""
    while ((d.index + 1) % FAIR_EVERY == 0) != fair:
        d.apply(Op.EXPIRE_LEASES, now=T0, runs=[])


def test_lease_ready_gives_each_worker_in_turn_the_next_runs_by_priority(d: Driver) -> None:
    for i, priority in enumerate([0, 9, 5, 3]):
        d.create(f"j{i}", AT, priority=priority)
    d.create("elsewhere", AT, queue="other")
    job_of = {r: d.run(r)["job_id"] for r in d.claim_due(T0 + 10 * S)}
    _pad_to_fair_entry(d, False)
    res = _lease_ready(d, T0 + 10 * S, [["w1", ["q"], 2], ["w2", ["q"], 5], ["w3", ["q"], 1]])
    got = {w: [job_of[t["run_id"]] for t in tasks] for w, tasks in res["grants"]}
    assert got == {"w1": ["j1", "j2"], "w2": ["j3", "j0"], "w3": []}
    assert all(t["fence"] == d.index and t["worker_id"] == w and t["state"] == "running"
               for w, tasks in res["grants"] for t in tasks)
    assert d.ready(T0 + 10 * S, ("q", "other")) == [r for r, j in job_of.items() if j == "elsewhere"]


def test_lease_ready_takes_only_available_runs_and_skips_past_deadline_ones_without_counting_them(d: Driver) -> None:
    d.create("late", AT, starting_deadline_us=S)
    d.create("now", {"kind": "at", "at_us": T0 + 20 * S})
    d.create("soon", {"kind": "at", "at_us": T0 + 21 * S})
    d.claim_due(T0 + 10 * S)
    d.apply(Op.CLAIM_BATCH, now=T0 + 20 * S, grace_us=5 * S, claims=[list(c) for c in d.due(T0 + 21 * S)])
    _pad_to_fair_entry(d, False)
    res = _lease_ready(d, T0 + 20 * S, [["w", ["q"], 1]])
    assert [d.run(t["run_id"])["job_id"] for t in res["grants"][0][1]] == ["now"]
    assert res["skipped"] == 1
    assert [(r["state"], r["reason"]) for r in d.runs("late")] == [("skipped", "deadline")]
    assert [r["state"] for r in d.runs("soon")] == ["queued"]  # claimed ahead, available at 21 s


@pytest.mark.parametrize("fair, first", [(False, "high"), (True, "low")])
def test_every_fair_entry_serves_the_longest_waiting_run_first(d: Driver, fair: bool, first: str) -> None:
    d.create("low", AT, priority=0)
    d.claim_due(T0 + 10 * S)
    d.create("high", {"kind": "at", "at_us": T0 + 20 * S}, priority=9)
    d.claim_due(T0 + 20 * S)
    _pad_to_fair_entry(d, fair)
    (task,) = _lease_ready(d, T0 + 30 * S, [["w", ["q"], 1]])["grants"][0][1]
    assert d.run(task["run_id"])["job_id"] == first


def test_lease_ready_entries_give_byte_identical_replicas(tmp_path: pathlib.Path) -> None:
    replicas = [Driver(str(tmp_path / f"r{i}")) for i in range(2)]
    for r in replicas:
        for i in range(5):
            r.create(f"j{i}", AT, priority=i % 3)
        r.claim_due(T0 + 10 * S)
        _lease_ready(r, T0 + 10 * S, [["w1", ["q"], 2], ["w2", ["q", "other"], 2]])
        _lease_ready(r, T0 + 11 * S, [["w1", ["q"], 3]])
    assert replicas[0].digest() == replicas[1].digest()
