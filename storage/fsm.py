"""Where a command is applied: one Raft entry, in the store's apply txn.

The caller (raft/store.py's Store) commits that txn once per batch of entries;
an entry that raised must never be committed, so on `FatalApplyError` the caller
aborts it and stops. The txn also records the entry's index as last_applied, so replaying an entry
at or below it (pysyncobj replays the whole journal on restart) is a no-op.

Two kinds of failure, kept apart:
- a business rejection (stale fence, job exists) is a result inside the
  handler's return value, the same on every replica;
- anything else (an entry this build cannot read, an LMDB error, a broken
  invariant) raises `FatalApplyError`: the caller must stop the node, which
  replays the entry after restart. Swallowing it would let replicas diverge."""
from __future__ import annotations

from typing import Any, Callable, Protocol

import lmdb

from schedulerd.storage import (audit, backfill, claims, jobs, leases, ops, overlap, queue_limits, records, retention,
                                run_cancel)
from schedulerd.storage.ops import Op
from schedulerd.storage.tables import Tables, last_applied, set_last_applied

Handler = Callable[[records.Ctx, dict[str, Any]], dict[str, Any]]

HANDLERS: dict[Op, Handler] = {
    Op.CREATE_JOBS: jobs.create_jobs,
    Op.CANCEL_JOB: jobs.cancel_job,
    Op.CLAIM_BATCH: claims.claim_batch,
    Op.LEASE_BATCH: leases.lease_batch,
    Op.HEARTBEAT: leases.heartbeat,
    Op.ACK: leases.ack,
    Op.NACK: leases.nack,
    Op.EXPIRE_LEASES: leases.expire_leases,
    Op.PAUSE_JOB: jobs.pause_job,
    Op.RESUME_JOB: jobs.resume_job,
    Op.UPDATE_JOB: jobs.update_job,
    Op.TRIGGER_JOB: jobs.trigger_job,
    Op.REDRIVE_RUN: leases.redrive,
    Op.LEASE_READY: leases.lease_ready,
    Op.PURGE_JOB: retention.purge_job,
    Op.DISCARD_RUN: retention.discard_run,
    Op.SWEEP_EXPIRED: retention.sweep_expired,
    Op.JOBS_ACTION: jobs.act_on_jobs,
    Op.CANCEL_RUN: run_cancel.cancel_run,
    Op.BACKFILL_JOB: backfill.backfill_job,
}

ALREADY_APPLIED: dict[str, Any] = {"replayed": True}


class Target(Protocol):
    """What an entry is applied into: the group's store (raft/store.py's Store)."""

    group: int
    tables: Tables

    def apply_txn(self) -> lmdb.Transaction: ...


class FatalApplyError(Exception):
    """This node cannot apply the entry and must stop (it replays it on restart)."""


def apply(store: Target, index: int, blob: bytes) -> tuple[Op | None, dict[str, Any]]:
    """Apply the entry at Raft index `index`; returns (op, result)."""
    try:
        op, version, payload = ops.decode(blob)
        txn = store.apply_txn()
        if index <= last_applied(txn, store.tables):
            return None, ALREADY_APPLIED
        ctx = records.Ctx(txn, store.tables, store.group, index, version)
        ctx.counting = queue_limits.counting(txn, store.tables)
        if not ctx.counting and version >= ops.QUEUE_LIMITS_SINCE:
            queue_limits.start_counting(txn, store.tables)
            ctx.counting = True
        result = HANDLERS[op](ctx, payload)
        if ctx.freed:
            overlap.release_freed(ctx, payload.get("now", 0))
        records.flush(ctx)
        queue_limits.add_running(txn, store.tables, ctx.running_delta)
        audit.record_command(ctx, op, payload, result)
        set_last_applied(txn, store.tables, index)
        return op, result
    except ops.CorruptEntry as exc:
        raise FatalApplyError(f"entry {index}: {exc}") from exc
    except lmdb.Error as exc:
        raise FatalApplyError(f"entry {index}: LMDB failed: {exc}") from exc
    except Exception as exc:
        raise FatalApplyError(f"entry {index}: {type(exc).__name__}: {exc}") from exc
