"""Model check of the replicated state machine.

Hypothesis drives random command sequences through the real apply
(storage/fsm.apply on a temp LMDB, via fsm_driver.Driver) and through the
reference model in tests/unit/model.py, and after every applied command
checks the store's own invariants (index consistency, one run per
occurrence, legal transitions, growing fences, job_stats) and compares it with
the model. A second Driver replays the same entries and must end byte for byte
identical.

Size: SCHEDULERD_MODEL_EXAMPLES (default 100) sequences of up to
SCHEDULERD_MODEL_STEPS (default 40) steps; for a soak run e.g.
`SCHEDULERD_MODEL_EXAMPLES=2000 python -m pytest tests/unit/test_model.py`.
Hypothesis prints the failing sequence of steps; that is the reproduction."""
from __future__ import annotations

import copy
import hashlib
import os
import pathlib
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import msgpack
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from schedulerd.storage import keys, ops, queries, queue_limits, records, retention
from schedulerd.storage.codec import unpack
from schedulerd.storage.jobs import SPEC_DEFAULTS
from schedulerd.storage.layouts import JOBS, RUNS
from schedulerd.storage.model import JOB_TRANSITIONS, RUN_TRANSITIONS
from schedulerd.storage.ops import Op
from schedulerd.storage.tables import DB_NAMES, LAST_APPLIED
from tests.unit.fsm_driver import S, T0, Driver
from tests.unit.model import PENDING, TERMINAL, Model, next_after, next_at_or_after

EXAMPLES = int(os.environ.get("SCHEDULERD_MODEL_EXAMPLES", "100"))
STEPS = int(os.environ.get("SCHEDULERD_MODEL_STEPS", "40"))
GRACE_US = 5 * S  # NodeConfig.misfire_grace_s default
# (lookahead_us, grace_us) of a claim: NodeConfig's defaults (12 s, 5 s), a short grace, and
# lookaheads shorter and longer than the shortest period and than the grace.
CLAIM_WINDOWS = st.sampled_from([(12 * S, GRACE_US), (12 * S, GRACE_US), (4 * S, GRACE_US), (1 * S, 2 * S),
                                 (1 * S, GRACE_US), (3 * S, GRACE_US), (12 * S, 2 * S)])
CLAIM_ROUNDS_MAX = 50  # claim rounds at one `now`; catching up a 1 s job over the grace takes ~7
REPLICA_EVERY_STEPS = 8  # steps between replica digest comparisons (and one at teardown)
GHOST_RUN = "0-999999-0"

JOB_IDS = ("a", "b", "c", "d")
TARGETS = JOB_IDS + ("ghost",)  # "ghost" is never created: not_found paths
WORKERS = ("w1", "w2", "w3")
LEGAL_RUN = {(s.value, t.value) for (s, _), t in RUN_TRANSITIONS.items()}
LEGAL_JOB = {(s.value, t.value) for (s, _), t in JOB_TRANSITIONS.items()}
RUN_FIELDS = ("job_id", "scheduled_us", "state", "attempt", "max_attempts", "fence", "worker_id", "lease_until_us",
              "finished_us", "reason", "trigger", "priority", "available_us", "buffered")
JOB_FIELDS = ("state", "next_fire_us", "schedule", "priority", "max_attempts", "payload_json", "misfire_policy",
              "overlap_policy", "catchup_limit", "starting_deadline_us", "timeout_us", "history_limit", "jitter_us",
              "backoff", "finished_ttl_us", "history_ttl_us", "keep_dead_letters", "max_runs", "runs_made",
              "pause_on_failure", "pause_cause", "skip_calendar", "traceparent", "tracestate")

Rec = dict[str, Any]

# -- strategies ------------------------------------------------------------------------------

TIME_STEPS = st.one_of(
    st.sampled_from([0, 1, S // 2, S, 2 * S, 5 * S]),  # boundaries: fire == now, fire == cutoff
    st.integers(1, 12).map(lambda k: k * S // 2),  # on the occurrence grid
    st.integers(1, 3 * S),
    st.integers(4 * S, 20 * S),
    st.integers(30, 600).map(lambda k: k * S),  # an outage: misfires, catch-up limits
    st.integers(30 * S, 600 * S),
)
# ("at", offset from now) or ("every", period); resolved against `now` in the rule.
SCHEDULES = st.one_of(
    st.tuples(st.just("at"), st.sampled_from([-30 * S, -6 * S, -S, 0, S // 2, S, 3 * S, 10 * S])),
    st.tuples(st.just("every"), st.sampled_from([1 * S, 2 * S, 3 * S, 5 * S, 10 * S])),
    # An interval with bounds (entry version 13): its every, when it starts and how long it lasts.
    st.tuples(st.just("bounded"), st.tuples(st.sampled_from([1 * S, 2 * S, 5 * S]), st.sampled_from([-4 * S, 0, 3 * S]),
                                            st.sampled_from([0, 4 * S, 20 * S]))),
)
BACKOFFS = st.sampled_from([{"base_ms": 1000, "factor": 2.0, "max_ms": 300_000},
                            {"base_ms": 200, "factor": 3.0, "max_ms": 1000}])
OPTIONS = {
    "misfire_policy": st.sampled_from(["fire_all", "fire_once", "skip"]),
    "overlap_policy": st.sampled_from(["allow", "allow", "skip", "buffer_one", "buffer_all", "cancel_other"]),
    "max_attempts": st.integers(1, 3),
    "catchup_limit": st.sampled_from([1, 2, 3, 4, 20, 100]),  # small, and the default
    "starting_deadline_us": st.one_of(st.none(), st.sampled_from([1 * S, 3 * S, 10 * S])),
    "timeout_us": st.one_of(st.none(), st.sampled_from([2 * S, 10 * S])),
    "history_limit": st.integers(1, 5),
    "priority": st.integers(0, 2),
    "jitter_us": st.sampled_from([0, 0, 0, 1_500_000]),
    "backoff": BACKOFFS,
}
# A job's retention, from entry version 11 (the API sends it only then); a create entry's
# default TTL is DEFAULT_TTL_US.
RETENTION = {"finished_ttl_us": st.sampled_from([0, 1 * S, 3 * S]), "history_ttl_us": st.sampled_from([0, 2 * S]),
             "keep_dead_letters": st.booleans()}
DEFAULT_TTL_US = 2 * S
# Optional fields of a create beside its retention: max_runs, from entry version 14.
OPTIONAL = {**RETENTION, "max_runs": st.sampled_from([1, 2, 3]), "pause_on_failure": st.booleans(),
            "skip_calendar": st.sampled_from(["hol", "gone"]),
            # A create's trace context (entry version 20): stored as given, kept through every change.
            "traceparent": st.just("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            "tracestate": st.just("vendor=1")}
# The calendars a claim entry carries (entry version 19): "hol" in one of two zones, "gone"
# never (deleted, or unknown to the proposer: it skips nothing). T0 is 08:00 UTC on
# 2027-01-15, midnight starting that day in Los Angeles (UTC-8 in January): the LA ranges
# split the occurrences around T0 between two local days.
CALENDARS = st.one_of(st.just(None), st.builds(
    lambda tz, ranges: {"hol": {"timezone": tz, "ranges": ranges}},
    st.sampled_from(["UTC", "America/Los_Angeles"]),
    st.sampled_from([[["2027-01-14", "2027-01-14"]], [["2027-01-15", "2027-01-16"]],
                     [["2027-01-01", "2027-01-14"], ["2027-01-16", "2027-01-20"]], [["2026-12-24", "2026-12-26"]]])))
# An update's backoff names some of its parts; {"max_ms": 100} is below every base_ms
# the jobs have, so apply refuses it.
BACKOFF_PARTS = st.sampled_from([{"base_ms": 200}, {"max_ms": 1000}, {"factor": 3.0}, {"max_ms": 100},
                                 {"base_ms": 1000, "factor": 2.0, "max_ms": 300_000}])
CHANGES = st.fixed_dictionaries({}, optional={
    "schedule": SCHEDULES, "payload_json": st.sampled_from(['"v2"', "{}"]), "backoff": BACKOFF_PARTS,
    **{k: OPTIONS[k] for k in ("priority", "max_attempts", "starting_deadline_us", "timeout_us",
                               "overlap_policy", "misfire_policy", "history_limit", "catchup_limit")},
    "max_runs": st.sampled_from([None, 1, 2, 4]), "skip_calendar": st.sampled_from([None, "hol"])})
# A lease entry's queue limits: [revision (older ones are ignored), max_running share, micro-tokens/s].
CARRIED_LIMITS = st.dictionaries(
    st.sampled_from(["q", "other"]),
    st.tuples(st.integers(1, 4), st.one_of(st.none(), st.integers(0, 2)),
              st.one_of(st.none(), st.sampled_from([queue_limits.TOKEN // 4, queue_limits.TOKEN, 2 * queue_limits.TOKEN]))),
    min_size=1, max_size=2)
QUEUE_LIMITS = st.one_of(st.none(), CARRIED_LIMITS)
POLLS = st.lists(st.tuples(st.sampled_from(WORKERS), st.sampled_from([("q",), ("other", "q"), ("other",)]),
                           st.integers(1, 4)), min_size=1, max_size=3)
ZOMBIE_OPS = st.sampled_from([Op.ACK, Op.NACK, Op.HEARTBEAT, Op.EXPIRE_LEASES])
# holder: the live lease's worker and fence; zombie: an earlier lease of any run, as granted;
# wrong_fence / wrong_worker: the current run with an older fence, or another worker.
LEASE_MODES = st.sampled_from(["holder", "holder", "holder", "zombie", "wrong_fence", "wrong_worker", "ghost"])
SMALL_STEPS = st.one_of(st.just(0), st.integers(1, 3 * S))
PICK = st.integers(0, 63)
# Entries are written at this build's version; one written earlier (before a rolling restart)
# keeps the rules it had: at 1 no withdrawal by pause or update and no deferred claims, before
# 3 no claim in the creating entry, before 4 every job's run counts stored.
COUNTS = ("pending", "running", "runs")  # of job_stats; the rest says where pruning starts
VERSIONS = st.sampled_from([ops.VERSION] * 4 + [10, 9, 8, 7, 6, 3, 2, 1])


def resolve(schedule: tuple[str, Any], now: int) -> Rec:
    kind, value = schedule
    if kind == "at":
        return {"kind": "at", "at_us": now + value}
    if kind == "bounded":
        every, start, span = value
        return {"kind": "every", "every_us": every, "anchor_us": now + start - every, "start_us": now + start,
                "end_us": now + start + span}
    return {"kind": "every", "every_us": value, "anchor_us": now}


# -- reading the real store --------------------------------------------------------------------

@dataclass
class Snapshot:
    jobs: dict[str, Rec]
    runs: dict[str, Rec]
    occurrences: dict[tuple[str, int], str]
    stats: dict[str, Rec]
    counts_asked: dict[str, Rec]  # what records.job_stats answers the rules, for every job
    due: set[bytes]
    ready: set[bytes]
    leases: set[bytes]
    dead_letters: set[bytes]
    job_state_counts: dict[str, int]
    running_counts: dict[str, int] | None  # per queue, as the group counts them (None: it does not)


def scan(d: Driver) -> Snapshot:
    """Every table, read directly: the invariants must not trust the code under test."""
    t = d.store.tables
    with d.store.read() as txn:
        def items(db: object) -> list[tuple[bytes, bytes]]:
            with txn.cursor(db=db) as cur:
                return [(bytes(k), bytes(v)) for k, v in cur]
        occurrences = {}
        for k, v in items(t.occurrences):
            job_id, _, scheduled = k.partition(b"\x00")  # job ids never hold a NUL
            occurrences[(job_id.decode(), keys.read_u64(scheduled))] = v.decode()
        ctx = records.Ctx(txn, t, 0, 0, ops.VERSION)
        jobs = {k.decode(): JOBS.unpack(v) for k, v in items(t.jobs)}
        return Snapshot(
            jobs=jobs,
            runs={k.decode(): RUNS.unpack(v) for k, v in items(t.runs)},
            occurrences=occurrences,
            stats={k.decode(): unpack(v) for k, v in items(t.job_stats)},
            counts_asked={job_id: {k: v for k, v in records.job_stats(ctx, job_id).items() if k in COUNTS}
                          for job_id in jobs},
            job_state_counts=unpack(txn.get(keys.JOB_STATE_COUNTS, db=t.meta) or msgpack.packb({})),
            due={k for k, _ in items(t.due)}, ready={k for k, _ in items(t.ready)},
            leases={k for k, _ in items(t.leases)}, dead_letters={k for k, _ in items(t.dead_letters)},
            running_counts={q: queue_limits.running(txn, t, q) for q in ("q", "other")}
            if queue_limits.counting(txn, t) else None)


def state_digest(d: Driver) -> str:
    """Driver.digest() without last_applied, which every entry (rejected or not) advances, and
    without the mark a group's first entry of version 21 leaves (queue_limits.start_counting)."""
    h = hashlib.sha256()
    with d.store.read() as txn:
        for name in DB_NAMES:
            with txn.cursor(db=getattr(d.store.tables, name)) as cur:
                for k, v in cur:
                    if not (name == "meta" and k in (LAST_APPLIED, queue_limits.COUNTED)):
                        h.update(name.encode() + k + b"\x00" + v)
    return h.hexdigest()


def normalize(op: Op, res: Rec) -> Any:
    """The parts of a result the model predicts."""
    if op == Op.CREATE_JOBS:
        return [(r["job_id"], r["ok"], r.get("code")) for r in res["results"]], res["runs"]
    if op == Op.CLAIM_BATCH:
        return res["runs"], res["skipped"], res["stale"], [tuple(item) for item in res["deferred"]]
    if op in (Op.LEASE_BATCH, Op.LEASE_READY):
        return [(w, [task["run_id"] for task in tasks]) for w, tasks in res["grants"]], res["skipped"]
    if op == Op.HEARTBEAT:
        return [(r["run_id"], r["ok"], r.get("code"), r.get("lease_until_us")) for r in res["results"]]
    if op == Op.ACK:
        return [(r["run_id"], r["ok"], r.get("code")) for r in res["results"]]
    if op == Op.NACK:
        return res["ok"], res.get("code"), res["run"]["state"] if res["ok"] else None
    if op == Op.EXPIRE_LEASES:
        return res["expired"], res["dead_letter"]
    if op == Op.CANCEL_JOB:
        return res["ok"], res.get("code"), res.get("cancelled_runs")
    if op == Op.SWEEP_EXPIRED:
        return res["deleted_jobs"], res["deleted_runs"]
    if op == Op.PURGE_JOB:
        return res["ok"], res.get("code"), res.get("done")
    if op == Op.BACKFILL_JOB:
        return res["ok"], res.get("code"), res.get("runs")
    if op == Op.TRIGGER_JOB:
        return res["ok"], res.get("code"), res["run"]["run_id"] if res["ok"] else None
    return res["ok"], res.get("code")


# -- invariants -------------------------------------------------------------------------------

def check_store(snap: Snapshot) -> None:
    """What must hold of any store, whatever the commands were."""
    by_occurrence: dict[tuple[str, int], str] = {}
    for run_id, run in snap.runs.items():
        occ = (run["job_id"], run["scheduled_us"])
        assert occ not in by_occurrence, f"runs {by_occurrence[occ]} and {run_id} share occurrence {occ}"
        by_occurrence[occ] = run_id
        assert 0 <= run["attempt"] <= run["max_attempts"], f"{run_id}: attempt {run['attempt']}/{run['max_attempts']}"
        if run["state"] == "running":
            assert run["fence"] > 0 and run["worker_id"] and run["lease_until_us"] is not None, \
                f"{run_id}: running without a full lease: {run}"
    assert snap.occurrences == by_occurrence, "occurrences table disagrees with the runs"
    due = {keys.due_key(keys.shard_of(j), job["next_fire_us"], j) for j, job in snap.jobs.items()
           if job["state"] == "scheduled" and job["next_fire_us"] is not None}
    assert snap.due == due, f"due index {sorted(snap.due)} != scheduled jobs' next fire {sorted(due)}"
    for job_id, job in snap.jobs.items():
        assert job["state"] == "scheduled" or job["next_fire_us"] is None, f"{job_id} {job['state']} has a fire time"
    by_state = Counter(job["state"] for job in snap.jobs.values())
    assert {k: v for k, v in snap.job_state_counts.items() if v} == dict(by_state), \
        f"job state counts {snap.job_state_counts} != the jobs' states {dict(by_state)}"
    runs = snap.runs.values()
    assert snap.leases == {keys.lease_key(r["lease_until_us"], r["run_id"]) for r in runs if r["state"] == "running"}, \
        "lease index != running runs"
    assert snap.ready == {keys.ready_key(r["queue"], r["priority"], r["available_us"], r["run_id"])
                          for r in runs if r["state"] in PENDING and not r.get("buffered")}, \
        "ready index != queued/retry_wait runs not buffered"
    if snap.running_counts is not None:
        counted = {q: sum(r["state"] == "running" and r["queue"] == q for r in runs) for q in snap.running_counts}
        assert snap.running_counts == counted, f"running counts {snap.running_counts} != running runs {counted}"
    assert snap.dead_letters == {keys.dead_letter_key(r["finished_us"], r["run_id"])
                                 for r in runs if r["state"] == "dead_letter"}, "dead-letter index != dead letters"
    for job_id in snap.jobs.keys() | snap.stats.keys():
        mine = [r for r in runs if r["job_id"] == job_id]
        counted = {"pending": sum(r["state"] in PENDING for r in mine),
                   "running": sum(r["state"] == "running" for r in mine), "runs": len(mine)}
        held = sum(r["state"] in PENDING and bool(r.get("buffered")) for r in mine)
        assert held == 0 or any(r["state"] == "running" or (r["state"] in PENDING and not r.get("buffered"))
                                for r in mine), f"job {job_id}: {held} buffered runs wait behind no open run"
        # A job without stored counts has them counted from its runs when a rule asks.
        if job_id in snap.stats:
            stored = dict(snap.stats[job_id])
            head = (stored.pop("dead_until_us", None), stored.pop("dead_behind", None))
            assert stored.pop("buffered", 0) == held, f"job_stats[{job_id}] = {snap.stats[job_id]}: {held} buffered"
            assert stored == counted, f"job_stats[{job_id}] = {snap.stats[job_id]}, its runs say {counted}"
            if head[0] is not None:  # where history pruning starts: after dead letters only
                behind = [r["state"] for r in mine if r["scheduled_us"] <= head[0]]
                assert behind == ["dead_letter"] * head[1], f"job {job_id}: {head} but {behind} behind it"
        if job_id in snap.jobs:
            assert snap.counts_asked[job_id] == counted, \
                f"the rules see {job_id}'s counts as {snap.counts_asked[job_id]}, its runs say {counted}"


def check_transitions(before: Snapshot, after: Snapshot, now: int | None, op: Op) -> None:
    """Across one command: states move along the tables, fences and attempts only grow;
    a run goes away only when it is finished or was claimed ahead of `now` and never started
    (or is a dead letter discarded); a job only when it is purged, finished."""
    for run_id, run in after.runs.items():
        old = before.runs.get(run_id)
        if old is None:
            assert run["state"] in ("queued", "skipped"), f"{run_id} born {run['state']}"
            continue
        move = (old["state"], run["state"])
        assert move[0] == move[1] or move in LEGAL_RUN, f"{run_id}: illegal {move[0]} -> {move[1]}"
        assert run["fence"] >= old["fence"] and run["attempt"] >= old["attempt"], f"{run_id}: fence/attempt shrank"
        if run["state"] == "running" and (old["state"] != "running" or run["fence"] != old["fence"]):
            assert run["fence"] > old["fence"], f"{run_id}: re-leased without a greater fence"
    withdrew = False
    for run_id, old in before.runs.items():
        if run_id not in after.runs:
            ahead = now is not None and old["scheduled_us"] > now and not old["trigger"]
            discarded = op in (Op.DISCARD_RUN, Op.PURGE_JOB, Op.SWEEP_EXPIRED) and old["state"] == "dead_letter"
            assert old["state"] in TERMINAL or (ahead and old["state"] == "queued") or discarded, \
                f"{run_id} deleted while {old['state']}"
            withdrew = withdrew or ahead
    for job_id, job in after.jobs.items():
        old = before.jobs.get(job_id)
        if old is None:
            assert job["state"] in ("scheduled", "completed"), f"job {job_id} born {job['state']}"
        else:
            move = (old["state"], job["state"])
            # A pause that withdraws a completed job's run claimed ahead re-arms it, then pauses it;
            # a resume of a bounded job past its end re-arms it and finds no occurrence left.
            two_steps = (withdrew and move == ("completed", "paused")) or \
                (op == Op.RESUME_JOB and move == ("paused", "completed"))
            assert move[0] == move[1] or move in LEGAL_JOB or two_steps, f"job {job_id}: illegal {move[0]} -> {move[1]}"
    for job_id in before.jobs.keys() - after.jobs.keys():
        assert op in (Op.PURGE_JOB, Op.SWEEP_EXPIRED) and before.jobs[job_id]["state"] in ("completed", "cancelled"), \
            f"job {job_id} disappeared while {before.jobs[job_id]['state']}"


def check_model(model: Model, snap: Snapshot) -> None:
    assert snap.jobs.keys() == model.jobs.keys(), f"jobs {sorted(snap.jobs)} != model {sorted(model.jobs)}"
    for job_id, job in model.jobs.items():
        real = {f: snap.jobs[job_id].get(f) for f in JOB_FIELDS}
        assert real == {f: job.get(f) for f in JOB_FIELDS}, f"job {job_id}: store {real} != model {job}"
    assert snap.runs.keys() == model.runs.keys(), \
        f"runs {sorted(snap.runs)} != model {sorted(model.runs)}"
    for run_id, run in model.runs.items():
        fields = RUN_FIELDS + tuple(f for f in ("skipped_count", "skipped_until_us") if f in run)
        real = {f: snap.runs[run_id].get(f) for f in fields}
        want = {f: run.get(f) for f in fields}
        assert real == want, f"run {run_id}: store {real} != model {want}"


# -- the machine --------------------------------------------------------------------------------

class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="schedulerd-model-")
        self.d = Driver(os.path.join(self.tmp, "main"))
        self.replica: Driver | None = None
        self.model = Model()
        self.now = T0
        self.log: list[tuple[Op, int, Rec]] = []
        self.replayed = 0
        self.claimed: list[list[Any]] = []  # every (job_id, fire_us) proposed, for stale replays
        self.granted: list[tuple[str, str, int]] = []  # every (run_id, worker_id, fence) leased
        self.snap = scan(self.d)
        self.steps = 0

    def propose(self, op: Op, model_fn: Callable[[int, Rec], tuple[Any, bool]], version: int = ops.VERSION,
                **payload: Any) -> Rec:
        """Apply one entry (written at `version`) to the model and the store, then check everything."""
        self.model.entry_version = version
        expected, rejected = model_fn(self.d.index + 1, payload)
        self.model.release(payload.get("now", 0))
        before = state_digest(self.d) if rejected else None
        result = self.d.apply(op, version=version, **payload)
        self.log.append((op, version, copy.deepcopy(payload)))
        if op in (Op.LEASE_BATCH, Op.LEASE_READY):
            self.granted += [(t["run_id"], w, t["fence"]) for w, tasks in result["grants"] for t in tasks]
        got = normalize(op, result)
        assert got == expected, f"{op.name}: store answered {got}, model expected {expected}"
        if rejected:
            assert state_digest(self.d) == before, f"{op.name} changed nothing per the model, but the store changed"
        snap = scan(self.d)
        check_store(snap)
        check_transitions(self.snap, snap, payload.get("now"), op)
        self.snap = snap
        self.model.settle(snap.runs)
        check_model(self.model, snap)
        return result

    def _run_ids(self, pred: Callable[[Rec], bool] = lambda r: True) -> list[str]:
        return sorted((r["run_id"] for r in self.model.runs.values() if pred(r)), key=lambda i: i.encode())

    # -- time and jobs ----------------------------------------------------------------------

    @rule(dt=TIME_STEPS)
    def advance(self, dt: int) -> None:
        self.now += dt

    def _spec(self, job_id: str, schedule: tuple[str, int], opts: Rec) -> tuple[Rec, set[str]]:
        """The whole spec, and the names of the fields a request gave."""
        return (dict(SPEC_DEFAULTS, job_id=job_id, schedule=resolve(schedule, self.now), schedule_spec={}, queue="q",
                     payload_json="{}", **opts), {"queue", "payload_json", *opts})

    def _create(self, specs: list[tuple[Rec, set[str]]], window: tuple[int, int], version: int) -> None:
        """As the API proposes it: the entry claims what is due within the node's lookahead."""
        lookahead, grace = window
        if version >= ops.SPEC_DEFAULTS_SINCE:  # as the API sends them: only the fields given
            specs = [{k: v for k, v in spec.items() if k not in SPEC_DEFAULTS or k in given} for spec, given in specs]
        else:
            specs = [spec for spec, _ in specs]
        if version < ops.RETENTION_SINCE:
            specs = [{k: v for k, v in spec.items() if k not in RETENTION} for spec in specs]
        if version < ops.CALENDAR_SINCE:  # the API refuses skip_calendar until every voter reads 19
            specs = [{k: v for k, v in spec.items() if k != "skip_calendar"} for spec in specs]
        if version < ops.TRACE_SINCE:  # the API creates the job without its trace context until every voter reads 20
            specs = [{k: v for k, v in spec.items() if k not in ("traceparent", "tracestate")} for spec in specs]
        self.propose(Op.CREATE_JOBS, self.model.create, version, now=self.now, jobs=specs, claim_ahead_us=lookahead,
                     grace_us=grace, finished_ttl_us=DEFAULT_TTL_US)

    @initialize(jobs=st.lists(st.tuples(st.sampled_from(JOB_IDS), SCHEDULES,
                                        st.fixed_dictionaries(OPTIONS, optional=OPTIONAL)),
                              min_size=1, max_size=3), window=CLAIM_WINDOWS, version=VERSIONS)
    def seed(self, jobs: list[tuple[str, tuple[str, int], Rec]], window: tuple[int, int], version: int) -> None:
        """Every sequence starts with jobs, so the steps after have something to act on."""
        self._create([self._spec(j, schedule, opts) for j, schedule, opts in jobs], window, version)

    @precondition(lambda self: len(self.model.jobs) < len(JOB_IDS))  # a conflict still comes up often
    @rule(job_ids=st.lists(st.sampled_from(JOB_IDS), min_size=1, max_size=2), schedule=SCHEDULES,
          opts=st.fixed_dictionaries(OPTIONS, optional=OPTIONAL), window=CLAIM_WINDOWS, version=VERSIONS)
    def create(self, job_ids: list[str], schedule: tuple[str, int], opts: Rec, window: tuple[int, int],
               version: int) -> None:
        self._create([self._spec(j, schedule, opts) for j in job_ids], window, version)

    @rule(job_id=st.sampled_from(TARGETS), version=VERSIONS)
    def cancel(self, job_id: str, version: int) -> None:
        self.propose(Op.CANCEL_JOB, self.model.cancel, version, now=self.now, job_id=job_id)

    @rule(dt=st.sampled_from([0, 1 * S, 2 * S, 5 * S, 40 * S]), runs_max=st.integers(1, 6),
          drop=st.frozensets(PICK, max_size=2))
    def sweep(self, dt: int, runs_max: int, drop: frozenset[int]) -> None:
        """The leader's sweep after dt: the due expiry keys, judged on the store as the proposer
        judges them; `drop` leaves some runs unnamed, as if the archive had not taken them."""
        self.now += dt
        with self.d.store.read() as txn:
            due = queries.expiry_due(txn, self.d.store.tables, self.now, 50)
            verdicts = retention.plan(records.Ctx(txn, self.d.store.tables, 0, 0, ops.VERSION), due, self.now,
                                      runs_max)
        named = [r for _, _, v in verdicts for r in v.runs]
        unnamed = {named[i % len(named)] for i in drop} if named else set()
        checks = [[c, j, [r for r in v.runs if r not in unnamed], v.job] for c, j, v in verdicts]
        if checks:
            updated = {j: job["updated_us"] for j, job in self.snap.jobs.items()}
            self.propose(Op.SWEEP_EXPIRED, lambda index, cmd: self.model.sweep(index, cmd, updated), now=self.now,
                         runs_max=runs_max, checks=checks)

    @rule(job_id=st.sampled_from(TARGETS), runs_max=st.integers(1, 3))
    def purge(self, job_id: str, runs_max: int) -> None:
        self.propose(Op.PURGE_JOB, self.model.purge, now=self.now, job_id=job_id, runs_max=runs_max)

    @precondition(lambda self: self.model.runs)
    @rule(i=PICK)
    def discard(self, i: int) -> None:
        """A dead letter when there is one, else any run (a conflict)."""
        pool = self._run_ids(lambda r: r["state"] == "dead_letter") or self._run_ids()
        self.propose(Op.DISCARD_RUN, self.model.discard, now=self.now, run_id=pool[i % len(pool)])

    @rule(job_id=st.sampled_from(TARGETS), version=VERSIONS)
    def pause(self, job_id: str, version: int) -> None:
        self.propose(Op.PAUSE_JOB, self.model.pause, version, now=self.now, job_id=job_id)

    @rule(job_id=st.sampled_from(TARGETS), version=VERSIONS)
    def resume(self, job_id: str, version: int) -> None:
        self.propose(Op.RESUME_JOB, self.model.resume, version, now=self.now, job_id=job_id)

    @rule(job_id=st.sampled_from(TARGETS), changes=CHANGES, version=VERSIONS)
    def update(self, job_id: str, changes: Rec, version: int) -> None:
        if "backoff" in changes and version < ops.BACKOFF_PARTS_SINCE:
            # Builds before it sent the whole backoff, completed from the job as they read it.
            job = self.model.jobs.get(job_id)
            whole = {**(job.get("backoff") or SPEC_DEFAULTS["backoff"]), **changes["backoff"]} if job else None
            if whole is None or whole["max_ms"] < whole["base_ms"]:
                changes = {k: v for k, v in changes.items() if k != "backoff"}
            else:
                changes = dict(changes, backoff=whole)
        if "schedule" in changes:
            changes = dict(changes, schedule=resolve(changes["schedule"], self.now), schedule_spec={})
        self.propose(Op.UPDATE_JOB, self.model.update, version, now=self.now, job_id=job_id, changes=changes)

    @rule(job_id=st.sampled_from(TARGETS), align=st.booleans(), ahead=st.integers(0, 3))
    def trigger(self, job_id: str, align: bool, ahead: int) -> None:
        """With `align`, the trigger lands exactly on an occurrence time of an interval job, at
        least `ahead` periods past its next fire time (no scan claimed it meanwhile). That run
        then stands for the occurrence: no second run, not even in a later catch-up."""
        job = self.model.jobs.get(job_id)
        if align and job is not None and job["schedule"]["kind"] == "every":
            nxt, every = job["next_fire_us"], job["schedule"]["every_us"]
            target = self.now if nxt is None else max(self.now, nxt + ahead * every)
            self.now = next_at_or_after(job["schedule"], target) or self.now
        self.propose(Op.TRIGGER_JOB, self.model.trigger, now=self.now, job_id=job_id)

    # -- claims -------------------------------------------------------------------------------

    @rule(dt=st.one_of(st.just(0), TIME_STEPS),
          drop=st.one_of(st.just(frozenset()), st.frozensets(st.sampled_from(JOB_IDS), min_size=1, max_size=2)),
          window=CLAIM_WINDOWS, version=VERSIONS, calendars=CALENDARS)
    def claim(self, dt: int, drop: frozenset[str], window: tuple[int, int], version: int,
              calendars: Rec | None) -> None:
        """What the leader's due scan does (after dt passes), repeated at one `now` until
        nothing is due; the jobs in `drop` are deliberately never proposed."""
        self.now += dt
        lookahead, grace = window
        until = self.now + lookahead
        deferred: set[tuple[str, int]] = set()  # as the leader: not proposed again before they are due
        for _ in range(CLAIM_ROUNDS_MAX):
            due = self.d.due(until)
            assert set(due) == self.model.due(until), f"due {due} != model {self.model.due(until)}"
            batch = [[j, fire] for j, fire in due if j not in drop and (j, fire) not in deferred]
            if not batch:
                break
            self.claimed.extend(batch)
            carried = {} if calendars is None else {"calendars": calendars}
            result = self.propose(Op.CLAIM_BATCH, self.model.claim, version, now=self.now, grace_us=grace,
                                  claims=batch, **carried)
            deferred.update((j, fire) for j, fire in result["deferred"])
        else:
            raise AssertionError(f"claims at {self.now} did not converge in {CLAIM_ROUNDS_MAX} rounds")
        left = {j for j, job in self.snap.jobs.items() if job["state"] == "scheduled" and job["next_fire_us"] <= until}
        assert left <= drop | {j for j, fire in deferred if fire > self.now}, f"due and unclaimed after the claim: {left}"

    @precondition(lambda self: self.claimed)
    @rule(i=st.integers(0, 1000), n=st.integers(1, 3))
    def replay_claim(self, i: int, n: int) -> None:
        """An old proposal again (stale leader, retried entry): must change nothing unless it is current."""
        start = i % len(self.claimed)
        self.propose(Op.CLAIM_BATCH, self.model.claim, now=self.now, grace_us=GRACE_US,
                     claims=self.claimed[start:start + n])

    # -- leases -------------------------------------------------------------------------------

    @rule(workers=st.lists(st.sampled_from(WORKERS), min_size=1, max_size=2, unique=True),
          skip_mask=st.one_of(st.just(0), st.integers(1, 255)), extra=st.lists(PICK, max_size=2),
          ghost=st.booleans(), lease_s=st.sampled_from([2, 5, 30]), dt=SMALL_STEPS)
    def lease(self, workers: list[str], skip_mask: int, extra: list[int], ghost: bool, lease_s: int,
              dt: int) -> None:
        self.now += dt
        ready = self.d.ready(self.now)
        assert ready == self.model.ready(self.now), f"ready {ready} != model {self.model.ready(self.now)}"
        ids = [r for n, r in enumerate(ready) if not skip_mask >> (n % 8) & 1]
        every = self._run_ids()
        ids += [every[i % len(every)] for i in extra if every] + ([GHOST_RUN] if ghost else [])
        grants = [[workers[0], ids]] + [[w, ids[::-1]] for w in workers[1:]]  # a second worker asks for the same
        self.propose(Op.LEASE_BATCH, self.model.lease, now=self.now, lease_until=self.now + lease_s * S,
                     grants=grants)

    @rule(polls=POLLS, lease_s=st.sampled_from([2, 5, 30]), dt=SMALL_STEPS, limits=QUEUE_LIMITS)
    def lease_ready(self, polls: list[tuple[str, tuple[str, ...], int]], lease_s: int, dt: int,
                    limits: dict[str, tuple[int, int | None, int | None]] | None) -> None:
        """Polls of one or more workers as a node coalesces them: apply picks the runs, within
        the queue limits the entry carries (of any revision) or the group keeps."""
        self.now += dt
        extra = {} if limits is None else {"limits": {q: list(limit) for q, limit in limits.items()}}
        self.propose(Op.LEASE_READY, self.model.lease_ready, now=self.now, lease_until=self.now + lease_s * S,
                     grants=[[worker, list(queues), want] for worker, queues, want in polls], **extra)

    @rule(polls=POLLS, limits=CARRIED_LIMITS, gaps=st.lists(st.sampled_from([0, S // 8, S // 2, 2 * S]), min_size=2,
                                                          max_size=4))
    def lease_within_limits(self, polls: list[tuple[str, tuple[str, ...], int]],
                            limits: dict[str, tuple[int, int | None, int | None]], gaps: list[int]) -> None:
        """Lease entries one after another, `gaps` apart, under queue limits: the later ones find
        the queues at their limits, and the buckets partly refilled."""
        for gap in gaps:
            self.now += gap
            self.propose(Op.LEASE_READY, self.model.lease_ready, now=self.now, lease_until=self.now + 30 * S,
                         grants=[[worker, list(queues), want] for worker, queues, want in polls],
                         limits={q: list(limit) for q, limit in limits.items()})

    def _pick_lease(self, i: int, mode: str) -> tuple[str, str, int]:
        """(run_id, worker_id, fence): the holder of a lease (live ones first), or a wrong one."""
        if mode == "zombie" and self.granted:
            return self.granted[i % len(self.granted)]
        pool = (self._run_ids(lambda r: r["state"] == "running" and r["lease_until_us"] > self.now)
                or self._run_ids(lambda r: r["state"] == "running") or self._run_ids())
        if not pool or mode == "ghost":
            return GHOST_RUN, WORKERS[0], 1
        run = self.model.runs[pool[i % len(pool)]]
        worker, fence = run["worker_id"] or WORKERS[0], run["fence"]
        if mode == "wrong_fence":
            older = [f for r, _, f in self.granted if r == run["run_id"] and f != fence]
            fence = older[i % len(older)] if older else fence + (1 if i % 2 else -1)
        elif mode == "wrong_worker":
            worker = WORKERS[(WORKERS.index(worker) + 1) % len(WORKERS)]
        return run["run_id"], worker, fence

    @precondition(lambda self: self.model.runs)
    @rule(i=PICK, mode=LEASE_MODES, also=st.one_of(st.none(), st.tuples(PICK, LEASE_MODES)),
          lease_s=st.sampled_from([1, 5, 30]), coalesced=st.booleans())
    def heartbeat(self, i: int, mode: str, also: tuple[int, str] | None, lease_s: int, coalesced: bool) -> None:
        """One worker's heartbeat for one or two leases, or (coalesced) one entry whose items
        name their own workers, as the node batches them."""
        picks = [self._pick_lease(i, mode)] + ([self._pick_lease(*also)] if also else [])
        if coalesced:
            self.propose(Op.HEARTBEAT, self.model.heartbeat, now=self.now, lease_until=self.now + lease_s * S,
                         leases=[[run_id, fence, worker] for run_id, worker, fence in picks])
        else:
            self.propose(Op.HEARTBEAT, self.model.heartbeat, now=self.now, worker_id=picks[0][1],
                         lease_until=self.now + lease_s * S, leases=[[run_id, fence] for run_id, _, fence in picks])

    @precondition(lambda self: self.model.runs)
    @rule(i=PICK, mode=LEASE_MODES, also=st.one_of(st.none(), st.tuples(PICK, LEASE_MODES)), coalesced=st.booleans())
    def ack(self, i: int, mode: str, also: tuple[int, str] | None, coalesced: bool) -> None:
        """Acks of one or two leases, from one worker or (coalesced) naming each its own."""
        picks = [self._pick_lease(i, mode)] + ([self._pick_lease(*also)] if also else [])
        if coalesced:
            self.propose(Op.ACK, self.model.ack, now=self.now,
                         acks=[[run_id, fence, '"done"', worker] for run_id, worker, fence in picks])
        else:
            self.propose(Op.ACK, self.model.ack, now=self.now, worker_id=picks[0][1],
                         acks=[[run_id, fence, '"done"'] for run_id, _, fence in picks])

    @precondition(lambda self: self.model.runs)
    @rule(i=PICK, mode=LEASE_MODES)
    def nack(self, i: int, mode: str) -> None:
        run_id, worker, fence = self._pick_lease(i, mode)
        self.propose(Op.NACK, self.model.nack, now=self.now, worker_id=worker, run_id=run_id, fence=fence,
                     error="boom")

    @precondition(lambda self: any(r["state"] == "retry_wait" for r in self.model.runs.values()))
    @rule(worker=st.sampled_from(WORKERS), dt=st.integers(0, S), lease_s=st.sampled_from([1, 2, 30]))
    def retry(self, worker: str, dt: int, lease_s: int) -> None:
        """Wait out the earliest backoff (time only moves forward) and lease what is ready again."""
        wake = min(r["available_us"] for r in self.model.runs.values() if r["state"] == "retry_wait")
        self.now = max(self.now, wake) + dt
        self.propose(Op.LEASE_BATCH, self.model.lease, now=self.now, lease_until=self.now + lease_s * S,
                     grants=[[worker, self.d.ready(self.now)]])

    def _superseded(self) -> list[tuple[str, str, int]]:
        """Earlier leases of runs that are running again under a newer fence."""
        return [(r, w, f) for r, w, f in self.granted
                if self.model.runs.get(r, {}).get("state") == "running" and self.model.runs[r]["fence"] != f]

    @precondition(lambda self: self._superseded())
    @rule(i=PICK, op=ZOMBIE_OPS, dt=SMALL_STEPS, lapse=st.booleans())
    def zombie(self, i: int, op: Op, dt: int, lapse: bool) -> None:
        """The previous holder of a re-leased run (or a deposed leader's reaper) acts on the old
        fence; with `lapse`, once the current lease has run out too."""
        run_id, worker, fence = self._superseded()[i % len(self._superseded())]
        if lapse:
            self.now = max(self.now, self.model.runs[run_id]["lease_until_us"])
        self.now += dt
        self._act(op, run_id, worker, fence)

    def _act(self, op: Op, run_id: str, worker: str, fence: int) -> None:
        if op == Op.ACK:
            self.propose(op, self.model.ack, now=self.now, worker_id=worker, acks=[[run_id, fence, None]])
        elif op == Op.NACK:
            self.propose(op, self.model.nack, now=self.now, worker_id=worker, run_id=run_id, fence=fence, error="x")
        elif op == Op.HEARTBEAT:
            self.propose(op, self.model.heartbeat, now=self.now, worker_id=worker, lease_until=self.now + 30 * S,
                         leases=[[run_id, fence]])
        else:
            self.propose(op, self.model.expire, now=self.now, runs=[[run_id, fence]])

    @precondition(lambda self: self.model.runs)
    @rule(worker=st.sampled_from(WORKERS), dt=SMALL_STEPS, later=SMALL_STEPS, lease_s=st.sampled_from([2, 5, 30]),
          outcomes=st.lists(st.sampled_from(["ack", "ack", "nack", "nack", "vanish"]), min_size=1, max_size=4),
          zombie_op=st.one_of(st.none(), ZOMBIE_OPS))
    def work(self, worker: str, dt: int, later: int, lease_s: int, outcomes: list[str], zombie_op: Op | None) -> None:
        """A worker's round: lease what is ready, then after `later` ack, nack or vanish per task.
        With zombie_op, the previous holder of a re-leased task first acts on its old fence."""
        self.now += dt
        ready = self.d.ready(self.now)[:len(outcomes)]
        if not ready:
            return
        earlier = list(self.granted)
        res = self.propose(Op.LEASE_BATCH, self.model.lease, now=self.now, lease_until=self.now + lease_s * S,
                           grants=[[worker, ready]])
        self.now += later
        for task, outcome in zip(res["grants"][0][1], outcomes):
            old = [g for g in earlier if g[0] == task["run_id"]]
            if zombie_op is not None and old:
                self._act(zombie_op, *old[-1])
            if outcome == "ack":
                self.propose(Op.ACK, self.model.ack, now=self.now, worker_id=worker,
                             acks=[[task["run_id"], task["fence"], None]])
            elif outcome == "nack":
                self.propose(Op.NACK, self.model.nack, now=self.now, worker_id=worker, run_id=task["run_id"],
                             fence=task["fence"], error="boom")

    @rule(stale=st.sampled_from(["none", "none", "old_fence", "live", "other"]), i=PICK, dt=SMALL_STEPS,
          fresh=st.sampled_from([True, True, False]))
    def expire(self, stale: str, i: int, dt: int, fresh: bool) -> None:
        """What the lease reaper proposes (after dt passes), sometimes after pairs that must
        be ignored: an earlier lease of a run, a live lease, any run. Without `fresh`, only
        those: a deposed leader's reaper that never saw the newer leases."""
        self.now += dt
        with self.d.store.read() as txn:
            found = queries.expired_leases(txn, self.d.store.tables, self.now, 100)
        expected = self.model.expired(self.now)  # the reaper takes 100 at a time, the earliest first
        assert set(found) <= expected and len(found) == min(100, len(expected)), \
            f"expired {found} != model {expected}"
        live = self._run_ids(lambda r: r["state"] == "running" and r["lease_until_us"] > self.now)
        older = [[r, f] for r, _, f in self.granted if self.model.runs.get(r, {}).get("fence") not in (None, f)]
        older_running = [[r, f] for r, f in older if self.model.runs[r]["state"] == "running"]
        pool = {"old_fence": older_running or older,
                "live": [[r, self.model.runs[r]["fence"]] for r in live],
                "other": [[r, self.model.runs[r]["fence"]] for r in self._run_ids()], "none": []}[stale]
        pairs = ([pool[i % len(pool)]] if pool else []) + ([list(p) for p in found] if fresh else [])
        if pairs:
            self.propose(Op.EXPIRE_LEASES, self.model.expire, now=self.now, runs=pairs)

    @rule(job_id=st.sampled_from(TARGETS), back=st.sampled_from([0, 3 * S, 20 * S, 600 * S]),
          count=st.integers(1, 4), stray=st.booleans(),
          policy=st.sampled_from([None, None, "allow", "skip", "buffer_all", "cancel_other"]))
    def backfill(self, job_id: str, back: int, count: int, stray: bool, policy: str | None) -> None:
        """Occurrences of the job's schedule from `back` before now (as the API finds them),
        and with `stray` a time that is none."""
        job = self.model.jobs.get(job_id)
        times: list[int] = []
        t = self.now - back - 1
        while job is not None and len(times) < count:
            nxt = next_after(job["schedule"], t)
            if nxt is None or nxt > self.now:
                break
            times.append(nxt)
            t = nxt
        if stray:
            times.append(self.now - back + 1)
        extra = {"overlap_policy": policy} if policy else {}
        self.propose(Op.BACKFILL_JOB, self.model.backfill, now=self.now, job_id=job_id, occurrences=times, **extra)

    @rule(i=PICK, ghost=st.booleans())
    def cancel_run(self, i: int, ghost: bool) -> None:
        run_ids = self._run_ids()
        run_id = GHOST_RUN if ghost or not run_ids else run_ids[i % len(run_ids)]
        self.propose(Op.CANCEL_RUN, self.model.cancel_run, now=self.now, run_id=run_id)

    @precondition(lambda self: any(r["state"] == "dead_letter" for r in self.model.runs.values()))
    @rule(i=PICK, version=VERSIONS)
    def redrive(self, i: int, version: int) -> None:
        """At version 8 on, a dead letter of a cancelled job is not re-driven."""
        pool = self._run_ids(lambda r: r["state"] == "dead_letter")
        self.propose(Op.REDRIVE_RUN, self.model.redrive, version, now=self.now, run_id=pool[i % len(pool)])

    @precondition(lambda self: self.model.runs)
    @rule(i=PICK, ghost=st.booleans())
    def redrive_other(self, i: int, ghost: bool) -> None:
        """Re-driving what is not a dead letter (or nothing) is a conflict that changes nothing."""
        pool = self._run_ids()
        self.propose(Op.REDRIVE_RUN, self.model.redrive, now=self.now,
                     run_id=GHOST_RUN if ghost else pool[i % len(pool)])

    # -- determinism ----------------------------------------------------------------------------

    def check_replica(self) -> None:
        """The same entries on a second store give the same bytes."""
        if self.replica is None:
            self.replica = Driver(os.path.join(self.tmp, "replica"))
        for op, version, payload in self.log[self.replayed:]:
            self.replica.apply(op, version=version, **payload)
        self.replayed = len(self.log)
        assert self.replica.digest() == self.d.digest(), "replica diverged from the same entries"

    @invariant()
    def replicas_agree(self) -> None:
        self.steps += 1
        if self.steps % REPLICA_EVERY_STEPS == 0:
            self.check_replica()

    def teardown(self) -> None:
        try:
            self.check_replica()
        finally:
            for d in (self.d, self.replica):
                if d is not None:
                    d.store.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


MODEL_SETTINGS = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def test_store_matches_model() -> None:
    run_state_machine_as_test(SchedulerMachine, settings=MODEL_SETTINGS)


# -- regressions found by the machine ------------------------------------------------------------

def test_rearm_below_runs_claimed_ahead_then_catch_up_keeps_one_run_per_occurrence(tmp_path: pathlib.Path) -> None:
    """Found by this machine (fixed in 0ba2217): with lookahead_s over the period, runs are
    claimed ahead; pruning a skipped one left a gap, a re-arm put next_fire_us into it, and the
    catch-up after an outage inserted a second run for an occurrence still taken: apply raised
    on every replica. test_semantics covers the trigger route to the same collision."""
    d = Driver(str(tmp_path / "db"))
    d.create("e", {"kind": "every", "every_us": S, "anchor_us": T0}, overlap_policy="skip", history_limit=2)
    for now in (T0 + S // 5, T0 + 6 * S // 5):  # the leader's scans with lookahead_s=3 (valid: < misfire_grace_s)
        deferred: list[list[Any]] = []  # for the overlap rule, until due (the leader's memory)
        while due := [list(item) for item in d.due(now + 3 * S) if list(item) not in deferred]:
            deferred += d.apply(Op.CLAIM_BATCH, now=now, grace_us=5 * S, claims=due)["deferred"]
    d.apply(Op.PAUSE_JOB, now=T0 + 13 * S // 10, job_id="e")
    d.apply(Op.RESUME_JOB, now=T0 + 14 * S // 10, job_id="e")  # re-armed to T0+2, below T0+3 and T0+4
    for _ in range(CLAIM_ROUNDS_MAX):  # the leader scans until nothing is due (a taken
        if not d.due(T0 + 30 * S):  # occurrence advances the job one step per entry)
            break
        d.claim_due(T0 + 30 * S)
    assert d.job("e")["next_fire_us"] == T0 + 31 * S  # T0+25..T0+30 were on time (within the grace)
    times = [r["scheduled_us"] for r in d.runs("e")]
    assert len(times) == len(set(times))


def test_cancelled_job_is_not_delivered_again_after_its_running_attempt_fails(tmp_path: pathlib.Path) -> None:
    d = Driver(str(tmp_path / "db"))
    d.create("e", {"kind": "every", "every_us": 60 * S, "anchor_us": T0}, max_attempts=3)
    d.claim_due(T0 + 60 * S)
    (task,) = d.lease(T0 + 60 * S)
    assert d.apply(Op.CANCEL_JOB, now=T0 + 61 * S, job_id="e")["ok"]  # the running run may finish...
    d.apply(Op.NACK, now=T0 + 62 * S, worker_id="w", run_id=task["run_id"], fence=task["fence"], error="x")
    d.apply(Op.CANCEL_JOB, now=T0 + 63 * S, job_id="e")
    assert d.lease(T0 + 120 * S) == []  # ...but is not run again for a cancelled job
