"""States and the legal transitions between them, as data (h11 style): every
state change in storage/ goes through `run_transition` / `job_transition`, and
tests enumerate both the legal and the illegal pairs."""
from __future__ import annotations

from enum import Enum
from typing import Any


class RunState(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    RETRY_WAIT = "retry_wait"
    DEAD_LETTER = "dead_letter"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class JobState(str, Enum):
    SCHEDULED = "scheduled"
    PAUSED = "paused"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


class RunEvent(str, Enum):
    LEASE = "lease"
    ACK = "ack"
    NACK_RETRY = "nack_retry"
    NACK_FINAL = "nack_final"
    EXPIRE_RETRY = "expire_retry"
    EXPIRE_FINAL = "expire_final"
    CANCEL = "cancel"
    MISSED_DEADLINE = "missed_deadline"
    REDRIVE = "redrive"


class JobEvent(str, Enum):
    LAST_OCCURRENCE = "last_occurrence"
    CANCEL = "cancel"
    PAUSE = "pause"
    RESUME = "resume"
    REARM = "rearm"


class Reason(str, Enum):
    """Why a run did not (or will not again) run: every such run says which."""

    MISFIRE_SKIP = "misfire_skip"
    CATCHUP_LIMIT = "catchup_limit"
    DEADLINE = "deadline"
    OVERLAP = "overlap"
    JOB_CANCELLED = "job_cancelled"
    MAX_ATTEMPTS = "max_attempts"
    TIMEOUT = "timeout"
    LEASE_EXPIRED = "lease_expired"
    PAUSED = "paused"  # came due before a pause and was not claimed (entries of version 9 on)
    RESCHEDULED = "rescheduled"  # came due before a PATCH of the schedule and was not claimed
    RUN_CANCELLED = "run_cancelled"  # this one run was cancelled (POST /v1/runs/{id}/cancel)
    CALENDAR = "calendar"  # fell on a day of the job's skip_calendar (entries of version 19 on)


# The reasons a `skipped` run carries (the others are a cancelled or dead-lettered run's).
SKIP_REASONS = (Reason.MISFIRE_SKIP, Reason.CATCHUP_LIMIT, Reason.DEADLINE, Reason.OVERLAP, Reason.PAUSED,
                Reason.RESCHEDULED, Reason.CALENDAR)


R, J = RunState, JobState

RUN_TRANSITIONS: dict[tuple[RunState, RunEvent], RunState] = {
    (R.QUEUED, RunEvent.LEASE): R.RUNNING,
    # A run waiting out its backoff is leased straight from retry_wait once
    # available_at has passed: a separate "wake up" entry per retry would double
    # the Raft traffic of every retry for no information.
    (R.RETRY_WAIT, RunEvent.LEASE): R.RUNNING,
    (R.RUNNING, RunEvent.ACK): R.SUCCEEDED,
    (R.RUNNING, RunEvent.NACK_RETRY): R.RETRY_WAIT,
    (R.RUNNING, RunEvent.NACK_FINAL): R.DEAD_LETTER,
    (R.RUNNING, RunEvent.EXPIRE_RETRY): R.RETRY_WAIT,
    (R.RUNNING, RunEvent.EXPIRE_FINAL): R.DEAD_LETTER,
    (R.QUEUED, RunEvent.CANCEL): R.CANCELLED,
    (R.RETRY_WAIT, RunEvent.CANCEL): R.CANCELLED,
    # A running run of a cancelled job may finish, but a failed attempt is not retried.
    (R.RUNNING, RunEvent.CANCEL): R.CANCELLED,
    # starting_deadline_s passed before the first attempt could start.
    (R.QUEUED, RunEvent.MISSED_DEADLINE): R.SKIPPED,
    # An operator re-drives a dead letter.
    (R.DEAD_LETTER, RunEvent.REDRIVE): R.QUEUED,
}

JOB_TRANSITIONS: dict[tuple[JobState, JobEvent], JobState] = {
    (J.SCHEDULED, JobEvent.LAST_OCCURRENCE): J.COMPLETED,
    (J.SCHEDULED, JobEvent.CANCEL): J.CANCELLED,
    (J.PAUSED, JobEvent.CANCEL): J.CANCELLED,
    # A completed one-off job can still have its run queued (claimed ahead of
    # time, or waiting out a retry): cancelling it cancels that run.
    (J.COMPLETED, JobEvent.CANCEL): J.CANCELLED,
    (J.SCHEDULED, JobEvent.PAUSE): J.PAUSED,
    (J.PAUSED, JobEvent.RESUME): J.SCHEDULED,
    # An update gives a completed job a schedule with a future occurrence again, or a
    # pause or update withdraws the occurrence it had claimed ahead of its time.
    (J.COMPLETED, JobEvent.REARM): J.SCHEDULED,
}

TERMINAL_RUN_STATES = frozenset({R.SUCCEEDED, R.SKIPPED, R.CANCELLED})
# The states apply tests on every job, as the plain strings records hold: naming an Enum
# member is a class attribute lookup each time, ~55 ns, and a job's three entries made ~15.
RUN_QUEUED, RUN_RUNNING, RUN_SUCCEEDED, RUN_DEAD_LETTER = R.QUEUED.value, R.RUNNING.value, R.SUCCEEDED.value, \
    R.DEAD_LETTER.value
JOB_SCHEDULED, JOB_COMPLETED = J.SCHEDULED.value, J.COMPLETED.value
# A job in one of these states makes no new occurrence: once its runs are done, it has finished.
FINISHED_JOB_STATES = frozenset({J.COMPLETED.value, J.CANCELLED.value})
# Waiting for a worker: a queued run now, a retry_wait run once its backoff is over.
PENDING_RUN_STATES = frozenset({R.QUEUED, R.RETRY_WAIT})
# Where a nack leaves a run (and a cancel after it): leases.nack knows its repeat by them.
NACKED_STATES = frozenset({R.RETRY_WAIT, R.DEAD_LETTER, R.CANCELLED})


class MisfirePolicy(str, Enum):
    FIRE_ALL = "fire_all"
    FIRE_ONCE = "fire_once"
    SKIP = "skip"


class OverlapPolicy(str, Enum):
    ALLOW = "allow"
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    BUFFER_ALL = "buffer_all"
    CANCEL_OTHER = "cancel_other"


class IllegalTransition(Exception):
    """A state change the transition table does not allow: a bug, never a user error."""


# The same tables keyed by plain state strings, as records hold them (apply looks one
# up per transition; converting to the Enum each time was ~5% of apply).
_RUN_NEXT = {(s.value, e): t.value for (s, e), t in RUN_TRANSITIONS.items()}
_JOB_NEXT = {(s.value, e): t.value for (s, e), t in JOB_TRANSITIONS.items()}


def _next(table: dict[tuple[str, Any], str], kind: str, state: str, event: RunEvent | JobEvent) -> str:
    after = table.get((state, event))  # a str Enum member hashes and compares as its value
    if after is None:
        raise IllegalTransition(f"{kind} {state} --{event.value}-->")
    return after


def run_transition(state: str, event: RunEvent) -> str:
    return _next(_RUN_NEXT, "run", state, event)


def job_transition(state: str, event: JobEvent) -> str:
    return _next(_JOB_NEXT, "job", state, event)
