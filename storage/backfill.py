"""Where a backfill is applied: runs for past occurrences of a job's schedule, as Temporal's
schedule backfill makes them (BACKFILL_JOB; POST /v1/jobs/{id}/backfill).

The entry names the occurrences, as the API found them in the job's schedule. Apply keeps
those that are occurrences of the schedule as it is stored now (a PATCH may have landed in
between), that the job's own claims have passed (before its next fire time: the ones from
there on are the scheduler's to claim), and that have no run yet: the (job, scheduled time) rule stands, so a repeated backfill,
or one over occurrences that ran, makes nothing twice. Each run made has its own scheduled
time, and so its own idempotency key. The job's overlap policy applies, or the one the
entry names; its starting deadline does not (every backfilled occurrence is late on
purpose), nor does max_runs (these are an operator's extra runs, as a trigger is); under cancel_other
only the newest runs, the others are skipped (`overlap`), as in a catch-up. The runs are
released spread out, as a catch-up's are."""
from __future__ import annotations

import zlib
from typing import Any

from schedulerd.storage import claims, cron, jobs, overlap, records
from schedulerd.storage.model import RUN_QUEUED, Reason
from schedulerd.storage.records import Ctx, Record


def backfill_job(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    job_id, now = cmd["job_id"], cmd["now"]
    job = records.get_job(ctx, job_id)
    err = jobs.not_cancelled(job, job_id)
    if err:
        return err
    policy = cmd.get("overlap_policy")
    subject = job if policy is None else dict(job, overlap_policy=policy)
    records.prune_history(ctx, job_id, job["history_limit"] - 1, now)
    release = now + zlib.crc32(job_id.encode()) % claims.BACKFILL_SPREAD_US
    made: list[Record] = []
    existing: list[int] = []
    foreign: list[int] = []
    fresh: list[int] = []
    reached = job["next_fire_us"]  # the scheduler's own claims go on from here
    for at_us in cmd["occurrences"]:
        if not occurs_at(job["schedule"], at_us) or (reached is not None and at_us >= reached):
            foreign.append(at_us)
        elif records.occurrence_taken(ctx, job_id, at_us):
            existing.append(at_us)
        else:
            fresh.append(at_us)
    # Under cancel_other each run would cancel the one before it at once: the newest runs.
    replaced = fresh[:-1] if overlap.replaces(ctx, subject) else []
    for at_us in fresh:
        if at_us in replaced:
            made.append(claims.skipped_run(ctx, subject, at_us, now, Reason.OVERLAP))
            continue
        made.append(claims.new_run(ctx, subject, at_us, now, release, backfill=True))
        if made[-1]["state"] == RUN_QUEUED:
            release += claims.BACKFILL_SPACING_US
    queued: list[str] = []
    reasons: dict[str, int] = {}
    skipped = claims.sort_made(made, queued, reasons)
    return {"ok": True, "runs": queued, "skipped": skipped, "skipped_reasons": reasons, "existing": existing,
            "left": foreign}


def occurs_at(schedule: dict[str, Any], at_us: int) -> bool:
    """Whether the schedule has an occurrence at exactly at_us (its bounds included)."""
    return cron.next_after(schedule, at_us - 1) == at_us


def occurrences(schedule: dict[str, Any], start_us: int, end_us: int, limit: int) -> list[int]:
    """The schedule's occurrences in [start_us, end_us), at most limit + 1 of them (one more
    than a caller allows tells it the range holds too many)."""
    out: list[int] = []
    at_us = cron.next_after(schedule, start_us - 1)
    while at_us is not None and at_us < end_us and len(out) <= limit:
        out.append(at_us)
        at_us = cron.next_after(schedule, at_us)
    return out
