"""Where a finished job or run is deleted: a job purged with all of its runs (its id
may then be created again), a dead letter discarded.

Deleting a job takes every trace of it: its runs and their index entries, its
occurrence keys, its stored run counts, its idempotency-key ledger entry and its
place in the per-state totals. Run ids embed the Raft index of the entry that made
them, so a run of a job created again never has the id of an earlier job's run: a
worker still holding a purged run hears `not_found` for it, never another run's
answer. Both commands exist from entry version 11 on (ops.PURGE_SINCE)."""
from __future__ import annotations

from typing import Any

from storage import keys, records
from storage.model import JobState, RunState
from storage.records import Ctx, Record

FINISHED_JOB_STATES = frozenset({JobState.COMPLETED.value, JobState.CANCELLED.value})


def _fail(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "code": code, "message": message}


def purge_job(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Delete a completed or cancelled job none of whose runs is queued, running or waiting
    to retry: up to `runs_max` of its runs per entry, then the job itself (`done`). The
    proposer repeats the command until it is done."""
    job_id, runs_max = cmd["job_id"], cmd["runs_max"]
    job = records.get_job(ctx, job_id)
    if job is None:
        return _fail("not_found", f"no job {job_id!r}")
    if job["state"] not in FINISHED_JOB_STATES:
        return _fail("conflict", f"job {job_id!r} is {job['state']}: cancel it before purging it")
    stats = records.job_stats(ctx, job_id)
    if stats["pending"] or stats["running"]:
        return _fail("conflict", f"job {job_id!r} still has {stats['pending']} run(s) waiting and "
                                 f"{stats['running']} running: purge it once they have finished")
    run_ids = records.occurrence_runs(ctx, job_id, runs_max + 1)
    deleted = 0
    for run_id in run_ids[:runs_max]:
        run = records.get_run(ctx, run_id)
        if run is not None:
            records.delete_run(ctx, run)
            deleted += 1
    if len(run_ids) > runs_max:
        return {"ok": True, "done": False, "deleted_runs": deleted}
    _delete_job(ctx, job)
    return {"ok": True, "done": True, "deleted_runs": deleted}


def _delete_job(ctx: Ctx, job: Record) -> None:
    job_id = job["job_id"]
    records.remove_job(ctx, job)
    ctx.txn.delete(keys.job_key(job_id), b"", ctx.tables.job_stats)
    ctx.stats.pop(job_id, None)
    ctx.stats_changed.discard(job_id)
    if job.get("idempotency_key") is not None:
        ctx.txn.delete(keys.idempotency_key(job["idempotency_key"]), b"", ctx.tables.idempotency)


def discard_run(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Delete one dead letter: it leaves the dead-letter list and its job's history."""
    run_id = cmd["run_id"]
    run = records.get_run(ctx, run_id)
    if run is None:
        return _fail("not_found", f"no run {run_id!r}")
    if run["state"] != RunState.DEAD_LETTER:
        return _fail("conflict", f"run {run_id!r} is {run['state']}, not dead_letter: only a dead letter is "
                                 "discarded")
    records.reopen_dead_head(ctx, run)  # the history's count of dead letters at its head may hold this one
    records.delete_run(ctx, run)
    return {"ok": True, "run": run}
