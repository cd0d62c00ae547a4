"""Read-side queries over one group's LMDB. Every scan is a bounded range read
over an index, never a walk of a whole table."""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterable

import lmdb
import msgspec

from schedulerd.storage import claims, keys, records
from schedulerd.storage.codec import unpack
from schedulerd.storage.layouts import JOBS, RUNS
from schedulerd.storage.model import JOB_SCHEDULED, JobState, RunState
from schedulerd.storage.records import Reader, Record
from schedulerd.storage.tables import DB_NAMES, Tables



class TaskPart(msgspec.Struct, frozen=True):
    """What a leased run's worker gets from its job's record (views.task)."""

    payload_json: str
    target: Any = None
    # The create's W3C trace context (entry version 20 on; schedulerd/tracing.py). No layout
    # holds them: a job that has them is stored as a map.
    traceparent: str | None = None
    tracestate: str | None = None


_TASK_PART = JOBS.partial_decoder(TaskPart)


def task_parts(txn: lmdb.Transaction, t: Tables, job_ids: Iterable[str]) -> dict[str, TaskPart | None]:
    """Each job's payload and target, None for a job no longer stored."""
    out: dict[str, TaskPart | None] = {}
    for job_id in job_ids:
        if job_id not in out:
            raw = txn.get(keys.job_key(job_id), db=t.jobs)
            out[job_id] = _TASK_PART(raw) if raw else None
    return out



def as_seen(job: Record, now_us: int) -> Record:
    """The job as a caller sees it at now_us. A one-off whose occurrence was claimed ahead
    of its time is completed in the store (nothing is left to claim), but it has not fired:
    until its time it reads as scheduled, with that time next, just as a pause or an
    update treats it (claims.withdraw_ahead)."""
    if claims.one_off_ahead(job, now_us):
        return dict(job, state=JOB_SCHEDULED, next_fire_us=job["schedule"]["at_us"])
    return job


def last_runs(reader: Reader, job_id: str, now_us: int) -> tuple[Record | None, int | None]:
    """The job's run of its latest occurrence due by now_us, and when its latest success
    finished (None when none is kept): Kubernetes CronJob's lastScheduleTime and
    lastSuccessfulTime, read from the runs the job's history keeps."""
    prefix = keys.occurrence_prefix(job_id)
    last: Record | None = None
    with reader.txn.cursor(db=reader.tables.occurrences) as cur:
        if not cur.set_range(keys.occurrence_key(job_id, now_us + 1)):
            cur.last()
        elif not cur.prev():
            return None, None
        for key, value in cur.iterprev():
            if not key.startswith(prefix):
                break
            run = records.get_run(reader, value.decode())
            if run is None:
                continue
            last = last or run
            if run["state"] == RunState.SUCCEEDED.value:
                return last, run["finished_us"]
    return last, None


def list_jobs(txn: lmdb.Transaction, t: Tables, *, state: str | None, queue: str | None, limit: int,
              after: str | None, scan_max: int, now_us: int, prefix: str = "", bare_only: bool = False,
              labels: Callable[[dict[str, str] | None], bool] | None = None) -> tuple[list[Record], str | None]:
    """Jobs as seen at now_us, in id order after the cursor id, filtered; at most scan_max
    records are read, so a rare filter returns a short page with a cursor instead of
    scanning everything. Only ids starting with `prefix`; with bare_only, only ids without a
    '/'; with `labels`, only jobs whose labels it accepts (a label selector)."""
    out: list[Record] = []
    scanned = 0
    start = max(keys.job_key(after) + b"\x00" if after else b"", keys.job_key(prefix))
    with txn.cursor(db=t.jobs) as cur:
        found = cur.set_range(start) if start else cur.first()
        if not found:
            return out, None
        for key, raw in cur:
            if not key.startswith(keys.job_key(prefix)):
                break
            scanned += 1
            if bare_only and b"/" in key:
                if scanned >= scan_max:
                    return out, key.decode()
                continue
            job = as_seen(JOBS.unpack(raw), now_us)
            if (state is None or job["state"] == state) and (queue is None or job["queue"] == queue) \
                    and (labels is None or labels(job.get("labels"))):
                out.append(job)
                if len(out) == limit:
                    return out, key.decode()
            if scanned >= scan_max:
                return out, key.decode()
    return out, None


def list_runs(txn: lmdb.Transaction, t: Tables, *, state: str, queue: str | None, limit: int, after: str | None,
              scan_max: int, holds: Callable[[str], bool]) -> tuple[list[Record], str | None]:
    """Runs in `state` across jobs, in run id order after the cursor id, of the jobs `holds`
    accepts (a namespace's), optionally of one queue; at most scan_max records are read, as
    list_jobs does, so a rare state returns a short page with a cursor."""
    out: list[Record] = []
    scanned = 0
    with txn.cursor(db=t.runs) as cur:
        found = cur.set_range(keys.run_key(after) + b"\x00") if after else cur.first()
        if not found:
            return out, None
        for key, raw in cur:
            scanned += 1
            run = RUNS.unpack(raw)
            if run["state"] == state and (queue is None or run["queue"] == queue) and holds(run["job_id"]):
                out.append(run)
                if len(out) == limit:
                    return out, key.decode()
            if scanned >= scan_max:
                return out, key.decode()
    return out, None


def job_runs(txn: lmdb.Transaction, t: Tables, job_id: str, *, limit: int,
             after_us: int | None) -> tuple[list[Record], int | None]:
    """Runs of a job, oldest scheduled time first, after the cursor time."""
    prefix = keys.occurrence_prefix(job_id)
    start = keys.occurrence_key(job_id, after_us + 1) if after_us is not None else prefix
    out: list[Record] = []
    with txn.cursor(db=t.occurrences) as cur:
        if not cur.set_range(start):
            return out, None
        for key, run_id in cur:
            if not key.startswith(prefix):
                break
            run = records.get_run(Reader(txn, t), run_id.decode())
            if run is not None:
                out.append(run)
            if len(out) == limit:
                return out, keys.read_u64(key[len(prefix):])
    return out, None


def due(txn: lmdb.Transaction, t: Tables, shards: Iterable[int], until_us: int,
        limit: int) -> list[tuple[str, int]]:
    """(job_id, fire_us) due at or before until_us, earliest first within each shard."""
    out: list[tuple[str, int]] = []
    with txn.cursor(db=t.due) as cur:
        for shard in shards:
            if not cur.set_range(keys.due_shard_prefix(shard)):
                break
            for key in cur.iternext(keys=True, values=False):
                key_shard, fire_us, job_id = keys.split_due_key(key)
                if key_shard != shard or fire_us > until_us:
                    break
                out.append((job_id, fire_us))
                if len(out) >= limit:
                    return out
    return out


def ready(txn: lmdb.Transaction, t: Tables, queues: Iterable[str], now_us: int, limit: int,
          oldest_first: bool = False) -> list[tuple[str, str]]:
    """(queue, run_id) leasable now across queues: highest priority first, or with
    oldest_first the longest-waiting runs whatever their priority."""
    found: list[tuple[int, str, str]] = []
    with txn.cursor(db=t.ready) as cur:
        for priority in range(keys.PRIORITY_MAX, -1, -1):
            for queue in queues:
                # By priority, a band only needs to fill what the bands before it left;
                # oldest first, any band may hold the oldest `limit`.
                found.extend(_ready_band(cur, queue, priority, now_us, limit if oldest_first else limit - len(found)))
                if not oldest_first and len(found) >= limit:
                    return [(q, r) for _, q, r in found[:limit]]
    if oldest_first:
        found.sort()
    return [(q, r) for _, q, r in found[:limit]]


def _ready_band(cur: lmdb.Cursor, queue: str, priority: int, now_us: int, limit: int) -> list[tuple[int, str, str]]:
    prefix = keys.ready_prefix(queue, priority)
    out: list[tuple[int, str, str]] = []
    if not cur.set_range(prefix):
        return out
    for key in cur.iternext(keys=True, values=False):
        if len(out) >= limit or not key.startswith(prefix):
            break
        available_us, run_id = keys.split_ready_key(key)
        if available_us > now_us:
            break
        out.append((available_us, queue, run_id))
    return out


def next_ready_us(txn: lmdb.Transaction, t: Tables, queues: Iterable[str]) -> int | None:
    """The earliest available_at among ready runs of these queues (for a long-poll's wake-up)."""
    best: int | None = None
    with txn.cursor(db=t.ready) as cur:
        for priority in range(keys.PRIORITY_MAX, -1, -1):
            for queue in queues:
                prefix = keys.ready_prefix(queue, priority)
                if cur.set_range(prefix) and cur.key().startswith(prefix):
                    available_us, _ = keys.split_ready_key(cur.key())
                    best = available_us if best is None else min(best, available_us)
    return best


def expiry_due(txn: lmdb.Transaction, t: Tables, now_us: int, limit: int) -> list[tuple[int, str]]:
    """(check_us, job_id) of the expiry keys due by now_us, earliest first (storage/retention.py)."""
    out: list[tuple[int, str]] = []
    with txn.cursor(db=t.expiry) as cur:
        if not cur.first():
            return out
        for key in cur.iternext(keys=True, values=False):
            check_us, job_id = keys.split_expiry_key(key)
            if check_us > now_us or len(out) >= limit:
                break
            out.append((check_us, job_id))
    return out


def expired_leases(txn: lmdb.Transaction, t: Tables, now_us: int, limit: int) -> list[tuple[str, int]]:
    """(run_id, fence) of leases whose lease_until has passed."""
    out: list[tuple[str, int]] = []
    with txn.cursor(db=t.leases) as cur:
        if not cur.first():
            return out
        for key in cur.iternext(keys=True, values=False):
            lease_until, run_id = keys.split_lease_key(key)
            if lease_until > now_us:
                break
            run = records.get_run(Reader(txn, t), run_id)
            if run is not None:
                out.append((run_id, run["fence"]))
            if len(out) >= limit:
                break
    return out


def job_state_counts(txn: lmdb.Transaction, t: Tables) -> dict[str, int]:
    raw = txn.get(keys.JOB_STATE_COUNTS, db=t.meta)
    counts = unpack(raw) if raw else {}
    return {state.value: counts.get(state.value, 0) for state in JobState}


def queue_stats(txn: lmdb.Transaction, t: Tables, now_us: int, scan_max: int,
                into: dict[str, list[int]]) -> bool:
    """Add per queue [ready now, queued for later, oldest available_us of the ready ones]
    into `into` (several groups add to one dict); True when scan_max keys cut the scan short."""
    scanned = 0
    with txn.cursor(db=t.ready) as cur:
        for key in cur.iternext(keys=True, values=False):
            scanned += 1
            if scanned > scan_max:
                return True
            queue, available_us = keys.split_ready_queue(key)
            entry = into.setdefault(queue, [0, 0, now_us])
            if available_us <= now_us:
                entry[0] += 1
                entry[2] = min(entry[2], available_us)
            else:
                entry[1] += 1
    return False


def running_by_queue(txn: lmdb.Transaction, t: Tables, scan_max: int, into: dict[str, int]) -> bool:
    """Add the running runs of each queue into `into`; True when scan_max cut the scan short."""
    reader = Reader(txn, t)
    with txn.cursor(db=t.leases) as cur:
        for scanned, key in enumerate(cur.iternext(keys=True, values=False), 1):
            if scanned > scan_max:
                return True
            run = records.get_run(reader, keys.split_lease_key(key)[1])
            if run is not None:
                into[run["queue"]] = into.get(run["queue"], 0) + 1
    return False


def counts(txn: lmdb.Transaction, t: Tables) -> dict[str, Any]:
    return {name: txn.stat(getattr(t, name))["entries"] for name in ("jobs", "due", "runs", "ready", "leases")}


def dead_letters(txn: lmdb.Transaction, t: Tables, *, queue: str | None, limit: int, after: tuple[int, str] | None,
                 scan_max: int) -> tuple[list[Record], tuple[int, str] | None]:
    """Dead-lettered runs, oldest first, after the cursor (finished_us, run_id)."""
    out: list[Record] = []
    scanned = 0
    with txn.cursor(db=t.dead_letters) as cur:
        found = cur.set_range(keys.dead_letter_key(*after) + b"\x00") if after else cur.first()
        if not found:
            return out, None
        for key in cur.iternext(keys=True, values=False):
            scanned += 1
            position = keys.split_dead_letter_key(key)
            run = records.get_run(Reader(txn, t), position[1])
            if run is not None and (queue is None or run["queue"] == queue):
                out.append(run)
                if len(out) == limit:
                    return out, position
            if scanned >= scan_max:
                return out, position
    return out, None


def state_digest(txn: lmdb.Transaction, t: Tables) -> str:
    """sha256 over every table, in key order: equal on replicas that applied the same entries."""
    h = hashlib.sha256()
    for name in DB_NAMES:
        with txn.cursor(db=getattr(t, name)) as cur:
            for key, value in cur:
                h.update(name.encode() + len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)
    return h.hexdigest()


def audit_records(txn: lmdb.Transaction, t: Tables, *, limit: int, before: bytes | None) -> list[tuple[bytes, Record]]:
    """Newest first: (key, record) of up to `limit` audit records with keys below `before`."""
    out: list[tuple[bytes, Record]] = []
    with txn.cursor(db=t.audit) as cur:
        found = cur.set_range(before) if before else cur.last()
        if before:
            found = cur.prev() if found else cur.last()
        while found and len(out) < limit:
            out.append((bytes(cur.key()), unpack(cur.value())))
            found = cur.prev()
    return out
