"""Applying job commands: create and cancel."""
from __future__ import annotations

from typing import Any

from storage import cron, keys, records
from storage.model import JobEvent, JobState, RunEvent, RunState, job_transition, run_transition
from storage.records import Ctx


def create_jobs(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Insert each job that does not exist yet; per-item results, one txn."""
    now = cmd["now"]
    results = []
    for spec in cmd["jobs"]:
        job_id = spec["job_id"]
        if records.get_job(ctx, job_id) is not None:
            results.append({"job_id": job_id, "ok": False, "code": "conflict",
                            "message": f"job {job_id!r} already exists"})
            continue
        job = dict(spec)
        job.update(state=JobState.SCHEDULED.value, shard=keys.shard_of(job_id),
                   next_fire_us=cron.first_fire(spec["schedule"], now),
                   created_us=now, updated_us=now, raft_index=ctx.index)
        if job["next_fire_us"] is None:
            job["state"] = job_transition(job["state"], JobEvent.LAST_OCCURRENCE)
        records.put_job(ctx, job, None)
        results.append({"job_id": job_id, "ok": True})
    return {"results": results}


def cancel_job(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Stop new occurrences and cancel runs not yet leased; a running run may finish."""
    job_id, now = cmd["job_id"], cmd["now"]
    job = records.get_job(ctx, job_id)
    if job is None:
        return {"ok": False, "code": "not_found", "message": f"no job {job_id!r}"}
    if job["state"] == JobState.CANCELLED:
        return {"ok": True, "cancelled_runs": 0}
    if job["state"] == JobState.COMPLETED and not _has_pending_runs(ctx, job_id):
        return {"ok": False, "code": "conflict", "message": f"job {job_id!r} is completed; nothing to cancel"}
    old_fire = job["next_fire_us"]
    job.update(state=job_transition(job["state"], JobEvent.CANCEL), next_fire_us=None, updated_us=now)
    records.put_job(ctx, job, old_fire)
    cancelled = 0
    for run_id in records.occurrence_runs(ctx, job_id):
        run = records.get_run(ctx, run_id)
        if run is not None and run["state"] in (RunState.QUEUED, RunState.RETRY_WAIT):
            after = dict(run, state=run_transition(run["state"], RunEvent.CANCEL), finished_us=now,
                         error="job cancelled")
            records.update_run(ctx, run, after)
            cancelled += 1
    return {"ok": True, "cancelled_runs": cancelled}


def _has_pending_runs(ctx: Ctx, job_id: str) -> bool:
    for run_id in records.occurrence_runs(ctx, job_id):
        run = records.get_run(ctx, run_id)
        if run is not None and run["state"] in (RunState.QUEUED, RunState.RETRY_WAIT):
            return True
    return False
