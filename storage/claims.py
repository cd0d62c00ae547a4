"""Applying a claim batch: due occurrences become runs, exactly once.

A claim names (job_id, fire_us) as the proposer saw it. It succeeds only if
the job is still scheduled with that very next_fire_us (compare-and-set) and
the occurrence has no run yet, so a second claim of the same occurrence, from
a stale leader or a retried proposal, changes nothing."""
from __future__ import annotations

from typing import Any

from storage import cron, records
from storage.model import JobEvent, JobState, RunState, job_transition
from storage.records import Ctx


def claim_batch(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    now = cmd["now"]
    run_ids: list[str] = []
    stale = 0
    for position, (job_id, fire_us) in enumerate(cmd["claims"]):
        job = records.get_job(ctx, job_id)
        if (job is None or job["state"] != JobState.SCHEDULED or job["next_fire_us"] != fire_us
                or records.occurrence_taken(ctx, job_id, fire_us)):
            stale += 1
            continue
        run_id = f"{ctx.group}-{ctx.index}-{position}"
        records.insert_run(ctx, {
            "run_id": run_id, "job_id": job_id, "scheduled_us": fire_us,
            "state": RunState.QUEUED.value, "attempt": 0, "queue": job["queue"],
            "priority": job["priority"], "max_attempts": job["max_attempts"],
            "available_us": fire_us, "worker_id": None, "fence": 0, "lease_until_us": None,
            "created_us": now, "finished_us": None, "result_json": None, "error": None,
        })
        _advance(ctx, job, fire_us, now)
        run_ids.append(run_id)
    return {"runs": run_ids, "stale": stale}


def _advance(ctx: Ctx, job: dict[str, Any], fire_us: int, now: int) -> None:
    """Move the job to its next occurrence after this one.

    Counting from max(fire, now) means a job that fell behind resumes at its
    next future time instead of replaying every missed tick one by one."""
    nxt = cron.next_after(job["schedule"], max(fire_us, now))
    job.update(next_fire_us=nxt, updated_us=now)
    if nxt is None:
        job["state"] = job_transition(job["state"], JobEvent.LAST_OCCURRENCE)
    records.put_job(ctx, job, fire_us)
