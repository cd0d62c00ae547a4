"""Where a finished job or run is deleted: a job purged with all of its runs (its id
may then be created again), a dead letter discarded, and what a TTL lets go.

Deleting a job takes every trace of it: its runs and their index entries, its
occurrence keys, its stored run counts, its idempotency-key ledger entry and its
place in the per-state totals. Run ids embed the Raft index of the entry that made
them, so a run of a job created again never has the id of an earlier job's run: a
worker still holding a purged run hears `not_found` for it, never another run's
answer. These commands exist from entry version 11 on (ops.PURGE_SINCE).

Expiry. A job has a key in the expiry index, `(check_us, job_id)`, from when it
enters a finished state (a TTL later) and, for a repeating job, from its creation (a
history TTL later). The leader's sweep reads the keys due by now and proposes
SWEEP_EXPIRED; for each, `judge` decides, from the store alone, which runs go now,
whether the job goes, and when to look again. The keys are hints and the judgement is
the rule, so a key left behind (a job re-armed, purged, created again) does no harm.

- A closed job (completed or cancelled, none of its runs waiting or running) goes with
  its runs once each run finished and the job itself changed at least finished_ttl ago.
- Otherwise a job's history ages: runs that finished more than history_ttl ago go,
  whatever history_limit allows.
- Dead letters age like any run unless the job keeps them (keep_dead_letters); a kept
  dead letter keeps its job too.

A key's runs are read oldest first, and one entry reads at most `runs_max` runs in all,
so a sweep of millions proceeds in bounded entries."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schedulerd.storage import keys, records
from schedulerd.storage.model import (FINISHED_JOB_STATES, PENDING_RUN_STATES, RUN_DEAD_LETTER, RUN_RUNNING,
                                      RunState)
from schedulerd.storage.records import Ctx, Record


def purge_job(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Delete a completed or cancelled job none of whose runs is queued, running or waiting
    to retry: up to `runs_max` of its runs per entry, then the job itself (`done`). The
    proposer repeats the command until it is done."""
    job_id, runs_max = cmd["job_id"], cmd["runs_max"]
    job = records.get_job(ctx, job_id)
    if job is None:
        return records.rejected("not_found", f"no job {job_id!r}")
    if job["state"] not in FINISHED_JOB_STATES:
        return records.rejected("conflict", f"job {job_id!r} is {job['state']}: cancel it before purging it")
    stats = records.job_stats(ctx, job_id)
    if stats["pending"] or stats["running"]:
        return records.rejected("conflict", f"job {job_id!r} still has {stats['pending']} run(s) waiting and "
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
        return records.rejected("not_found", f"no run {run_id!r}")
    if run["state"] != RunState.DEAD_LETTER:
        return records.rejected("conflict", f"run {run_id!r} is {run['state']}, not dead_letter: only a dead letter is "
                                "discarded")
    records.reopen_dead_head(ctx, run)  # the history's count of dead letters at its head may hold this one
    records.delete_run(ctx, run)
    return {"ok": True, "run": run}


@dataclass
class Verdict:
    """What one expiry key's check decides."""

    runs: list[str] = field(default_factory=list)  # run ids that go now, oldest first
    job: bool = False  # the job goes too (after its runs)
    next_check_us: int | None = None  # when to look again; None: no key (the job went, or nothing ever will)
    read: int = 0  # runs read, against the entry's budget
    # The records judged, so a delete does not read and decode them again.
    job_record: Record | None = field(default=None, repr=False)
    run_records: dict[str, Record] = field(default_factory=dict, repr=False)


def judge(ctx: Ctx, job_id: str, now: int, budget: int) -> Verdict:
    """The rule, read-only: the leader judges on its replica to archive what will go, and
    apply judges again on each replica to delete it."""
    job = records.get_job(ctx, job_id)
    if job is None:
        return Verdict()
    finished_ttl, history_ttl = job.get("finished_ttl_us", 0), job.get("history_ttl_us", 0)
    if not finished_ttl and not history_ttl:
        return Verdict()
    # Read once: the runs a budget allows, oldest first; they also tell whether the job is
    # closed when they are all of its runs (a one-off's one), else its counts do.
    run_ids = records.occurrence_runs(ctx, job_id, budget + 1)
    runs = [run for run in (records.get_run(ctx, run_id) for run_id in run_ids[:budget]) if run is not None]
    if len(run_ids) <= budget:
        open_runs = any(run["state"] in PENDING_RUN_STATES or run["state"] == RUN_RUNNING for run in runs)
    else:
        stats = records.job_stats(ctx, job_id)
        open_runs = bool(stats["pending"] or stats["running"])
    closed = job["state"] in FINISHED_JOB_STATES and not open_runs
    if closed and finished_ttl:
        verdict = _age(job, runs, len(run_ids) > budget, now, finished_ttl, whole=True)
    elif history_ttl:
        verdict = _age(job, runs, len(run_ids) > budget, now, history_ttl, whole=False)
    else:
        verdict = Verdict(next_check_us=now + finished_ttl, read=len(runs))  # look again once its runs may be done
    verdict.job_record = job
    verdict.run_records = {run["run_id"]: run for run in runs}
    return verdict


def _age(job: Record, runs: list[Record], more: bool, now: int, ttl: int, whole: bool) -> Verdict:
    """Runs that finished `ttl` ago or more go, oldest first; with `whole`, the job too once
    none is left. A run not yet that old stops the scan and says when to look again. `more`:
    the job has runs past these, for a later look."""
    keep_dead = job.get("keep_dead_letters", False)
    verdict = Verdict(read=len(runs))
    kept = False
    for run in runs:
        state = run["state"]
        if state in PENDING_RUN_STATES or state == RUN_RUNNING or run["scheduled_us"] >= now \
                or (state == RUN_DEAD_LETTER and keep_dead):
            kept = True
            continue
        # Every ended run has its end time; a record without one counts from its creation.
        ended = run["finished_us"] if run["finished_us"] is not None else run["created_us"]
        if ended + ttl > now:
            verdict.next_check_us = ended + ttl
            return verdict
        verdict.runs.append(run["run_id"])
    if more:
        verdict.next_check_us = now  # more to read: the next sweep goes on
    elif whole and not kept and job["updated_us"] + ttl <= now:
        verdict.job = True
    else:
        verdict.next_check_us = max(now, job["updated_us"]) + ttl
    return verdict


def plan(ctx: Ctx, checks: list[tuple[int, str]], now: int, budget: int) -> list[tuple[int, str, Verdict]]:
    """The verdicts of due expiry keys, judged in order within one entry's run budget, as
    the sweep entry will judge them: what the proposer archives and names."""
    out = []
    for check_us, job_id in checks:
        if budget <= 0:
            break
        verdict = judge(ctx, job_id, now, budget)
        budget -= max(verdict.read, 1)
        out.append((check_us, job_id, verdict))
    return out


def sweep_expired(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Delete what each named expiry key's check lets go, of what the proposer named (it
    archived those first: nothing it did not name is deleted), and move each key to its
    next check. A key no longer in the index was handled by an earlier entry."""
    now, budget = cmd["now"], cmd["runs_max"]
    jobs = runs = 0
    for check_us, job_id, named_runs, named_job in cmd["checks"]:
        key = keys.expiry_key(check_us, job_id)
        if budget <= 0 or ctx.txn.get(key, None, ctx.tables.expiry) is None:
            continue
        verdict = judge(ctx, job_id, now, budget)
        budget -= max(verdict.read, 1)
        allowed = set(named_runs)
        for run_id in verdict.runs:
            if run_id in allowed:
                run = verdict.run_records[run_id]
                records.reopen_dead_head(ctx, run)
                records.delete_run(ctx, run)
                runs += 1
        ctx.txn.delete(key, b"", ctx.tables.expiry)
        if verdict.job and named_job and allowed.issuperset(verdict.runs):
            assert verdict.job_record is not None
            _delete_job(ctx, verdict.job_record)
            jobs += 1
        elif verdict.job or verdict.next_check_us is not None:
            records.note_check(ctx, now if verdict.job else verdict.next_check_us, job_id)
    return {"deleted_jobs": jobs, "deleted_runs": runs}
