"""Why an instant of a job did or did not run: one verdict, decided from the records of
one read of the job's group (GET /v1/jobs/{id}/occurrences/{time}, `schedctl explain`).

Read-only and pure, like the rest of storage/: the caller passes the job, a reader and
its `now`. Whether an instant is an occurrence is computed with cron.next_after, the
function claims use, so time zones, DST, an interval's anchor and a schedule's bounds
count exactly as they did for the claims. The records keep only the job's current
schedule, and nothing of what was deleted: where they cannot tell why an occurrence has
no record, the verdict says so (`no_record`, with the possible causes) instead of guessing.

The order of the questions:
1. a run record for (job, instant): it ran, was skipped, or is claimed ahead;
2. the job did not exist yet; the instant is outside the schedule's bounds; it is not an
   occurrence of the schedule (the nearest ones before and after it);
3. a catch-up summary stands for it (skipped, `catchup_limit`);
4. the job was finished or paused at the instant (as far as its record shows);
5. it is still to come, or due and not yet claimed;
6. else its record is gone or never was: `history_pruned` when the job's retention would
   have deleted it, `no_record` otherwise."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from schedulerd.storage import claims, cron, keys, records
from schedulerd.storage.model import JOB_COMPLETED, JOB_SCHEDULED, TERMINAL_RUN_STATES, JobState, Reason, RunState
from schedulerd.storage.records import Reader, Record
from schedulerd.units import US_PER_S

# Runs looked at when searching back from an instant for the catch-up summary that covers
# it (manual triggers may lie between), and from a job's oldest run for its oldest
# terminal one (dead letters and open runs may come first): one answer reads a bounded few.
SCAN_RUNS_MAX = 64
# The first window searched back for the previous occurrence; it doubles until one lies in it.
_FIRST_WINDOW_US = US_PER_S
_TERMINAL = frozenset(state.value for state in TERMINAL_RUN_STATES)
_FINISHED = frozenset({JobState.COMPLETED.value, JobState.CANCELLED.value})


class Verdict(str, Enum):
    RAN = "ran"  # a run record: queued, running, succeeded, retry_wait, dead_letter or cancelled
    SKIPPED = "skipped"  # a skipped run record, or a catch-up summary that stands for it
    NOT_YET_DUE = "not_yet_due"  # still to come (claimed ahead, or not yet claimed)
    AWAITING_CLAIM = "awaiting_claim"  # due, and the group leader has not claimed it yet
    NOT_AN_OCCURRENCE = "not_an_occurrence"
    EXCLUDED_BY_BOUNDS = "excluded_by_bounds"  # before schedule.start_at or after schedule.end_at
    BEFORE_JOB_CREATED = "before_job_created"
    AFTER_JOB_FINISHED = "after_job_finished"  # completed or cancelled before it
    JOB_PAUSED = "job_paused"  # the job is paused, and was at that instant
    HISTORY_PRUNED = "history_pruned"  # older than the history the job's retention keeps
    NO_RECORD = "no_record"  # a past occurrence the records say nothing of


class Cause(str, Enum):
    """Why a past occurrence may have no record, when the records cannot tell which."""

    HISTORY_PRUNED = "history_pruned"  # its run was deleted by history_limit or history_ttl
    PAUSED = "paused"  # the job was paused over it (a pause and its resume leave no trace)
    SCHEDULE_CHANGED = "schedule_changed"  # the schedule was different then (only the current one is kept)
    DEAD_LETTER_DISCARDED = "dead_letter_discarded"  # its run was a dead letter, discarded


@dataclass(frozen=True)
class Answer:
    """A verdict and the recorded facts behind it (times in epoch microseconds)."""

    verdict: Verdict
    run: Record | None = None  # the run that stands for the instant, a catch-up summary included
    previous_us: int | None = None  # not_an_occurrence: the nearest occurrences around the instant
    next_us: int | None = None
    bound: str | None = None  # excluded_by_bounds: "start_at" or "end_at"
    kept_runs: int | None = None  # history_pruned, no_record: runs kept (counted up to history_limit)
    oldest_kept_us: int | None = None  # ... and the oldest kept run that pruning would have dropped first
    pruned_by: tuple[str, ...] = ()  # history_pruned: the rules that would have deleted its record
    causes: tuple[Cause, ...] = ()  # no_record: what may explain it


def explain(reader: Reader, job: Record, at_us: int, now_us: int) -> Answer:
    """The verdict on instant `at_us` of `job` at `now_us`, from the records `reader` sees."""
    run = records.run_at(reader, job["job_id"], at_us)
    if run is not None:
        return _recorded(run, now_us)
    schedule = job["schedule"]
    if _before_creation(job, at_us):
        return Answer(Verdict.BEFORE_JOB_CREATED)
    start, end = schedule.get("start_us"), schedule.get("end_us")
    if start is not None and at_us < start or end is not None and at_us > end:
        return Answer(Verdict.EXCLUDED_BY_BOUNDS, bound="start_at" if start is not None and at_us < start else "end_at")
    if cron.next_after(schedule, at_us - 1) != at_us:
        return Answer(Verdict.NOT_AN_OCCURRENCE, previous_us=previous_occurrence(schedule, at_us),
                      next_us=cron.next_after(schedule, at_us))
    summary = _summary_covering(reader, job["job_id"], at_us)
    if summary is not None:
        return Answer(Verdict.SKIPPED, run=summary)
    return _unclaimed(reader, job, at_us, now_us)


def _recorded(run: Record, now_us: int) -> Answer:
    if run["state"] == RunState.SKIPPED.value:
        return Answer(Verdict.SKIPPED, run=run)
    if run["scheduled_us"] > now_us and run["state"] == RunState.QUEUED.value and not run["trigger"]:
        return Answer(Verdict.NOT_YET_DUE, run=run)  # claimed ahead of its time
    return Answer(Verdict.RAN, run=run)


def _before_creation(job: Record, at_us: int) -> bool:
    """At or before the job's creation, which considered no occurrence that early: a cron
    fires first after its creation, an interval first one interval after its anchor (the
    creation, or a later PATCH). A one-off's past time, and an interval's past start_at,
    were claimed as missed occurrences, so their records answer."""
    kind = job["schedule"]["kind"]
    if at_us > job["created_us"] or kind == "at":
        return False
    start = job["schedule"].get("start_us")
    return kind == "cron" or start is None or at_us < start


def _unclaimed(reader: Reader, job: Record, at_us: int, now_us: int) -> Answer:
    """An occurrence of the schedule, within its bounds, that no run stands for."""
    state = claims.as_seen_state(job, now_us)
    # A finished or paused job's record last changed at updated_us, so it was in that state
    # from then on. A completed one-off completed by claiming its own occurrence, though.
    if state in _FINISHED and at_us > job["updated_us"] and not (
            state == JOB_COMPLETED and job["schedule"]["kind"] == "at"):
        return Answer(Verdict.AFTER_JOB_FINISHED)
    # A pause records what came due before it; a paused one-off keeps its time for the resume.
    if state == JobState.PAUSED.value and (at_us > job["updated_us"] or job["schedule"]["kind"] == "at"):
        return Answer(Verdict.JOB_PAUSED)
    if at_us > now_us:
        return Answer(Verdict.NOT_YET_DUE)
    if state == JOB_SCHEDULED and job["next_fire_us"] is not None and at_us >= job["next_fire_us"]:
        return Answer(Verdict.AWAITING_CLAIM)
    return _unrecorded(reader, job, at_us, now_us)


def _unrecorded(reader: Reader, job: Record, at_us: int, now_us: int) -> Answer:
    """A past occurrence the job went past without a record that is still kept."""
    limit = job["history_limit"]
    kept, oldest_terminal_us = _kept_history(reader, job["job_id"], limit)
    pruning_reaches = oldest_terminal_us is None or at_us < oldest_terminal_us
    pruned_by: list[str] = []
    if pruning_reaches and kept >= limit:
        pruned_by.append("history_limit")
    ttl = job.get("history_ttl_us", 0)
    # A run of it would have ended at or after its time, and goes history_ttl after it ended.
    if pruning_reaches and ttl and at_us + ttl <= now_us:
        pruned_by.append("history_ttl")
    if pruned_by:
        return Answer(Verdict.HISTORY_PRUNED, kept_runs=kept, oldest_kept_us=oldest_terminal_us,
                      pruned_by=tuple(pruned_by))
    causes = [Cause.HISTORY_PRUNED] if pruning_reaches else []
    causes.append(Cause.PAUSED)
    if _schedule_may_have_changed(job):
        causes.append(Cause.SCHEDULE_CHANGED)
    causes.append(Cause.DEAD_LETTER_DISCARDED)
    return Answer(Verdict.NO_RECORD, kept_runs=kept, oldest_kept_us=oldest_terminal_us, causes=tuple(causes))


def _schedule_may_have_changed(job: Record) -> bool:
    """An unbounded interval is anchored where its schedule was last set: at the job's
    creation, unless a PATCH set it since. Any other schedule keeps no such trace."""
    schedule = job["schedule"]
    return not (schedule["kind"] == "every" and schedule.get("start_us") is None
                and schedule["anchor_us"] == job["created_us"])


def _kept_history(reader: Reader, job_id: str, limit: int) -> tuple[int, int | None]:
    """How many runs the job keeps (counted up to `limit`), and the scheduled time of its
    oldest terminal run: history pruning and retention delete terminal runs oldest first,
    stepping over dead letters and open runs. None when none is found among the first
    SCAN_RUNS_MAX, so pruning may have reached any instant."""
    run_ids = records.occurrence_runs(reader, job_id, limit)
    for run_id in run_ids[:SCAN_RUNS_MAX]:
        run = records.get_run(reader, run_id)
        if run is not None and run["state"] in _TERMINAL:
            return len(run_ids), run["scheduled_us"]
    return len(run_ids), None


def _summary_covering(reader: Reader, job_id: str, at_us: int) -> Record | None:
    """The catch-up summary whose span of skipped occurrences holds at_us: the job's latest
    run before it that is not a manual trigger (only a trigger can fall inside the span of
    missed occurrences a summary stands for), if that run is such a summary."""
    prefix = keys.occurrence_prefix(job_id)
    with reader.txn.cursor(db=reader.tables.occurrences) as cur:
        if not cur.set_range(keys.occurrence_key(job_id, at_us)):
            if not cur.last():
                return None
        elif not cur.prev():
            return None
        for n, (key, value) in enumerate(cur.iterprev()):
            if n >= SCAN_RUNS_MAX or not key.startswith(prefix):
                return None
            run = records.get_run(reader, value.decode())
            if run is None or run["trigger"]:
                continue
            covers = run["reason"] == Reason.CATCHUP_LIMIT.value and (run.get("skipped_until_us") or -1) >= at_us
            return run if covers else None
    return None


def previous_occurrence(schedule: dict[str, Any], before_us: int) -> int | None:
    """The latest occurrence strictly before `before_us`, None when there is none.

    cron.next_after only looks forward, and is monotone in its argument: a window back from
    before_us is doubled until an occurrence lies in it, then the last instant whose next
    occurrence still comes before before_us is bisected for (about 60 steps)."""
    start = schedule.get("start_us")
    floor = -1 if start is None else start - 1  # nothing lies before the epoch, or before the start
    span = _FIRST_WINDOW_US
    while True:
        low = max(floor, before_us - 1 - span)
        found = cron.next_after(schedule, low)
        if found is not None and found < before_us:
            break
        if low == floor:
            return None
        span *= 2
    high = before_us - 1  # next_after(high) is at or after before_us
    while high - low > 1:
        mid = (low + high) // 2
        found = cron.next_after(schedule, mid)
        if found is not None and found < before_us:
            low = mid
        else:
            high = mid
    return cron.next_after(schedule, low)
