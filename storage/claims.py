"""Applying a claim batch: due occurrences become runs, exactly once, and the
occurrences that will not run become `skipped` runs that say why.

A claim names (job_id, fire_us) as the proposer saw it. It succeeds only if
the job is still scheduled with that very next_fire_us (compare-and-set), so
a second claim of the same occurrence, from a stale leader or a retried
proposal, changes nothing.

An occurrence more than `grace_us` in the past at claim time was missed (the
group had no leader, or the cluster was down): the job's misfire_policy
decides what runs, over at most catchup_limit of the newest missed
occurrences; older ones get one summary record.

An occurrence claimed ahead of its time that the overlap rule would skip now
is deferred, not skipped: the rule is about the occurrence's time, and the open
run may be done by then. The leader proposes it again once it is due.

A pause or an update gives back what was claimed ahead of its time
(`withdraw_ahead`), so claiming early never changes what those commands mean.
Both rules about claims ahead hold for entries of version 2 on (ops.py)."""
from __future__ import annotations

import zlib
from typing import Any

from schedulerd.storage import calendars as calendars_, catchup, cron, ops, overlap, records
from schedulerd.storage.model import (JOB_COMPLETED, JOB_SCHEDULED, RUN_QUEUED, JobEvent, JobState, MisfirePolicy,
                                      Reason, RunState, job_transition)
from schedulerd.storage.records import Ctx, Record

DEFAULT_GRACE_US = 5_000_000
BACKFILL_SPACING_US = 100_000  # missed runs of one job are released this far apart
BACKFILL_SPREAD_US = 1_000_000  # and each job's first one within this window after now


def claim_batch(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    now, grace = cmd["now"], cmd.get("grace_us", DEFAULT_GRACE_US)
    calendars = cmd.get("calendars", {}) if ctx.version >= ops.CALENDAR_SINCE else {}
    queued: list[str] = []
    deferred: list[list[Any]] = []
    stale = skipped = 0
    reasons: dict[str, int] = {}
    for job_id, fire_us in cmd["claims"]:
        job = records.get_job(ctx, job_id)
        if job is None or job["state"] != JOB_SCHEDULED or job["next_fire_us"] != fire_us:
            stale += 1
            continue
        if records.occurrence_taken(ctx, job_id, fire_us):
            # A manual trigger landed on this exact microsecond: that run stands for
            # the occurrence; move on rather than leave the job stuck on it.
            _advance(ctx, job, cron.next_after(job["schedule"], fire_us), fire_us, now)
            stale += 1
            continue
        if fire_us > now and ctx.version >= ops.AHEAD_RULES_SINCE and overlap.verdict(ctx, job) != overlap.RUN:
            deferred.append([job_id, fire_us])
            continue
        # Make room before adding: the records this claim makes (a catch-up summary
        # among them) are always there to read, even past history_limit.
        records.prune_history(ctx, job_id, job["history_limit"] - 1, now)
        cutoff = now - grace
        made = [_claim_on_time(ctx, job, fire_us, now, fire_us, calendars)] if fire_us >= cutoff else \
            _claim_missed(ctx, job, fire_us, now, cutoff, calendars)
        skipped += sort_made(made, queued, reasons)
    return {"runs": queued, "skipped": skipped, "stale": stale, "skipped_reasons": reasons, "deferred": deferred}


def sort_made(made: list[Record], queued: list[str], reasons: dict[str, int]) -> int:
    """Sort the runs a claim made: the queued ones' ids into `queued`, the others counted by
    reason into `reasons`; returns how many were skipped."""
    skipped = 0
    for run in made:
        if run["state"] == RUN_QUEUED:
            queued.append(run["run_id"])
        else:
            skipped += 1
            reason = run["reason"] or "unknown"
            reasons[reason] = reasons.get(reason, 0) + 1
    return skipped


def claim_created(ctx: Ctx, job: Record, now: int, grace_us: int, ahead_us: int) -> Record | None:
    """Claim a new job's first occurrence in the entry that creates it, when it is due
    within `ahead_us` and was not missed: what the leader's next scan would do, without
    a claim entry and a second write of the job. Stores the job either way; returns the
    run made, or None when the occurrence is left to the scan. A job naming a calendar
    leaves it to the scan, whose entry carries the calendar (a create's does not)."""
    fire_us = job["next_fire_us"]
    if fire_us is None or not now - grace_us <= fire_us <= now + ahead_us or job.get("skip_calendar") is not None:
        records.put_job(ctx, job, None, None)
        return None
    return _claim_on_time(ctx, job, fire_us, now, None, {})


def _claim_on_time(ctx: Ctx, job: Record, fire_us: int, now: int, old_fire: int | None,
                   calendars: calendars_.Calendars) -> Record:
    nxt = cron.next_after(job["schedule"], fire_us)
    if calendars_.skips(calendars, job, fire_us):
        run = skipped_run(ctx, job, fire_us, now, Reason.CALENDAR)
    else:
        run = new_run(ctx, job, fire_us, now, fire_us + start_offset_us(job, fire_us, nxt, ctx.version))
    _advance(ctx, job, None if _count_run(job, run) else nxt, old_fire, now)
    return run


def limit_reached(job: Record) -> bool:
    """A limited job (`max_runs`) has made all the runs it may: it has no next occurrence."""
    limit = job.get("max_runs")
    return limit is not None and job.get("runs_made", 0) >= limit


def _count_run(job: Record, run: Record) -> bool:
    """Count a run made for one of a limited job's occurrences (`max_runs`, entry version
    14); whether the limit is now reached, and the job done. A skipped occurrence did not run."""
    limit = job.get("max_runs")
    if limit is None or run["state"] != RUN_QUEUED:
        return False
    job["runs_made"] = job.get("runs_made", 0) + 1
    return limit_reached(job)


def _claim_missed(ctx: Ctx, job: Record, fire_us: int, now: int, cutoff: int,
                  calendars: calendars_.Calendars) -> list[Record]:
    found = catchup.missed(job["schedule"], fire_us, cutoff, job["catchup_limit"],
                           exact=ctx.version >= ops.OVERDUE_RECORDED_SINCE)
    made: list[Record] = []
    made += _summary(ctx, job, found, now)
    policy = job["misfire_policy"]
    to_run = {MisfirePolicy.FIRE_ALL: found.recent, MisfirePolicy.FIRE_ONCE: found.recent[-1:],
              MisfirePolicy.SKIP: []}[MisfirePolicy(policy)]
    replacing = overlap.replaces(ctx, job)
    if replacing:
        to_run = to_run[-1:]  # each would cancel the one before it at once: the newest runs, the rest are skipped
    run_set = set(to_run)
    release = now + zlib.crc32(job["job_id"].encode()) % BACKFILL_SPREAD_US
    done = False
    for t in found.recent:
        if records.occurrence_taken(ctx, job["job_id"], t):
            continue  # a manual trigger or a run claimed ahead already stands for it
        if calendars_.skips(calendars, job, t):
            made.append(skipped_run(ctx, job, t, now, Reason.CALENDAR))
        elif t in run_set:
            made.append(new_run(ctx, job, t, now, release))
            release += BACKFILL_SPACING_US
            if _count_run(job, made[-1]):
                done = True  # the occurrences after the last run a limited job may make are not its
                break
        else:
            reason = Reason.OVERLAP if replacing and policy == MisfirePolicy.FIRE_ALL else Reason.MISFIRE_SKIP
            made.append(skipped_run(ctx, job, t, now, reason))
    _advance(ctx, job, None if done else cron.next_after(job["schedule"], cutoff - 1), fire_us, now)
    return made


def skip_overdue(ctx: Ctx, job: Record, now: int, before_us: int | None, reason: Reason) -> dict[str, int]:
    """Record as skipped (`reason`) the occurrences of a scheduled job that came due at or
    before `now`, and before `before_us` when given, and were not claimed: a pause or a
    schedule PATCH is about to move the job past them. The newest catchup_limit get a
    record each, the older ones a summary, as a catch-up would. Returns the count by reason."""
    fire_us = job["next_fire_us"]
    end = now + 1 if before_us is None else min(now + 1, before_us)
    if job["state"] != JOB_SCHEDULED or fire_us is None or fire_us >= end:
        return {}
    records.prune_history(ctx, job["job_id"], job["history_limit"] - 1, now)
    found = catchup.missed(job["schedule"], fire_us, end, job["catchup_limit"])
    made = _summary(ctx, job, found, now)
    made += [skipped_run(ctx, job, t, now, reason) for t in found.recent
             if not records.occurrence_taken(ctx, job["job_id"], t)]
    reasons: dict[str, int] = {}
    sort_made(made, [], reasons)
    return reasons


def new_run(ctx: Ctx, job: Record, scheduled_us: int, now: int, available_us: int,
            trigger: bool = False, backfill: bool = False) -> Record:
    """The run of one occurrence: queued, or skipped by the deadline or overlap rules. A
    trigger is subject to neither; a backfilled occurrence (storage/backfill.py) to no deadline."""
    deadline = job.get("starting_deadline_us")
    if deadline is not None and scheduled_us + deadline < now and not (trigger or backfill):
        return skipped_run(ctx, job, scheduled_us, now, Reason.DEADLINE)
    action = overlap.RUN if trigger else overlap.verdict(ctx, job)
    if action == overlap.SKIP:
        return skipped_run(ctx, job, scheduled_us, now, Reason.OVERLAP)
    if action == overlap.REPLACE:
        overlap.make_way(ctx, job["job_id"], now)
    run = _new_run(ctx, job, scheduled_us, now, RUN_QUEUED, available_us)
    run["trigger"] = trigger
    if backfill:
        run["starting_deadline_us"] = None  # its lease checks the run's own copy
    if action == overlap.BUFFER:
        run["buffered"] = True
    records.insert_run(ctx, run, _keeps_stats(ctx, job, trigger))
    return run


def _keeps_stats(ctx: Ctx, job: Record, trigger: bool) -> bool:
    """Whether a job's run counts are stored (records.job_stats): from version 4 on, for a
    job that repeats and for a one-off once triggered (it may be triggered again and
    again); entries before it store every job's."""
    return ctx.version < ops.STATS_KEPT_SINCE or trigger or job["schedule"]["kind"] != "at"


def skipped_run(ctx: Ctx, job: Record, scheduled_us: int, now: int, reason: Reason) -> Record:
    run = _new_run(ctx, job, scheduled_us, now, RunState.SKIPPED.value, scheduled_us)
    run.update(reason=reason.value, finished_us=now)
    records.insert_run(ctx, run, _keeps_stats(ctx, job, False))
    return run


def _summary(ctx: Ctx, job: Record, found: catchup.Missed, now: int) -> list[Record]:
    """One record standing for every missed occurrence older than the catchup_limit newest,
    if there are any: at the first of them that no trigger's run already holds (a summary on
    a triggered occurrence would claim it twice, and stop the group)."""
    first = found.older_first
    while first is not None and records.occurrence_taken(ctx, job["job_id"], first):
        first = cron.next_after(job["schedule"], first)
    if first is None or found.older_last is None or first > found.older_last:
        return []
    run = _new_run(ctx, job, first, now, RunState.SKIPPED.value, first)
    count = found.older_count
    run.update(reason=Reason.CATCHUP_LIMIT.value, finished_us=now, skipped_count=count,
               skipped_until_us=found.older_last,
               error=(f"{count if count is not None else f'more than {catchup.COUNT_STEPS_MAX}'} missed "
                      f"occurrences beyond catchup_limit={job['catchup_limit']} were not run"))
    records.insert_run(ctx, run, _keeps_stats(ctx, job, False))
    return [run]


# A new run's fields in the order they are stored (replicas must write the same bytes:
# queries.state_digest), with the values no claim sets. Copying it and setting the rest
# costs half of building the 22-entry literal.
_RUN_TEMPLATE: Record = {
    "run_id": None, "job_id": None, "scheduled_us": None, "state": None, "attempt": 0, "queue": None,
    "priority": None, "max_attempts": None, "backoff": None, "timeout_us": None, "available_us": None,
    "worker_id": None, "fence": 0, "lease_until_us": None, "attempt_deadline_us": None, "created_us": None,
    "finished_us": None, "result_json": None, "error": None, "reason": None, "trigger": False,
    "starting_deadline_us": None,
}


def _new_run(ctx: Ctx, job: Record, scheduled_us: int, now: int, state: str, available_us: int) -> Record:
    run = _RUN_TEMPLATE.copy()
    run["run_id"] = ctx.new_run_id()
    run["job_id"] = job["job_id"]
    run["scheduled_us"] = scheduled_us
    run["state"] = state
    run["queue"] = job["queue"]
    run["priority"] = job["priority"]
    run["max_attempts"] = job["max_attempts"]
    run["backoff"] = job["backoff"]
    run["timeout_us"] = job["timeout_us"]
    run["available_us"] = available_us
    run["created_us"] = now
    # Fixed at claim like the fields above: the lease checks it without reading the job.
    run["starting_deadline_us"] = job.get("starting_deadline_us")
    return run


def start_offset_us(job: Record, fire_us: int, next_us: int | None, version: int) -> int:
    """Deterministic start offset in [0, jitter_us], kept before the next occurrence.

    A jitter at or above the gap to the next occurrence is spread over that gap: clamping
    the offset instead put every offset past the gap on its last microsecond, so the jobs
    of one schedule all started at the same instant, one gap later."""
    spread = job["jitter_us"]
    if spread <= 0:
        return 0
    if next_us is not None and version >= ops.JITTER_WITHIN_GAP_SINCE:
        spread = min(spread, next_us - fire_us - 1)
    offset = zlib.crc32(f"{job['job_id']}:{fire_us}".encode()) % (spread + 1)
    return min(offset, next_us - fire_us - 1) if next_us is not None else offset


def _advance(ctx: Ctx, job: Record, nxt: int | None, old_fire: int | None, now: int) -> None:
    """Move the job on to nxt. old_fire None: the job is new in this entry (claim_created),
    so it has no due entry to move and no earlier state to count down."""
    was = job["state"] if old_fire is not None else None
    job.update(next_fire_us=nxt, updated_us=now)
    if nxt is None:
        job["state"] = job_transition(job["state"], JobEvent.LAST_OCCURRENCE)
    records.put_job(ctx, job, old_fire, was)


def as_seen_state(job: Record, now: int) -> str:
    """The job's state as a caller sees it at `now` (see one_off_ahead)."""
    return JOB_SCHEDULED if one_off_ahead(job, now) else str(job["state"])


def one_off_ahead(job: Record, now: int) -> bool:
    """A one-off completed by a claim ahead of its time, which has not come yet at `now`.
    It has not fired: it reads as scheduled (queries.as_seen), a pause or an update
    withdraws its claim, and a resume of it is the no-op a resume of a scheduled job is."""
    schedule = job["schedule"]
    return job["state"] == JOB_COMPLETED and schedule["kind"] == "at" and schedule["at_us"] > now


def withdraw_ahead(ctx: Ctx, job: Record, now: int) -> None:
    """Give back the occurrences claimed ahead of their time: queued runs scheduled after
    `now` (a trigger stays). Their runs and occurrence keys go and the job's next fire
    time moves back to the earliest, so the command that follows treats them as never
    claimed. Only a scheduled or a completed job holds such runs: a pause gives them
    back, a cancel cancels them. Entries of version 1 withdraw nothing."""
    was, old_fire = job["state"], job["next_fire_us"]
    if ctx.version < ops.AHEAD_RULES_SINCE or was not in (JobState.SCHEDULED, JobState.COMPLETED):
        return
    earliest: int | None = None
    for run_id in records.occurrence_runs(ctx, job["job_id"], after_us=now):  # oldest first
        run = records.get_run(ctx, run_id)
        if run is None or run["trigger"] or run["state"] != RunState.QUEUED:
            continue
        records.delete_run(ctx, run)
        if job.get("max_runs") is not None:
            # Counted when claimed (an update withdraws before it sets a limit), and claimed
            # again later: uncounted here.
            job["runs_made"] = max(0, job.get("runs_made", 0) - 1)
        if earliest is None:
            earliest = run["scheduled_us"]
    if earliest is None:
        return
    if old_fire is None or earliest < old_fire:
        job["next_fire_us"] = earliest
    if was == JobState.COMPLETED:
        job["state"] = job_transition(was, JobEvent.REARM)
    job["updated_us"] = now
    records.put_job(ctx, job, old_fire, was)
