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
one (`release_freed`): they run one after another, whichever policy buffered them (a
backfill may name its own). A PATCH to a policy that does not buffer releases them all. Entries before version 17 knew no
buffering: buffer_one skipped only while a run waited, and that run could be leased beside
the running one."""
from __future__ import annotations

from schedulerd.storage import ops, records, run_cancel
from schedulerd.storage.model import OverlapPolicy, Reason
from schedulerd.storage.records import Ctx, Record

RUN, SKIP, BUFFER, REPLACE = "run", "skip", "buffer", "replace"
BUFFERED_MAX = 1000  # buffered runs of one job: a job that always overruns must not grow without end
_ALLOW, _SKIP = OverlapPolicy.ALLOW.value, OverlapPolicy.SKIP.value
_BUFFER_ONE, _BUFFER_ALL = OverlapPolicy.BUFFER_ONE.value, OverlapPolicy.BUFFER_ALL.value
HOLDING = frozenset({_BUFFER_ONE, _BUFFER_ALL})  # the policies that buffer
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
    """At the end of an entry: each job whose last open run it closed gets its oldest
    buffered run released into the ready queue."""
    for job_id in sorted(ctx.freed):
        stats = records.job_stats(ctx, job_id)
        if stats.get("buffered") and not records.active_runs(stats):
            _release(ctx, _buffered(ctx, job_id, stats)[-1:], now)
    ctx.freed.clear()


def release_all(ctx: Ctx, job_id: str, now: int) -> None:
    """Release every buffered run of a job whose policy no longer buffers (a PATCH)."""
    stats = records.job_stats(ctx, job_id)
    if stats.get("buffered"):
        _release(ctx, _buffered(ctx, job_id, stats), now)


def _buffered(ctx: Ctx, job_id: str, stats: Record) -> list[Record]:
    """The job's buffered runs, newest first."""
    return [run for run in _open_runs(ctx, job_id, stats["pending"] + stats["running"]) if run.get("buffered")]


def _release(ctx: Ctx, runs: list[Record], now: int) -> None:
    for run in reversed(runs):  # oldest first
        after = dict(run, available_us=max(run["available_us"], now))
        del after["buffered"]
        records.update_run(ctx, run, after)


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
