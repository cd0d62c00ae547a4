"""Queue limits in apply (storage/queue_limits.py): max_running and the max_starts_per_s token
bucket, carried by LEASE_READY entries, with the group's count of running runs per queue."""
from __future__ import annotations

import pathlib
from typing import Any

import pytest

from schedulerd.storage import meta, ops, queue_limits
from schedulerd.storage.ops import Op
from tests.unit.fsm_driver import Driver, S, T0

AT = {"kind": "at", "at_us": T0}


@pytest.fixture
def d(tmp_path: pathlib.Path) -> Driver:
    return Driver(str(tmp_path / "store"))


def _ready_runs(d: Driver, n: int, queue: str = "q", prefix: str = "j") -> None:
    """n one-off jobs of `queue`, each with a run ready now."""
    for i in range(n):
        d.create(f"{prefix}{i}", AT, queue=queue)
    d.claim_due(T0)


def _lease(d: Driver, now: int, want: int, limits: dict[str, list[Any]] | None = None,
           queues: tuple[str, ...] = ("q",), version: int = ops.VERSION) -> list[str]:
    payload: dict[str, Any] = {"now": now, "lease_until": now + 30 * S, "grants": [["w", list(queues), want]]}
    if limits is not None:
        payload["limits"] = limits
    result = d.apply(Op.LEASE_READY, version=version, **payload)
    return [t["run_id"] for t in result["grants"][0][1]]


def _running(d: Driver, queue: str = "q") -> int:
    with d.store.read() as txn:
        return queue_limits.running(txn, d.store.tables, queue)


def _ack(d: Driver, run_id: str, fence: int, now: int) -> None:
    result = d.apply(Op.ACK, now=now, worker_id="w", acks=[[run_id, fence, "null"]])
    assert result["results"][0]["ok"]


def test_max_running_caps_the_runs_leased_at_once_and_an_ack_frees_a_place(d: Driver) -> None:
    _ready_runs(d, 5)
    first = _lease(d, T0, 5, {"q": [1, 2, None]})
    assert len(first) == 2 and _running(d) == 2
    assert _lease(d, T0 + S, 5) == []  # the group keeps the limit; this entry carries none
    assert len(d.ready(T0 + S)) == 3
    run = d.run(first[0])
    _ack(d, run["run_id"], run["fence"], T0 + 2 * S)
    assert _running(d) == 1
    assert len(_lease(d, T0 + 3 * S, 5)) == 1 and _running(d) == 2


def test_a_run_leaving_running_any_way_is_counted_out(d: Driver) -> None:
    """Ack, nack, a run's cancel and expiry each free a place; a job's cancel leaves its running
    run to finish (its attempt goes on), so that run keeps its place until it ends."""
    _ready_runs(d, 5)
    runs = [d.run(r) for r in _lease(d, T0, 5, {"q": [1, 5, None]})]
    assert _running(d) == 5
    _ack(d, runs[0]["run_id"], runs[0]["fence"], T0 + S)
    d.apply(Op.NACK, now=T0 + S, run_id=runs[1]["run_id"], fence=runs[1]["fence"], worker_id="w", error="x")
    d.apply(Op.CANCEL_RUN, now=T0 + S, run_id=runs[2]["run_id"])
    d.apply(Op.CANCEL_JOB, now=T0 + S, job_id=runs[3]["job_id"])
    assert _running(d) == 2
    d.apply(Op.EXPIRE_LEASES, now=T0 + 60 * S, runs=[[r["run_id"], r["fence"]] for r in runs[3:]])
    assert _running(d) == 0


def test_the_token_bucket_grants_a_seconds_worth_then_refills_by_the_entrys_clock(d: Driver) -> None:
    _ready_runs(d, 20)
    rate = 4 * queue_limits.TOKEN  # 4 starts/s: a full bucket holds 4
    assert len(_lease(d, T0, 20, {"q": [1, None, rate]})) == 4
    assert _lease(d, T0 + S // 8, 20) == []  # half a token
    assert len(_lease(d, T0 + S // 2, 20)) == 2  # two tokens since the grant
    assert len(_lease(d, T0 + 100 * S, 20)) == 4  # never more than the bucket holds


def test_a_share_below_one_start_a_second_still_grants_one_start(d: Driver) -> None:
    _ready_runs(d, 3)
    assert len(_lease(d, T0, 3, {"q": [1, None, queue_limits.TOKEN // 10]})) == 1
    assert _lease(d, T0 + 9 * S, 3) == []
    assert len(_lease(d, T0 + 10 * S, 3)) == 1


def test_an_older_revision_changes_nothing_and_a_newer_one_lifts_the_limit(d: Driver) -> None:
    """A node whose metadata view lags carries older limits: the group keeps its newest."""
    _ready_runs(d, 6)
    assert len(_lease(d, T0, 6, {"q": [5, 1, None]})) == 1
    assert _lease(d, T0 + S, 6, {"q": [4, 10, None]}) == []
    assert len(_lease(d, T0 + 2 * S, 2, {"q": [6, None, None]})) == 2  # lifted
    assert _lease(d, T0 + 3 * S, 2, {"q": [5, 1, None]}) != []  # the older limit does not come back


def test_a_queue_at_its_limit_leaves_the_workers_other_queues_to_lease(d: Driver) -> None:
    _ready_runs(d, 3, queue="q", prefix="a")
    _ready_runs(d, 3, queue="other", prefix="b")
    leased = _lease(d, T0, 6, {"q": [1, 1, None]}, queues=("q", "other"))
    queues = sorted(d.run(r)["queue"] for r in leased)
    assert queues == ["other", "other", "other", "q"]


def test_limits_are_shared_by_the_workers_of_one_entry(d: Driver) -> None:
    _ready_runs(d, 6)
    result = d.apply(Op.LEASE_READY, now=T0, lease_until=T0 + 30 * S, limits={"q": [1, 3, None]},
                     grants=[["w1", ["q"], 2], ["w2", ["q"], 2]])
    assert [len(tasks) for _, tasks in result["grants"]] == [2, 1]


def test_a_run_past_its_starting_deadline_is_skipped_without_taking_a_place(d: Driver) -> None:
    d.create("late", AT, starting_deadline_us=S)
    d.create("ok", AT)
    d.claim_due(T0)
    leased = _lease(d, T0 + 10 * S, 2, {"q": [1, 1, queue_limits.TOKEN]})
    assert [d.run(r)["job_id"] for r in leased] == ["ok"]


def test_an_entry_before_version_21_grants_past_limits_and_counts_nothing(d: Driver) -> None:
    """An older build ignores the limits: so does this one, for an entry it wrote."""
    _ready_runs(d, 3)  # at version 21: the group counts from here on
    assert len(_lease(d, T0, 3, {"q": [1, 1, None]}, version=ops.QUEUE_LIMITS_SINCE - 1)) == 3
    assert _running(d) == 3


def test_counting_starts_from_the_lease_index_at_the_first_entry_of_version_21(tmp_path: pathlib.Path) -> None:
    """Runs leased by older entries are counted, so the limit holds across an upgrade."""
    d = Driver(str(tmp_path / "store"))
    old = ops.QUEUE_LIMITS_SINCE - 1
    for i in range(3):
        d.apply(Op.CREATE_JOBS, version=old, now=T0, jobs=[{"job_id": f"j{i}", "schedule": AT, "schedule_spec": {},
                                                            "queue": "q", "payload_json": "{}"}])
    d.apply(Op.CLAIM_BATCH, version=old, now=T0, grace_us=5 * S, claims=[[f"j{i}", T0] for i in range(3)])
    assert len(_lease(d, T0, 2, version=old)) == 2
    with d.store.read() as txn:
        assert not queue_limits.counting(txn, d.store.tables)
    assert _lease(d, T0 + S, 3, {"q": [1, 2, None]}) == []
    assert _running(d) == 2


def test_the_shares_of_max_running_add_up_to_it_and_spread_the_remainders() -> None:
    for groups in (1, 2, 3, 8):
        for limit in range(groups, 40):
            shares = [queue_limits.running_share(limit, groups, g, "q") for g in range(groups)]
            assert sum(shares) == limit and max(shares) - min(shares) <= 1
    starts = {q: [queue_limits.running_share(4, 3, g, q) for g in range(3)].index(2) for q in ("a", "b", "c", "d")}
    assert len(set(starts.values())) > 1


def test_the_shares_of_a_rate_add_up_to_no_more_than_it() -> None:
    for groups in (1, 3, 7):
        share = queue_limits.rate_share(10.5, groups)
        assert share * groups <= 10.5 * queue_limits.TOKEN and share * groups > 10.4 * queue_limits.TOKEN


def test_the_metadata_gives_each_write_the_next_revision_and_keeps_a_lifted_limit() -> None:
    state = meta.empty()
    state["cluster"] = {"groups": 3}
    base = {"op": "queue_limits_set", "now": T0, "queue_limits_max": 1}
    assert meta.apply(state, dict(base, queue="q", max_running=6, max_starts_per_s=None))["revision"] == 1
    refused = meta.apply(state, dict(base, queue="other", max_running=6, max_starts_per_s=None))
    assert not refused["ok"] and "queue_limits_max" in refused["error"]
    assert meta.apply(state, dict(base, queue="q", max_running=None, max_starts_per_s=None))["revision"] == 2
    assert state["queue_limits"]["q"]["revision"] == 2
    assert meta.apply(state, dict(base, queue="other", max_running=3, max_starts_per_s=2.5))["revision"] == 3
    carried = queue_limits.carried(state["queue_limits"], ["q", "other", "none"], 3, 0)
    assert carried == {"q": [2, None, None], "other": [3, 1, 833_333]}
