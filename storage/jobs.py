"""Applying job commands: create, cancel, pause, resume, update, trigger."""
from __future__ import annotations

from typing import Any

from schedulerd.storage import claims, codec, cron, keys, ops, overlap, records, retry, run_cancel
from schedulerd.storage.layouts import JOB_RETENTION
from schedulerd.storage.model import (JOB_SCHEDULED, JobEvent, JobState, MisfirePolicy, OverlapPolicy, Reason,
                                      RunState, job_transition)
from schedulerd.storage.records import Ctx, Record

# Every optional field of a job, with its default: the API's (schedulerd/jobspec.py) and
# part of the entry format. A create entry of version 5 on carries, of each job, only the
# fields its request gave (~135 bytes of a bench job's ~340), and apply fills in the rest
# from this table. A change to it needs a new entry version: a replica replaying an older
# entry would otherwise store other bytes than the others did. Its values (the backoff
# dict among them) end up shared by every job apply builds, so nothing mutates a record's
# values in place: changes make new dicts (jobspec._backoff, dict(run, ...)).
SPEC_DEFAULTS: dict[str, Any] = {
    "queue": "default", "payload_json": "null", "max_attempts": 3, "priority": 0,
    "misfire_policy": MisfirePolicy.FIRE_ONCE.value, "catchup_limit": 100, "starting_deadline_us": None,
    "overlap_policy": OverlapPolicy.ALLOW.value, "backoff": {"base_ms": 1000, "factor": 2.0, "max_ms": 300_000},
    "timeout_us": None, "jitter_us": 0, "history_limit": 100, "target": None,
}

RETENTION = frozenset(JOB_RETENTION)  # from entry version 11
UPDATABLE = frozenset({"schedule", "schedule_spec", "queue", "payload_json", "max_attempts", "priority",
                       "misfire_policy", "catchup_limit", "starting_deadline_us", "overlap_policy", "backoff",
                       "timeout_us", "jitter_us", "history_limit", "target", "max_runs", "labels",
                       "description", "pause_on_failure", "skip_calendar"}) | RETENTION


def create_jobs(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Insert each job that does not exist yet; per-item results, one txn.

    A job with an idempotency key that was seen before returns the job created
    then (same request body) or a conflict (different body), and changes nothing.
    A job created here is in its result as stored (`job`); one created before is not."""
    now = cmd["now"]
    # Entries of version 3 on claim what is due within claim_ahead_us as they create it.
    ahead = cmd.get("claim_ahead_us") if ctx.version >= ops.CLAIM_AT_CREATE_SINCE else None
    defaults = SPEC_DEFAULTS if ctx.version >= ops.SPEC_DEFAULTS_SINCE else {}
    grace = cmd.get("grace_us", claims.DEFAULT_GRACE_US)
    results = []
    made: list[Record] = []
    for spec in cmd["jobs"]:
        job_id, idem = spec["job_id"], spec.get("idempotency_key")
        if idem is not None:
            raw = ctx.txn.get(keys.idempotency_key(idem), db=ctx.tables.idempotency)
            if raw is not None:
                first_id, first_hash = codec.unpack(raw)
                if first_hash == spec["request_hash"]:
                    results.append({"job_id": first_id, "ok": True, "existing": True})
                else:
                    results.append({"job_id": job_id, **records.rejected(
                        "conflict", f"idempotency key {idem!r} was used for a different request")})
                continue
        existing = records.get_job(ctx, job_id)
        if existing is not None:
            results.append({"job_id": job_id, **records.rejected("conflict", _exists_message(existing, now))})
            continue
        records.mark_job_new(ctx, job_id)
        job = dict(defaults, **spec)
        job.pop("request_hash", None)
        job.pop("audit", None)
        if ctx.version >= ops.RETENTION_SINCE:
            _retain(job, cmd.get("finished_ttl_us", 0))
        job["schedule"] = _anchored(spec["schedule"], now)
        job.update(state=JOB_SCHEDULED, shard=keys.shard_of(job_id),
                   next_fire_us=cron.first_fire(job["schedule"], now),
                   created_us=now, updated_us=now, raft_index=ctx.index)
        if job["next_fire_us"] is None:
            job["state"] = job_transition(job["state"], JobEvent.LAST_OCCURRENCE)
        if ahead is None:
            records.put_job(ctx, job, None, None)
        else:
            run = claims.claim_created(ctx, job, now, grace, ahead)
            if run is not None:
                made.append(run)
        if idem is not None:
            ctx.txn.put(keys.idempotency_key(idem), codec.pack([job_id, spec["request_hash"]]),
                        db=ctx.tables.idempotency)
        # The record as stored, for the proposer's answer: no read back per job.
        results.append({"job_id": job_id, "ok": True, "job": job})
    queued: list[str] = []
    reasons: dict[str, int] = {}
    skipped = claims.sort_made(made, queued, reasons)
    return {"results": results, "runs": queued, "skipped": skipped, "skipped_reasons": reasons}


def _exists_message(job: Record, now: int) -> str:
    """Why a create of this id is refused, and for a finished job how to free the id."""
    job_id, state = job["job_id"], claims.as_seen_state(job, now)
    if state in (JobState.CANCELLED.value, JobState.COMPLETED.value):
        return (f"job {job_id!r} already exists and is {state}; purge it to create the id again "
                f"(DELETE /v1/jobs/{{id}}?purge=true, schedctl cancel --purge)")
    return f"job {job_id!r} already exists ({state})"


def _retain(job: Record, default_ttl_us: int) -> None:
    """A new job's retention, last of its fields (storage/layouts.py): its own, else the
    entry's (the proposing node's --finished-ttl), which its history ages by too."""
    if RETENTION.isdisjoint(job):  # the usual create: the entry's default, in three stores
        job["finished_ttl_us"] = job["history_ttl_us"] = default_ttl_us
        job["keep_dead_letters"] = False
        return
    given = {name: job.pop(name) for name in JOB_RETENTION if name in job}
    finished = given.get("finished_ttl_us", default_ttl_us)
    job["finished_ttl_us"] = finished
    job["history_ttl_us"] = given.get("history_ttl_us", finished)
    job["keep_dead_letters"] = given.get("keep_dead_letters", False)


def _anchored(schedule: dict[str, Any], now: int) -> dict[str, Any]:
    """An interval counts from the entry that creates (or reschedules) the job, so its grid
    is exactly created_at/updated_at + k * every on every replica; one with a start
    (`start_us`) counts from that, its first occurrence."""
    if schedule["kind"] != "every":
        return schedule
    start = schedule.get("start_us")
    return dict(schedule, anchor_us=now if start is None else start - schedule["every_us"])


def cancel_job(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Stop new occurrences and cancel runs not yet leased; a running run may finish, but
    is not retried if its attempt fails (leases._fail)."""
    job_id, now = cmd["job_id"], cmd["now"]
    job = records.get_job(ctx, job_id)
    if job is None:
        return records.rejected("not_found", f"no job {job_id!r}")
    if job["state"] == JobState.CANCELLED:
        return {"ok": True, "cancelled_runs": 0}
    if ctx.version >= ops.CANCEL_WITHDRAWS_SINCE:
        # What was claimed ahead never came due: it leaves no cancelled run behind.
        claims.withdraw_ahead(ctx, job, now)
    # Counted once: a one-off's counts are not stored, and each ask reads its runs.
    stats = records.job_stats(ctx, job_id)
    pending = _pending_runs(ctx, job_id, stats)
    # A completed one-off whose run is running has something to cancel: a retry of it.
    still_running = ctx.version >= ops.CANCEL_RUNNING_SINCE and stats["running"] > 0
    if job["state"] == JobState.COMPLETED and not pending and not still_running:
        return records.rejected("conflict", f"job {job_id!r} is completed; nothing to cancel")
    old_fire, was = job["next_fire_us"], job["state"]
    job.update(state=job_transition(job["state"], JobEvent.CANCEL), next_fire_us=None, updated_us=now)
    records.put_job(ctx, job, old_fire, was)
    for run in pending:
        run_cancel.stop(ctx, run, now, Reason.JOB_CANCELLED)
    return {"ok": True, "cancelled_runs": len(pending)}


def _pending_runs(ctx: Ctx, job_id: str, stats: Record) -> list[Record]:
    if stats["pending"] == 0:
        return []
    runs = (records.get_run(ctx, run_id) for run_id in records.occurrence_runs(ctx, job_id))
    return [r for r in runs if r is not None and r["state"] in (RunState.QUEUED, RunState.RETRY_WAIT)]


def pause_job(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    return pause(ctx, cmd["job_id"], cmd["now"])


def pause(ctx: Ctx, job_id: str, now: int, cause: Record | None = None) -> dict[str, Any]:
    """No new occurrences from now. From version 9 on, a repeating job's occurrences that
    came due before the pause and were not claimed are recorded skipped (`paused`): the
    resume re-arms from its own time, so they would otherwise leave no trace. A one-off's
    stays its next fire time, for the resume (resume_job). `cause`: why the job paused
    itself (pause_on_failure), kept on the job until it is resumed."""
    job = records.get_job(ctx, job_id)
    if job is not None:
        claims.withdraw_ahead(ctx, job, now)
    err = _not_live(job, job_id)
    if err:
        return err
    skipped: dict[str, int] = {}
    if job["state"] == JobState.SCHEDULED:
        if ctx.version >= ops.OVERDUE_RECORDED_SINCE and job["schedule"]["kind"] != "at":
            skipped = claims.skip_overdue(ctx, job, now, None, Reason.PAUSED)
        old_fire = job["next_fire_us"]
        job.update(state=job_transition(job["state"], JobEvent.PAUSE), next_fire_us=None, updated_us=now)
        if cause is not None:
            job["pause_cause"] = cause
        records.put_job(ctx, job, old_fire, JobState.SCHEDULED)
    return {"ok": True, "skipped_reasons": skipped}


def resume_job(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Re-arm from now: what fell inside the pause is not caught up (paused = off on purpose).
    A one-off never fired (a fired one is completed), so it is re-armed at its own time: a
    passed one is claimed as missed (entries before version 9: at the resume's time)."""
    job = records.get_job(ctx, cmd["job_id"])
    if job is not None and ctx.version >= ops.CLAIM_AT_CREATE_SINCE and claims.one_off_ahead(job, cmd["now"]):
        return {"ok": True}  # it reads as scheduled (queries.as_seen): resuming it changes nothing
    err = _not_live(job, cmd["job_id"])
    if err:
        return err
    if job["state"] == JobState.PAUSED:
        now = cmd["now"]
        job.update(state=job_transition(job["state"], JobEvent.RESUME),
                   next_fire_us=None if claims.limit_reached(job) else
                   _rearm(job["schedule"], now, ctx.version >= ops.OVERDUE_RECORDED_SINCE),
                   updated_us=now)
        if job["next_fire_us"] is None:
            job["state"] = job_transition(job["state"], JobEvent.LAST_OCCURRENCE)
        job.pop("pause_cause", None)
        records.put_job(ctx, job, None, JobState.PAUSED)
    return {"ok": True}


def act_on_jobs(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """One action ("pause", "resume" or "cancel") on many jobs in one entry, each job as its
    own command would have it; which jobs it changed, as a caller sees them (a one-off
    claimed ahead reads as scheduled). Ids whose job is gone or past the action are left."""
    act = {"pause": pause_job, "resume": resume_job, "cancel": cancel_job}.get(cmd["action"])
    if act is None:
        return records.rejected("invalid_request", f"action {cmd['action']!r} is not pause, resume or cancel")
    now, changed, skipped = cmd["now"], [], {}
    for job_id in cmd["job_ids"]:
        before = records.get_job(ctx, job_id)
        if before is None:
            continue
        was = claims.as_seen_state(before, now)
        result = act(ctx, {"job_id": job_id, "now": now})
        after = records.get_job(ctx, job_id)
        if result["ok"] and after is not None and claims.as_seen_state(after, now) != was:
            changed.append(job_id)
        for reason, count in result.get("skipped_reasons", {}).items():
            skipped[reason] = skipped.get(reason, 0) + count
    return {"ok": True, "changed": changed, "skipped_reasons": skipped}


def _rearm(schedule: dict[str, Any], now: int, own_time: bool) -> int | None:
    if schedule["kind"] == "at":
        return schedule["at_us"] if own_time else max(schedule["at_us"], now)
    return cron.next_after(schedule, now)


def not_cancelled(job: Record | None, job_id: str) -> dict[str, Any] | None:
    """The rejection of a command that changes a job or adds a run to it (update, trigger,
    backfill) when there is no such job or it is cancelled; None when it may go on."""
    if job is None:
        return records.rejected("not_found", f"no job {job_id!r}")
    if job["state"] == JobState.CANCELLED:
        return records.rejected("conflict", f"job {job_id!r} is cancelled")
    return None


def _not_live(job: Record | None, job_id: str) -> dict[str, Any] | None:
    if job is None:
        return records.rejected("not_found", f"no job {job_id!r}")
    if job["state"] in (JobState.CANCELLED, JobState.COMPLETED):
        return records.rejected("conflict", f"job {job_id!r} is {job['state']}")
    return None


def update_job(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Change a job's definition; runs already claimed keep theirs."""
    job_id, now, changes = cmd["job_id"], cmd["now"], cmd["changes"]
    job = records.get_job(ctx, job_id)
    err = not_cancelled(job, job_id)
    if err:
        return err
    changes = {k: v for k, v in changes.items() if k in UPDATABLE}
    if "backoff" in changes and ctx.version >= ops.BACKOFF_PARTS_SINCE:
        stored = job.get("backoff") or retry.DEFAULT_BACKOFF
        changes["backoff"] = {**stored, **changes["backoff"]}
        problem = retry.backoff_problem(changes["backoff"])
        if problem:
            return records.rejected("invalid_job", f"{problem}; job {job_id!r} now has backoff {stored}")
    claims.withdraw_ahead(ctx, job, cmd["now"])
    skipped: dict[str, int] = {}
    if "schedule" in changes:
        changes["schedule"] = _anchored(changes["schedule"], now)
        if ctx.version >= ops.OVERDUE_RECORDED_SINCE:
            # Under the old definition: what came due before the new schedule's first fire.
            first = cron.first_fire(changes["schedule"], now)
            skipped = claims.skip_overdue(ctx, job, now, first, Reason.RESCHEDULED)
    old_fire, was = job["next_fire_us"], job["state"]
    job.update(changes, updated_us=now)
    rearm = "schedule" in changes or ("max_runs" in changes and job["schedule"]["kind"] != "at")
    if rearm and job["state"] != JobState.PAUSED:
        if "schedule" in changes:
            job["next_fire_us"] = cron.first_fire(job["schedule"], now)
        elif job["state"] == JobState.COMPLETED:  # a limit raised or lifted: on from now
            job["next_fire_us"] = cron.next_after(job["schedule"], now)
        if claims.limit_reached(job):
            job["next_fire_us"] = None
        if job["state"] == JobState.COMPLETED and job["next_fire_us"] is not None:
            job["state"] = job_transition(job["state"], JobEvent.REARM)
        elif job["state"] == JobState.SCHEDULED and job["next_fire_us"] is None:
            job["state"] = job_transition(job["state"], JobEvent.LAST_OCCURRENCE)
    records.put_job(ctx, job, old_fire, was)
    if "overlap_policy" in changes and changes["overlap_policy"] not in overlap.HOLDING:
        overlap.release_all(ctx, job_id, now)  # what the old policy held waits for nothing now
    if ctx.version >= ops.RETENTION_SINCE and changes.keys() & RETENTION:
        records.note_check(ctx, now, job_id)  # judged by its new retention at the next sweep
    return {"ok": True, "skipped_reasons": skipped}


def trigger_job(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """An extra occurrence now, with its own scheduled time and so its own idempotency key."""
    job_id, now = cmd["job_id"], cmd["now"]
    job = records.get_job(ctx, job_id)
    err = not_cancelled(job, job_id)
    if err:
        return err
    at = now
    while records.occurrence_taken(ctx, job_id, at):
        at += 1
    records.prune_history(ctx, job_id, job["history_limit"] - 1, now)
    run = claims.new_run(ctx, job, at, now, now, trigger=True)
    return {"ok": True, "run": run}
