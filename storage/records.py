"""Reading and writing job and run records together with their indexes.

Every index entry is written and removed here and only here, so the due
index, the ready queue and the lease-expiry index can never drift from the
records they point at."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lmdb
import msgpack

from storage import keys
from storage.db import Tables
from storage.model import RunState

Record = dict[str, Any]


@dataclass
class Ctx:
    """What one apply call works in: the txn, the tables, and the entry's identity."""

    txn: lmdb.Transaction
    tables: Tables
    group: int
    index: int


def pack(record: Record) -> bytes:
    return msgpack.packb(record, use_bin_type=True)


def unpack(raw: bytes) -> Record:
    return msgpack.unpackb(raw, raw=False)


def get_job(ctx: Ctx, job_id: str) -> Record | None:
    raw = ctx.txn.get(keys.job_key(job_id), db=ctx.tables.jobs)
    return unpack(raw) if raw else None


def put_job(ctx: Ctx, job: Record, old_fire_us: int | None) -> None:
    """Store a job and move its due-index entry from old_fire_us to its next_fire_us."""
    job_id, shard = job["job_id"], job["shard"]
    if old_fire_us is not None and old_fire_us != job["next_fire_us"]:
        ctx.txn.delete(keys.due_key(shard, old_fire_us, job_id), db=ctx.tables.due)
    if job["next_fire_us"] is not None:
        ctx.txn.put(keys.due_key(shard, job["next_fire_us"], job_id), b"", db=ctx.tables.due)
    ctx.txn.put(keys.job_key(job_id), pack(job), db=ctx.tables.jobs)


def get_run(ctx: Ctx, run_id: str) -> Record | None:
    raw = ctx.txn.get(keys.run_key(run_id), db=ctx.tables.runs)
    return unpack(raw) if raw else None


def occurrence_taken(ctx: Ctx, job_id: str, scheduled_us: int) -> bool:
    return ctx.txn.get(keys.occurrence_key(job_id, scheduled_us), db=ctx.tables.occurrences) is not None


def insert_run(ctx: Ctx, run: Record) -> None:
    """A new run: the occurrence key makes (job_id, scheduled_time) unique."""
    occ = keys.occurrence_key(run["job_id"], run["scheduled_us"])
    if not ctx.txn.put(occ, run["run_id"].encode(), db=ctx.tables.occurrences, overwrite=False):
        raise AssertionError(f"occurrence {run['job_id']}@{run['scheduled_us']} claimed twice")
    ctx.txn.put(keys.run_key(run["run_id"]), pack(run), db=ctx.tables.runs)
    _index_run(ctx, run)


def update_run(ctx: Ctx, before: Record, after: Record) -> None:
    """Replace a run record; its ready/lease index entries follow its state."""
    _unindex_run(ctx, before)
    ctx.txn.put(keys.run_key(after["run_id"]), pack(after), db=ctx.tables.runs)
    _index_run(ctx, after)


def _index_run(ctx: Ctx, run: Record) -> None:
    state = run["state"]
    if state in (RunState.QUEUED, RunState.RETRY_WAIT):
        key = keys.ready_key(run["queue"], run["priority"], run["available_us"], run["run_id"])
        ctx.txn.put(key, b"", db=ctx.tables.ready)
    elif state == RunState.RUNNING:
        ctx.txn.put(keys.lease_key(run["lease_until_us"], run["run_id"]), b"", db=ctx.tables.leases)


def _unindex_run(ctx: Ctx, run: Record) -> None:
    state = run["state"]
    if state in (RunState.QUEUED, RunState.RETRY_WAIT):
        key = keys.ready_key(run["queue"], run["priority"], run["available_us"], run["run_id"])
        ctx.txn.delete(key, db=ctx.tables.ready)
    elif state == RunState.RUNNING:
        ctx.txn.delete(keys.lease_key(run["lease_until_us"], run["run_id"]), db=ctx.tables.leases)


def occurrence_runs(ctx: Ctx, job_id: str) -> list[str]:
    """Run ids of one job, oldest occurrence first."""
    prefix = keys.occurrence_prefix(job_id)
    out: list[str] = []
    with ctx.txn.cursor(db=ctx.tables.occurrences) as cur:
        if not cur.set_range(prefix):
            return out
        for key, value in cur:
            if not key.startswith(prefix):
                break
            out.append(value.decode())
    return out
