"""Where a lease is granted, extended, ended and expired.

The fence of a lease is the Raft index of the entry that granted it: it is
the same on every replica and grows with every new lease of a run. Heartbeat,
ack and nack must present the fence and worker they were given; anything else
is a deterministic `stale_fence` result that changes nothing."""
from __future__ import annotations

from typing import Any, Iterable

from schedulerd.storage import jobs, ops, queries, queue_limits, records, retry
from schedulerd.storage.model import (PENDING_RUN_STATES, NACKED_STATES, RUN_RUNNING, RUN_SUCCEEDED, JobState, Reason,
                           RunEvent, RunState, run_transition)
from schedulerd.storage.records import Ctx, Record


# Every FAIR_EVERY-th entry's grants take the longest-waiting runs whatever their
# priority, so a flood of priority-9 work cannot starve priority 0 entirely.
FAIR_EVERY = 10
# Why a run is cancelled under its worker's feet (storage/run_cancel.py): its heartbeat says so.
_REVOKED = frozenset({Reason.RUN_CANCELLED.value, Reason.OVERLAP.value})


def lease_ready(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Grant each worker, in turn, up to its count of runs of its queues that are
    leasable now, taken from the ready index here in apply.

    The choice is the state machine's, the same on every replica: any node can
    propose for its pollers without knowing which runs other nodes' entries took,
    so no entry names runs that are gone by the time it applies. The grants are run
    records: the proposing node adds each job's payload from its own replica
    (`lease_queue`), so no replica reads the job record in apply.

    From version 21 no run of a queue is granted past its limits (storage/queue_limits.py):
    a run of a queue at its limit stays ready, for a later entry."""
    now, lease_until = cmd["now"], cmd["lease_until"]
    oldest_first = ctx.index % FAIR_EVERY == 0
    budget = queue_limits.Budget(ctx.txn, ctx.tables, cmd.get("limits") or {}, ctx.running_delta, now) \
        if ctx.version >= ops.QUEUE_LIMITS_SINCE else None
    grants = []
    skipped = 0
    for worker_id, queues, want in cmd["grants"]:
        tasks: list[Record] = []
        limited = budget is not None and budget.limits_any(queues)
        while len(tasks) < want:
            open_queues = budget.open(queues) if limited else queues
            found = queries.ready(ctx.txn, ctx.tables, open_queues, now, want - len(tasks), oldest_first) \
                if open_queues else []
            if not found:
                break
            # Each run found leaves the ready index, leased or skipped, or its queue reaches its
            # limit and leaves open_queues: the next read goes on.
            for queue, run_id in found:
                if limited and not budget.has_room(queue):
                    continue
                task = _grant(ctx, records.get_run(ctx, run_id), worker_id, now, lease_until)
                if task is None:
                    skipped += 1
                    continue
                tasks.append(task)
                if limited:
                    budget.took(queue)
        grants.append([worker_id, tasks])
    if budget is not None:
        budget.save()
    return {"grants": grants, "skipped": skipped, "now": now}


def lease_batch(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Grant each worker the runs named for it that are still leasable now (entries of
    builds that chose the runs on the proposing node; `lease_ready` replaced it)."""
    now, lease_until = cmd["now"], cmd["lease_until"]
    grants = []
    skipped = 0
    for worker_id, run_ids in cmd["grants"]:
        tasks: list[Record] = []
        # Lazily: a run named twice is leasable only the first time.
        leasable = (run for run in (records.get_run(ctx, run_id) for run_id in run_ids)
                    if run is not None and run["state"] in PENDING_RUN_STATES and run["available_us"] <= now
                    and not run.get("buffered"))
        skipped += _grant_each(ctx, leasable, worker_id, now, lease_until, tasks)
        grants.append([worker_id, tasks])
    return {"grants": grants, "skipped": skipped, "now": now}


def _grant_each(ctx: Ctx, runs: Iterable[Record], worker_id: str, now: int, lease_until: int,
                tasks: list[Record]) -> int:
    """Lease each leasable run to worker_id, adding it to tasks; returns how many were
    skipped instead because their starting deadline had passed."""
    skipped = 0
    for run in runs:
        task = _grant(ctx, run, worker_id, now, lease_until)
        if task is None:
            skipped += 1
        else:
            tasks.append(task)
    return skipped


def _grant(ctx: Ctx, run: Record, worker_id: str, now: int, lease_until: int) -> Record | None:
    """Lease a leasable run to worker_id; None when its starting deadline has passed
    (the run is skipped instead: it never started, and will not now)."""
    deadline = run["starting_deadline_us"] if "starting_deadline_us" in run else _job_deadline(ctx, run)
    if run["attempt"] == 0 and deadline is not None and run["scheduled_us"] + deadline < now \
            and not run.get("trigger"):
        records.update_run(ctx, run, dict(run, state=run_transition(run["state"], RunEvent.MISSED_DEADLINE),
                                          reason=Reason.DEADLINE.value, finished_us=now))
        return None
    attempt_deadline = now + run["timeout_us"] if run.get("timeout_us") else None
    after = dict(run, state=run_transition(run["state"], RunEvent.LEASE), attempt=run["attempt"] + 1,
                 worker_id=worker_id, fence=ctx.index, attempt_deadline_us=attempt_deadline,
                 lease_until_us=_capped(lease_until, attempt_deadline))
    records.update_run(ctx, run, after)
    return after


def _job_deadline(ctx: Ctx, run: Record) -> int | None:
    """The starting deadline of a run claimed by a build that did not copy it onto the run."""
    job = records.get_job(ctx, run["job_id"])
    return job.get("starting_deadline_us") if job else None


def _capped(lease_until: int, attempt_deadline: int | None) -> int:
    """timeout_s is a hard cap on one attempt: no heartbeat extends a lease past it."""
    return lease_until if attempt_deadline is None else min(lease_until, attempt_deadline)


def _check_lease(run: Record | None, run_id: str, worker_id: str, fence: int, now: int) -> dict[str, Any] | None:
    """None when the caller holds the live lease, else the rejection result."""
    if run is None:
        return {"run_id": run_id, "ok": False, "code": "not_found", "message": f"no run {run_id!r}"}
    if run["state"] == RunState.CANCELLED and run["fence"] == fence and run["reason"] in _REVOKED:
        return {"run_id": run_id, "ok": False, "code": "stale_fence",
                "message": f"run {run_id!r} was cancelled ({run['reason']}): its lease is revoked; stop its work"}
    if run["state"] != RUN_RUNNING or run["fence"] != fence or run["worker_id"] != worker_id:
        return {"run_id": run_id, "ok": False, "code": "stale_fence",
                "message": f"run {run_id!r} is {run['state']} with fence {run['fence']}; "
                           f"worker {worker_id!r} with fence {fence} does not hold its lease"}
    if run["lease_until_us"] <= now:
        return {"run_id": run_id, "ok": False, "code": "stale_fence",
                "message": f"the lease on run {run_id!r} (fence {fence}) has expired"}
    return None


def _worker_of(item: list[Any], arity: int, cmd: dict[str, Any]) -> str:
    """Items of a coalesced entry name their worker; a single worker's entry names it once."""
    return item[arity] if len(item) > arity else cmd["worker_id"]


def heartbeat(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Items: [run_id, fence] or [run_id, fence, worker_id]."""
    now, lease_until = cmd["now"], cmd["lease_until"]
    results = []
    for item in cmd["leases"]:
        run_id, fence, worker_id = item[0], item[1], _worker_of(item, 2, cmd)
        run = records.get_run(ctx, run_id)
        rejection = _check_lease(run, run_id, worker_id, fence, now)
        if rejection:
            results.append(rejection)
            continue
        extended = max(_capped(lease_until, run.get("attempt_deadline_us")), run["lease_until_us"])
        records.update_run(ctx, run, dict(run, lease_until_us=extended))
        results.append({"run_id": run_id, "ok": True, "lease_until_us": extended})
    return {"results": results}


def ack(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Items: [run_id, fence, result_json] or [run_id, fence, result_json, worker_id].

    An ack repeated by the lease that already acked the run is answered ok and changes
    nothing (`repeated`): the worker retries an ack whose answer it never got (a timeout,
    a node that died after the commit), and that ack did land."""
    now = cmd["now"]
    results = []
    for item in cmd["acks"]:
        run_id, fence, result_json, worker_id = item[0], item[1], item[2], _worker_of(item, 3, cmd)
        run = records.get_run(ctx, run_id)
        if (run is not None and run["state"] == RUN_SUCCEEDED and run["fence"] == fence
                and run["worker_id"] == worker_id):
            results.append({"run_id": run_id, "ok": True, "run": run, "repeated": True})
            continue
        rejection = _check_lease(run, run_id, worker_id, fence, now)
        if rejection:
            results.append(rejection)
            continue
        after = dict(run, state=run_transition(run["state"], RunEvent.ACK), finished_us=now,
                     lease_until_us=None, result_json=result_json)
        records.update_run(ctx, run, after)
        results.append({"run_id": run_id, "ok": True, "run": after})
    return {"results": results}


def nack(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """A nack repeated by the lease that already nacked the run is answered ok and changes
    nothing (`repeated`), as a repeated ack is. That nack landed when the run left `running`
    with this fence, this worker and this very error text; a lease that expired instead
    left its own error, so a nack after an expiry is still `stale_fence`, and so is one
    after the run was cancelled under its worker (run_cancel), whatever its error text."""
    now, run_id = cmd["now"], cmd["run_id"]
    run = records.get_run(ctx, run_id)
    if (run is not None and run["state"] in NACKED_STATES and run["fence"] == cmd["fence"]
            and run["worker_id"] == cmd["worker_id"] and run.get("error") == cmd["error"]
            and run["reason"] not in _REVOKED):
        return {"run_id": run_id, "ok": True, "run": run, "repeated": True}
    rejection = _check_lease(run, run_id, cmd["worker_id"], cmd["fence"], now)
    if rejection:
        return rejection
    after = _fail_attempt(ctx, run, now, cmd["error"], RunEvent.NACK_RETRY, RunEvent.NACK_FINAL, None)
    return {"run_id": run_id, "ok": True, "run": after}


def expire_leases(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """Requeue (or dead-letter) runs whose lease ran out, if it is still that lease."""
    now = cmd["now"]
    expired = dead = 0
    for run_id, fence in cmd["runs"]:
        run = records.get_run(ctx, run_id)
        if (run is None or run["state"] != RunState.RUNNING or run["fence"] != fence
                or run["lease_until_us"] > now):
            continue
        timed_out = run.get("attempt_deadline_us") is not None and now >= run["attempt_deadline_us"]
        error = (f"attempt exceeded timeout_s (worker {run['worker_id']!r}, fence {fence})" if timed_out
                 else f"lease expired (worker {run['worker_id']!r}, fence {fence})")
        after = _fail_attempt(ctx, run, now, error, RunEvent.EXPIRE_RETRY, RunEvent.EXPIRE_FINAL,
                      Reason.TIMEOUT if timed_out else Reason.LEASE_EXPIRED)
        expired += 1
        dead += after["state"] == RunState.DEAD_LETTER
    return {"expired": expired, "dead_letter": dead}


def _fail_attempt(ctx: Ctx, run: Record, now: int, error: str, retry_event: RunEvent, final_event: RunEvent,
          reason: Reason | None) -> Record:
    """A failed attempt: retry after backoff, or dead-letter after the last attempt.
    The job was cancelled meanwhile: no retry, the run is cancelled."""
    job = records.get_job(ctx, run["job_id"])
    if job is not None and job["state"] == JobState.CANCELLED:
        after = dict(run, state=run_transition(run["state"], RunEvent.CANCEL), lease_until_us=None,
                     finished_us=now, error=error, reason=Reason.JOB_CANCELLED.value)
    elif run["attempt"] < run["max_attempts"]:
        delay = retry.backoff_us(run.get("backoff"), run["job_id"], run["scheduled_us"], run["attempt"])
        after = dict(run, state=run_transition(run["state"], retry_event), available_us=now + delay,
                     lease_until_us=None, error=error, reason=reason.value if reason else None)
    else:
        after = dict(run, state=run_transition(run["state"], final_event), lease_until_us=None,
                     finished_us=now, error=error, reason=Reason.MAX_ATTEMPTS.value)
    records.update_run(ctx, run, after)
    if after["state"] == RunState.DEAD_LETTER and job is not None and job.get("pause_on_failure"):
        jobs.pause(ctx, job["job_id"], now, {"run_id": run["run_id"], "at_us": now})
    return after


def redrive(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """An operator re-drives a dead letter: queued now, with a fresh round of attempts."""
    now, run_id = cmd["now"], cmd["run_id"]
    run = records.get_run(ctx, run_id)
    if run is None:
        return {"ok": False, "code": "not_found", "message": f"no run {run_id!r}"}
    if run["state"] != RunState.DEAD_LETTER:
        return {"ok": False, "code": "conflict", "message": f"run {run_id!r} is {run['state']}, not dead_letter"}
    job = records.get_job(ctx, run["job_id"])
    if ctx.version >= ops.REDRIVE_CANCELLED_SINCE and job is not None and job["state"] == JobState.CANCELLED:
        return {"ok": False, "code": "conflict",
                "message": f"job {run['job_id']!r} is cancelled: none of its runs starts after its DELETE"}
    records.reopen_dead_head(ctx, run)
    rounds = job["max_attempts"] if job else run["max_attempts"]
    after = dict(run, state=run_transition(run["state"], RunEvent.REDRIVE), available_us=now,
                 max_attempts=run["attempt"] + rounds, finished_us=None, reason=None)
    records.update_run(ctx, run, after)
    return {"ok": True, "run": after}
