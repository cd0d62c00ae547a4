"""Reading and writing job and run records together with their indexes.

Every index entry is written and removed here and only here, so the due
index, the ready queue and the lease-expiry index can never drift from the
records they point at.

The LMDB calls here pass their options by position: put(key, value, dupdata,
overwrite, append, db), get(key, default, db), delete(key, value, db). py-lmdb
parses keyword arguments at ~70 ns a call, and apply makes ~14 of these calls per
job on every replica: by position, apply runs 3.8% fewer instructions."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple

import lmdb

from schedulerd.storage import keys, ops
from schedulerd.storage.codec import pack, unpack
from schedulerd.storage.layouts import JOBS, RUNS
from schedulerd.storage.model import (FINISHED_JOB_STATES, PENDING_RUN_STATES, RUN_DEAD_LETTER, RUN_RUNNING,
                                      TERMINAL_RUN_STATES)
from schedulerd.storage.tables import Tables

Record = dict[str, Any]


@dataclass
class Ctx:
    """What one apply call works in: the txn, the tables, and the entry's identity."""

    txn: lmdb.Transaction
    tables: Tables
    group: int
    index: int
    version: int  # of the entry: which rules it is applied by (ops.py)
    runs_made: int = 0
    audits_made: int = 0
    # Per-job run counts and per-state job totals change many times in one entry:
    # kept here and written once, by `flush`, at the end of the entry. None: the
    # job has no stored counts (see `job_stats`).
    stats: dict[str, Record | None] = field(default_factory=dict)
    stats_changed: set[str] = field(default_factory=set)
    state_counts: dict[str, int] = field(default_factory=dict)
    # Jobs that have buffered runs and whose last open run closed in this entry: the
    # entry releases the next buffered one at its end (storage/overlap.py).
    freed: set[str] = field(default_factory=set)
    # Whether the group counts its running runs per queue (storage/queue_limits.py), and this
    # entry's changes to those counts, written at its end.
    counting: bool = False
    running_delta: dict[str, int] = field(default_factory=dict)
    run_id_prefix: str = field(init=False)
    # How this entry stores job and run records: in their layouts from version 10 on.
    pack_job: Callable[[Record], bytes] = field(init=False)
    pack_run: Callable[[Record], bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.run_id_prefix = f"{self.group}-{self.index}-"
        arrays = self.version >= ops.ARRAY_RECORDS_SINCE
        self.pack_job = JOBS.pack if arrays else pack
        self.pack_run = RUNS.pack if arrays else pack

    def new_run_id(self) -> str:
        """`{group}-{raft index}-{n}`: unique, and the same on every replica."""
        run_id = f"{self.run_id_prefix}{self.runs_made}"
        self.runs_made += 1
        return run_id


def rejected(code: str, message: str) -> dict[str, Any]:
    """A business rejection (no such job, a stale fence): a result, the same on every replica."""
    return {"ok": False, "code": code, "message": message}


class Reader(NamedTuple):
    """A txn and its tables: all that get_job and get_run need, so the read side (queries,
    the API) reads records as apply does. A Ctx serves as one too."""

    txn: lmdb.Transaction
    tables: Tables


def get_job(ctx: Ctx | Reader, job_id: str) -> Record | None:
    raw = ctx.txn.get(keys.job_key(job_id), None, ctx.tables.jobs)
    return JOBS.unpack(raw) if raw else None


def mark_job_new(ctx: Ctx, job_id: str) -> None:
    """A job this entry creates has no stored run counts: a job's are deleted with it
    (retention.purge_job), so none can linger from an earlier job of the same id, and its
    runs' bookkeeping need not look them up."""
    ctx.stats[job_id] = None


def put_job(ctx: Ctx, job: Record, old_fire_us: int | None, was: str | None) -> None:
    """Store a job, move its due-index entry from old_fire_us to its next_fire_us, and
    keep the count of jobs per state (`was`: its state before, None for a new job)."""
    job_id, shard = job["job_id"], job["shard"]
    if was != job["state"]:
        counts = ctx.state_counts
        if was is not None:
            counts[was] = counts.get(was, 0) - 1
        counts[job["state"]] = counts.get(job["state"], 0) + 1
    if old_fire_us is not None and old_fire_us != job["next_fire_us"]:
        ctx.txn.delete(keys.due_key(shard, old_fire_us, job_id), b"", ctx.tables.due)
    if job["next_fire_us"] is not None:
        ctx.txn.put(keys.due_key(shard, job["next_fire_us"], job_id), b"", True, True, False, ctx.tables.due)
    ctx.txn.put(keys.job_key(job_id), ctx.pack_job(job), True, True, False, ctx.tables.jobs)
    if was != job["state"] and ctx.version >= ops.RETENTION_SINCE:
        _note_expiry(ctx, job, was)


def _note_expiry(ctx: Ctx, job: Record, was: str | None) -> None:
    """When to look at a job for expiry (storage/retention.py): a TTL after it entered a
    finished state, and a repeating job's history a history TTL after its creation."""
    if job["state"] in FINISHED_JOB_STATES:
        ttl = job.get("finished_ttl_us", 0)
    elif was is None and job["schedule"]["kind"] != "at":
        ttl = job.get("history_ttl_us", 0)
    else:
        return
    if ttl:
        note_check(ctx, job["updated_us"] + ttl, job["job_id"])


def note_check(ctx: Ctx, check_us: int, job_id: str) -> None:
    ctx.txn.put(keys.expiry_key(check_us, job_id), b"", True, True, False, ctx.tables.expiry)


def remove_job(ctx: Ctx, job: Record) -> None:
    """Delete a job record, its due-index entry, and its place in the count of jobs per state."""
    job_id = job["job_id"]
    if job["next_fire_us"] is not None:
        ctx.txn.delete(keys.due_key(job["shard"], job["next_fire_us"], job_id), b"", ctx.tables.due)
    ctx.state_counts[job["state"]] = ctx.state_counts.get(job["state"], 0) - 1
    ctx.txn.delete(keys.job_key(job_id), b"", ctx.tables.jobs)


def get_run(ctx: Ctx | Reader, run_id: str) -> Record | None:
    raw = ctx.txn.get(keys.run_key(run_id), None, ctx.tables.runs)
    return RUNS.unpack(raw) if raw else None


def run_at(ctx: Ctx | Reader, job_id: str, scheduled_us: int) -> Record | None:
    """The run of the job's occurrence at scheduled_us, if it has one."""
    raw = ctx.txn.get(keys.occurrence_key(job_id, scheduled_us), None, ctx.tables.occurrences)
    return get_run(ctx, raw.decode()) if raw is not None else None


def occurrence_taken(ctx: Ctx, job_id: str, scheduled_us: int) -> bool:
    return ctx.txn.get(keys.occurrence_key(job_id, scheduled_us), None, ctx.tables.occurrences) is not None


def job_stats(ctx: Ctx, job_id: str) -> Record:
    """Counts of one job's runs: waiting (queued/retry_wait), running, and stored.

    They are stored beside a job that repeats, whose claims ask for them every time
    (history pruning, the overlap rule), and a one-off once triggered
    (claims._keeps_stats). Other one-offs' are counted from their few runs when
    asked: storing them cost a read and a write of the counts in every entry that
    touched one of their runs (docs/decisions.md)."""
    stats = _stored_stats(ctx, job_id)
    return stats if stats is not None else _count_runs(ctx, job_id)


def _stored_stats(ctx: Ctx, job_id: str) -> Record | None:
    if job_id in ctx.stats:
        return ctx.stats[job_id]
    raw = ctx.txn.get(keys.job_key(job_id), None, ctx.tables.job_stats)
    stats = ctx.stats[job_id] = unpack(raw) if raw else None
    return stats


def _count_runs(ctx: Ctx, job_id: str) -> Record:
    stats = {"pending": 0, "running": 0, "runs": 0}
    for run_id in occurrence_runs(ctx, job_id):
        run = get_run(ctx, run_id)
        if run is not None:
            _count(stats, run, 1)
    return stats


def _count(stats: Record, run: Record, sign: int) -> None:
    stats["runs"] += sign
    if run["state"] in PENDING_RUN_STATES:
        stats["pending"] += sign
        if run.get("buffered"):
            # Kept only while there are some, so a job that never buffers stores the same bytes.
            held = stats.get("buffered", 0) + sign
            if held:
                stats["buffered"] = held
            else:
                del stats["buffered"]
    elif run["state"] == RUN_RUNNING:
        stats["running"] += sign


def active_runs(stats: Record) -> int:
    """Runs of a job that are queued (not buffered), waiting for a retry or running: what
    a buffered run waits behind."""
    return stats["pending"] + stats["running"] - stats.get("buffered", 0)


def _bump(ctx: Ctx, job_id: str, before: Record | None, after: Record | None) -> None:
    """Follow a run's change in its job's stored counts, if the job has them."""
    stats = _stored_stats(ctx, job_id)
    if stats is None:
        return
    for rec, sign in ((before, -1), (after, 1)):
        if rec is not None:
            _count(stats, rec, sign)
    ctx.stats_changed.add(job_id)
    if "buffered" in stats and active_runs(stats) == 0:
        ctx.freed.add(job_id)


def flush(ctx: Ctx) -> None:
    """Write what the entry changed in per-job run counts and per-state job totals."""
    for job_id in sorted(ctx.stats_changed):
        ctx.txn.put(keys.job_key(job_id), pack(ctx.stats[job_id]), True, True, False, ctx.tables.job_stats)
    if ctx.state_counts:
        raw = ctx.txn.get(keys.JOB_STATE_COUNTS, None, ctx.tables.meta)
        counts = unpack(raw) if raw else {}
        for name, delta in ctx.state_counts.items():
            counts[name] = counts.get(name, 0) + delta
        ctx.txn.put(keys.JOB_STATE_COUNTS, pack(counts), True, True, False, ctx.tables.meta)


def insert_run(ctx: Ctx, run: Record, keep_stats: bool) -> None:
    """A new run: the occurrence key makes (job_id, scheduled_time) unique. keep_stats:
    its job's counts are stored from now on (counted from its runs so far, the first time)."""
    job_id = run["job_id"]
    if keep_stats and _stored_stats(ctx, job_id) is None:
        ctx.stats[job_id] = _count_runs(ctx, job_id)
        ctx.stats_changed.add(job_id)
    occ = keys.occurrence_key(job_id, run["scheduled_us"])
    if not ctx.txn.put(occ, run["run_id"].encode(), True, False, False, ctx.tables.occurrences):
        raise AssertionError(f"occurrence {run['job_id']}@{run['scheduled_us']} claimed twice")
    ctx.txn.put(keys.run_key(run["run_id"]), ctx.pack_run(run), True, True, False, ctx.tables.runs)
    _index_run(ctx, run)
    _bump(ctx, job_id, None, run)
    reopen_dead_head(ctx, run)


def update_run(ctx: Ctx, before: Record, after: Record) -> None:
    """Replace a run record; its index entries and its job's counts follow its state."""
    _unindex_run(ctx, before)
    ctx.txn.put(keys.run_key(after["run_id"]), ctx.pack_run(after), True, True, False, ctx.tables.runs)
    _index_run(ctx, after)
    if before["state"] != after["state"] or "buffered" in before:
        _bump(ctx, after["job_id"], before, after)
        if ctx.counting and (before["state"] == RUN_RUNNING) != (after["state"] == RUN_RUNNING):
            _count_running(ctx, after["queue"], 1 if after["state"] == RUN_RUNNING else -1)


def delete_run(ctx: Ctx, run: Record) -> None:
    _unindex_run(ctx, run)
    ctx.txn.delete(keys.run_key(run["run_id"]), b"", ctx.tables.runs)
    ctx.txn.delete(keys.occurrence_key(run["job_id"], run["scheduled_us"]), b"", ctx.tables.occurrences)
    _bump(ctx, run["job_id"], run, None)
    if ctx.counting and run["state"] == RUN_RUNNING:
        _count_running(ctx, run["queue"], -1)


def _count_running(ctx: Ctx, queue: str, delta: int) -> None:
    ctx.running_delta[queue] = ctx.running_delta.get(queue, 0) + delta


PRUNE_SCAN_MAX = 32  # occurrences looked at per prune, so one apply stays bounded


def prune_history(ctx: Ctx, job_id: str, limit: int, before_us: int) -> int:
    """Keep the newest `limit` runs; of the older ones drop the terminal runs
    scheduled before `before_us` (the entry's now).

    Older runs that are dead letters (until re-driven) or still open stay, and so
    do runs of occurrences still ahead: a resume or an update re-arms the job from
    now, and a dropped future occurrence could then be claimed a second time.

    From entry version 8, a job whose counts are stored also keeps where the dead letters
    at the head of its history end (`dead_until_us`, and how many: `dead_behind`), and
    the scan starts after them. Before, 32 dead letters at the head filled every scan, and
    the history grew by a run per occurrence from then on."""
    stats = job_stats(ctx, job_id)
    floored = ctx.version >= ops.PRUNE_PAST_DEAD_SINCE and _stored_stats(ctx, job_id) is not None
    older = stats["runs"] - limit - (stats.get("dead_behind", 0) if floored else 0)
    if older <= 0:
        return 0
    dropped, head = 0, floored
    for run_id in occurrence_runs(ctx, job_id, min(older, PRUNE_SCAN_MAX),
                                  stats.get("dead_until_us") if floored else None):
        run = get_run(ctx, run_id)
        if run is None:
            continue
        if run["state"] in TERMINAL_RUN_STATES and run["scheduled_us"] < before_us:
            delete_run(ctx, run)
            dropped += 1
        elif head and run["state"] == RUN_DEAD_LETTER:
            stats["dead_until_us"], stats["dead_behind"] = run["scheduled_us"], stats.get("dead_behind", 0) + 1
            ctx.stats_changed.add(job_id)
        else:
            head = False
    return dropped


def reopen_dead_head(ctx: Ctx, run: Record) -> None:
    """A run that is no dead letter, at or before where prune_history's scan starts (a
    dead letter re-driven; a missed occurrence claimed after a trigger's run): the scan
    starts from the oldest run again, skipping the dead letters it meets, 32 a prune.
    Whatever the entry's version: only entries of version 8 on leave a head to reopen, and
    one of an older version (a cluster gone back to it) must not leave it wrong."""
    stats = _stored_stats(ctx, run["job_id"])
    if stats is not None and run["scheduled_us"] <= stats.get("dead_until_us", -1):
        del stats["dead_until_us"], stats["dead_behind"]
        ctx.stats_changed.add(run["job_id"])


def _index_run(ctx: Ctx, run: Record) -> None:
    state = run["state"]
    if state in PENDING_RUN_STATES:
        if run.get("buffered"):
            return  # not leasable until released (storage/overlap.py)
        key = keys.ready_key(run["queue"], run["priority"], run["available_us"], run["run_id"])
        ctx.txn.put(key, b"", True, True, False, ctx.tables.ready)
    elif state == RUN_RUNNING:
        ctx.txn.put(keys.lease_key(run["lease_until_us"], run["run_id"]), b"", True, True, False, ctx.tables.leases)
    elif state == RUN_DEAD_LETTER:
        ctx.txn.put(keys.dead_letter_key(run["finished_us"], run["run_id"]), b"", True, True, False,
                    ctx.tables.dead_letters)


def _unindex_run(ctx: Ctx, run: Record) -> None:
    state = run["state"]
    if state in PENDING_RUN_STATES:
        if run.get("buffered"):
            return
        key = keys.ready_key(run["queue"], run["priority"], run["available_us"], run["run_id"])
        ctx.txn.delete(key, b"", ctx.tables.ready)
    elif state == RUN_RUNNING:
        ctx.txn.delete(keys.lease_key(run["lease_until_us"], run["run_id"]), b"", ctx.tables.leases)
    elif state == RUN_DEAD_LETTER:
        ctx.txn.delete(keys.dead_letter_key(run["finished_us"], run["run_id"]), b"", ctx.tables.dead_letters)


def newest_runs(ctx: Ctx, job_id: str) -> Iterator[Record]:
    """One job's runs, newest occurrence first (lazily: callers stop early)."""
    prefix = keys.occurrence_prefix(job_id)
    with ctx.txn.cursor(db=ctx.tables.occurrences) as cur:
        # On the job's last key: the one before the first key past all of them (the
        # prefix and 9 bytes of 0xff), or the table's last when there is none past them.
        found = cur.prev() if cur.set_range(prefix + b"\xff" * 9) else cur.last()
        while found and cur.key().startswith(prefix):
            run = get_run(ctx, cur.value().decode())
            if run is not None:
                yield run
            found = cur.prev()


def occurrence_runs(ctx: Ctx, job_id: str, limit: int | None = None, after_us: int | None = None) -> list[str]:
    """Run ids of one job, oldest occurrence first (only those scheduled after `after_us`, if given)."""
    prefix = keys.occurrence_prefix(job_id)
    start = prefix if after_us is None else keys.occurrence_key(job_id, after_us + 1)
    out: list[str] = []
    with ctx.txn.cursor(db=ctx.tables.occurrences) as cur:
        if not cur.set_range(start):
            return out
        for key, value in cur:
            if not key.startswith(prefix):
                break
            out.append(value.decode())
            if limit is not None and len(out) >= limit:
                break
    return out
