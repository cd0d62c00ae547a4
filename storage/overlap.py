"""Where the overlap policy decides what a new occurrence does while runs of its job are
open (queued, waiting for a retry, or running), and where buffered runs are released.

- allow: it runs.
- skip: while any run is open, it is skipped (`overlap`).
- buffer_one: while a run waits, it is skipped; while one only runs, it waits behind it.
- buffer_all: it waits behind the open runs, however many, in scheduled order (at most
  BUFFERED_MAX wait; past them it is skipped).
- cancel_other: the open runs are cancelled (reason `overlap`) and it runs. A catch-up
  runs only the newest missed occurrence; the others fire_all would run are skipped (`overlap`).

A waiting ("buffered") run is queued but kept out of the ready index, so no worker can
lease it. The entry that closes the last open run of its job releases the oldest buffered
one (`release_freed`): they run one after another. Entries before version 17 knew no
buffering: buffer_one skipped only while a run waited, and that run could be leased beside
the running one."""
from __future__ import annotations

from schedulerd.storage import ops, records, run_cancel
from schedulerd.storage.model import OverlapPolicy, Reason
from schedulerd.storage.records import Ctx, Record

RUN, SKIP, BUFFER, REPLACE = "run", "skip", "buffer", "replace"
BUFFERED_MAX = 1000  # buffered runs of one job: a job that always overruns must not grow without end
HOLDING = frozenset({OverlapPolicy.BUFFER_ONE.value, OverlapPolicy.BUFFER_ALL.value})
_ALLOW, _SKIP = OverlapPolicy.ALLOW.value, OverlapPolicy.SKIP.value
_BUFFER_ONE, _BUFFER_ALL = OverlapPolicy.BUFFER_ONE.value, OverlapPolicy.BUFFER_ALL.value
_CANCEL_OTHER = OverlapPolicy.CANCEL_OTHER.value


def verdict(ctx: Ctx, job: Record) -> str:
    """What a new occurrence of `job` does now: RUN, SKIP, BUFFER, or REPLACE (run it
    after `make_way` cancels the open runs). Reads only."""
    policy = job["overlap_policy"]
    if policy == _ALLOW:
        return RUN
    stats = records.job_stats(ctx, job["job_id"])
    waiting, running = stats["pending"], stats["running"]
    if policy == _SKIP:
        return SKIP if waiting + running else RUN
    if ctx.version < ops.OVERLAP_HOLD_SINCE:  # buffer_one, the one other policy older entries carry
        return SKIP if waiting else RUN
    if policy == _BUFFER_ONE:
        return SKIP if waiting else BUFFER if running else RUN
    if not waiting + running:
        return RUN
    if policy == _BUFFER_ALL:
        return SKIP if stats.get("buffered", 0) >= BUFFERED_MAX else BUFFER
    return REPLACE


def replaces(ctx: Ctx, job: Record) -> bool:
    """A cancel_other job (entry version 17 on): a catch-up runs only its newest missed
    occurrence, as each run it made would cancel the one before it at once."""
    return ctx.version >= ops.OVERLAP_HOLD_SINCE and job["overlap_policy"] == _CANCEL_OTHER


def make_way(ctx: Ctx, job_id: str, now: int) -> None:
    """Cancel every open run of the job (cancel_other), newest first."""
    stats = records.job_stats(ctx, job_id)
    left = stats["pending"] + stats["running"]
    for run in _open_runs(ctx, job_id, left):
        run_cancel.stop(ctx, run, now, Reason.OVERLAP)


def release_freed(ctx: Ctx, now: int) -> None:
    """At the end of an entry: for each job whose last open run it closed, release its
    oldest buffered run into the ready queue; a job no longer on a buffering policy (a
    PATCH changed it) gets all of its buffered runs released."""
    for job_id in sorted(ctx.freed):
        stats = records.job_stats(ctx, job_id)
        held = stats.get("buffered", 0)
        job = records.get_job(ctx, job_id)
        if not held or job is None:
            continue
        holding = job["overlap_policy"] in HOLDING
        if holding and records.open_runs(stats):
            continue
        open_runs = _open_runs(ctx, job_id, stats["pending"] + stats["running"])
        buffered = [run for run in open_runs if run.get("buffered")]
        for run in reversed(buffered[-1:] if holding else buffered):  # oldest first
            after = dict(run, available_us=max(run["available_us"], now))
            del after["buffered"]
            records.update_run(ctx, run, after)
    ctx.freed.clear()


def _open_runs(ctx: Ctx, job_id: str, count: int) -> list[Record]:
    """The job's newest `count` open runs (there are that many, by its stored counts)."""
    found: list[Record] = []
    if count <= 0:
        return found
    for run in records.newest_runs(ctx, job_id):
        if run["state"] in run_cancel.CANCELLABLE:
            found.append(run)
            if len(found) == count:
                break
    return found
