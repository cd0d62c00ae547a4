"""Raft entry encoding: msgpack `[op, version, payload]` (storage/codec.py).

Op codes are append-only: a code keeps its meaning forever because old log
entries and snapshots still carry it. Retire a code by leaving it here unused;
never renumber (Nomad's fsm.go rule)."""
from __future__ import annotations

from enum import IntEnum
from typing import Any

from schedulerd.storage import codec

# The version this build writes, and those it reads. A version is raised when the rules
# an entry is applied by change: an entry keeps the rules of the version it was written
# at (a replica replaying it after an upgrade ends where the others did), and an older
# build stops on a newer entry (CorruptEntry) instead of letting its replica diverge.
VERSION = 21
READABLE_VERSIONS = frozenset({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21})
# The oldest version this build writes. A node writes the newest version every voter
# reads (raft/entry_versions.py), and this one while it does not know what they read.
# Builds from before this gate do not say what they read: one that reads 6 upgrades
# node by node, an older one all at once (docs/operations.md). A build
# that raises VERSION keeps writing each version from here up, in the payloads that
# version's rules expect; raising the floor drops the older writers and is said in the
# release notes ("upgrade from release X or later").
VERSION_FLOOR = 6
# Since 2: a pause or an update withdraws the runs claimed ahead of their
# time (claims.withdraw_ahead); a claim ahead of its time that the overlap rule would
# skip is deferred.
AHEAD_RULES_SINCE = 2
# Since 3: a create entry may carry claim_ahead_us and grace_us, and then
# claims the first occurrence of each job it creates that is due within them
# (claims.claim_created).
CLAIM_AT_CREATE_SINCE = 3
# Since 4: a one-off job's run counts are not stored unless it is triggered;
# they are counted from its runs when a rule asks (records.job_stats, claims._keeps_stats).
STATS_KEPT_SINCE = 4
# Since 5: a create entry's jobs carry only the fields their request gave;
# apply fills in the others from jobs.SPEC_DEFAULTS.
SPEC_DEFAULTS_SINCE = 5
# Since 6: an update's backoff may carry only some of its parts; apply
# completes them from the job's backoff as stored, and refuses a result whose max_ms is
# below its base_ms (jobs.update_job).
BACKOFF_PARTS_SINCE = 6
# Since 7: a cancel of a completed one-off whose run is still running
# cancels the job (before, a conflict), so that run is not retried if its attempt fails
# (jobs.cancel_job).
CANCEL_RUNNING_SINCE = 7
# Since 8: a re-drive of a dead letter whose job was cancelled is refused
# (leases.redrive); before, it ran after the job's DELETE. And history pruning starts
# after the dead letters at the head of a job's runs (records.prune_history).
REDRIVE_CANCELLED_SINCE = PRUNE_PAST_DEAD_SINCE = 8
# Since 9: every occurrence due before a command has a record.
# - A catch-up whose scan window holds too many occurrences narrows it (catchup.missed,
#   exact); before, the scan stopped part-way and fired the wrong "latest" occurrence.
# - A pause of a repeating job, or a PATCH of its schedule, records the occurrences
#   that came due before it and were not claimed as skipped (`paused`, `rescheduled`;
#   claims.skip_overdue); before, they went without a record.
# - A resumed one-off keeps its own time as its next fire time, so a passed one is a
#   missed occurrence (misfire policy, starting deadline) with its own scheduled time
#   and idempotency key; before, it fired with the resume's time.
OVERDUE_RECORDED_SINCE = 9
# Since 10: apply stores job and run records of the usual keys as arrays
# (storage/layouts.py), in ~40% of the bytes their maps took. No rule changes; the gate keeps
# every replica writing the same bytes for an entry, and keeps array records out of
# any store an older build reads (snapshots included) until every voter reads them.
ARRAY_RECORDS_SINCE = 10
# Since 11: retention (storage/retention.py).
# - A job that is completed or cancelled can be purged with its runs (PURGE_JOB) and a dead
#   letter discarded (DISCARD_RUN), so a job id can be created again.
# - A job carries finished_ttl_us, history_ttl_us and keep_dead_letters; a job entering a
#   finished state, and a repeating job at its creation, get a key in the expiry index,
#   and SWEEP_EXPIRED deletes what their TTLs let go.
# - A cancel withdraws the runs claimed ahead of their time, as a pause does, instead of
#   recording them cancelled (claims.withdraw_ahead).
PURGE_SINCE = RETENTION_SINCE = CANCEL_WITHDRAWS_SINCE = 11
# Since 12: a jitter at or above the gap to the next occurrence spreads each start over
# the gap (claims.start_offset_us); before, most offsets were clamped to its last microsecond.
JITTER_WITHIN_GAP_SINCE = 12
# Since 13: a cron or every schedule may carry bounds, start_us and end_us (cron.next_after):
# no occurrence outside them, an interval counts from its start, and past the end the job
# completes. An older build would ignore them, so the API sends them only from here on.
BOUNDS_SINCE = 13
# Since 14: a job may carry max_runs. Each run made for one of its occurrences (not a
# trigger, not a skipped one) counts in runs_made, a run withdrawn uncounts; once it
# reaches max_runs the job completes, and a PATCH of max_runs completes or re-arms it
# (claims.limit_reached).
MAX_RUNS_SINCE = 14
# Since 15: a PATCH may change a job's labels and description (a create stored them before
# too, as it stores every field of its spec; an older build's update drops them).
LABELS_SINCE = 15
# Since 16: JOBS_ACTION pauses, resumes or cancels many jobs in one entry (a bulk action
# by label selector; jobs.act_on_jobs).
JOBS_ACTION_SINCE = 16
# Since 17 (storage/overlap.py, storage/run_cancel.py):
# - CANCEL_RUN cancels one run; a running one has its lease revoked.
# - Overlap policies buffer_all and cancel_other; a buffer_one or buffer_all occurrence that
#   comes due while a run of its job is running is held (`buffered`) until no run of the
#   job is open. Before, buffer_one's waiting run could be leased beside the running one.
# - A job may carry pause_on_failure: a run of it dead-lettered pauses it.
RUN_CANCEL_SINCE = OVERLAP_HOLD_SINCE = PAUSE_ON_FAILURE_SINCE = 17
# Since 18: BACKFILL_JOB makes a run for each named occurrence of a job's schedule that has
# none yet (storage/backfill.py).
BACKFILL_SINCE = 18
# Since 19 (storage/calendars.py): a job may carry skip_calendar, and a claim entry carries the
# calendars its jobs name (`calendars`); an occurrence whose local date a carried calendar
# lists is recorded skipped (`calendar`), on time and in a catch-up. A create entry does not
# claim the first occurrence of a job naming a calendar: the scan's claim entry does.
CALENDAR_SINCE = 19
# Since 20: a create entry's job may carry traceparent and tracestate (W3C Trace Context, the
# create's headers; schedulerd/tracing.py), stored with it and delivered in each of its tasks.
# Apply's rules do not change (a create stores the fields its job gives); the gate keeps them
# out of the stores of a build that would not deliver them, so every replica's tasks agree.
# Before every voter reads 20, the API creates the job without them rather than refusing it.
TRACE_SINCE = 20
# Since 21 (storage/queue_limits.py): a group counts its running runs per queue, from its first
# entry of this version on; a LEASE_READY entry may carry queue limits (`limits`: the group's
# shares of max_running and max_starts_per_s, with their revision), and apply grants no run of a
# queue past the newest limits the group has seen. An older build would grant past them.
QUEUE_LIMITS_SINCE = 21


class Op(IntEnum):
    CREATE_JOBS = 1
    CANCEL_JOB = 2
    CLAIM_BATCH = 3
    LEASE_BATCH = 4
    HEARTBEAT = 5
    ACK = 6
    NACK = 7
    EXPIRE_LEASES = 8
    PAUSE_JOB = 9
    RESUME_JOB = 10
    UPDATE_JOB = 11
    TRIGGER_JOB = 12
    REDRIVE_RUN = 13
    LEASE_READY = 14
    PURGE_JOB = 15
    DISCARD_RUN = 16
    SWEEP_EXPIRED = 17
    JOBS_ACTION = 18
    CANCEL_RUN = 19
    BACKFILL_JOB = 20


# What each command does, in the words of an error a user reads ("the create was not saved").
WHAT: dict[Op, str] = {
    Op.CREATE_JOBS: "the create", Op.CANCEL_JOB: "the cancel", Op.CLAIM_BATCH: "claiming due runs",
    Op.LEASE_BATCH: "handing out tasks", Op.HEARTBEAT: "the heartbeat", Op.ACK: "the ack", Op.NACK: "the nack",
    Op.EXPIRE_LEASES: "expiring leases", Op.PAUSE_JOB: "the pause", Op.RESUME_JOB: "the resume",
    Op.UPDATE_JOB: "the update", Op.TRIGGER_JOB: "the trigger", Op.REDRIVE_RUN: "the re-drive",
    Op.LEASE_READY: "handing out tasks", Op.PURGE_JOB: "the purge", Op.DISCARD_RUN: "the discard",
    Op.SWEEP_EXPIRED: "the retention sweep", Op.JOBS_ACTION: "the bulk action",
    Op.CANCEL_RUN: "the run's cancel", Op.BACKFILL_JOB: "the backfill",
}


class CorruptEntry(Exception):
    """An entry this code cannot read: the node must stop, not guess."""


def encode(op: Op, payload: dict[str, Any], version: int = VERSION) -> bytes:
    return codec.pack([int(op), version, payload])


def header(blob: bytes) -> tuple[int, int] | None:
    """An entry's (op code, version), read from its first bytes without decoding it: a
    msgpack array of three whose first two items are positive fixints. None if it is not one."""
    if len(blob) > 2 and blob[0] == 0x93 and blob[1] < 0x80 and blob[2] < 0x80:
        return blob[1], blob[2]
    return None


def decode(blob: bytes) -> tuple[Op, int, dict[str, Any]]:
    try:
        op, version, payload = codec.unpack(blob)
    except Exception as exc:
        raise CorruptEntry(f"undecodable entry: {exc}") from exc
    if version not in READABLE_VERSIONS:
        raise CorruptEntry(f"entry version {version}, this build reads {sorted(READABLE_VERSIONS)}")
    try:
        return Op(op), version, payload
    except ValueError:
        raise CorruptEntry(f"unknown op code {op}: is this node older than the cluster?") from None
