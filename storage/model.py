"""States and the legal transitions between them, as data (h11 style): every
state change in storage/ goes through `run_transition` / `job_transition`, and
tests enumerate both the legal and the illegal pairs."""
from __future__ import annotations

from enum import Enum


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


class JobEvent(str, Enum):
    LAST_OCCURRENCE = "last_occurrence"
    CANCEL = "cancel"


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
}

JOB_TRANSITIONS: dict[tuple[JobState, JobEvent], JobState] = {
    (J.SCHEDULED, JobEvent.LAST_OCCURRENCE): J.COMPLETED,
    (J.SCHEDULED, JobEvent.CANCEL): J.CANCELLED,
    (J.PAUSED, JobEvent.CANCEL): J.CANCELLED,
    # A completed one-off job can still have its run queued (claimed ahead of
    # time, or waiting out a retry): cancelling it cancels that run.
    (J.COMPLETED, JobEvent.CANCEL): J.CANCELLED,
}

TERMINAL_RUN_STATES = frozenset({R.SUCCEEDED, R.DEAD_LETTER, R.SKIPPED, R.CANCELLED})
LEASABLE_RUN_STATES = frozenset({R.QUEUED, R.RETRY_WAIT})


class IllegalTransition(Exception):
    """A state change the transition table does not allow: a bug, never a user error."""


def run_transition(state: str, event: RunEvent) -> str:
    try:
        return RUN_TRANSITIONS[(RunState(state), event)].value
    except KeyError:
        raise IllegalTransition(f"run {state} --{event.value}-->") from None


def job_transition(state: str, event: JobEvent) -> str:
    try:
        return JOB_TRANSITIONS[(JobState(state), event)].value
    except KeyError:
        raise IllegalTransition(f"job {state} --{event.value}-->") from None
