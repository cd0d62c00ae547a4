"""The stored layouts of job and run records (storage/codec.Layouts): the keys, in
order, of the records apply builds. A record with other keys (an older entry's, a run
with a catch-up summary) is stored as a map, so nothing here limits what a record holds.

Append only: a layout's number and fields are in every store and snapshot written
since entry version 10 (ops.ARRAY_RECORDS_SINCE)."""
from __future__ import annotations

from schedulerd.storage.codec import Layouts

# jobs.create_jobs builds a job as SPEC_DEFAULTS's fields, then the request's own
# (job_id, schedule, schedule_spec, idempotency_key when given), then apply's.
_JOB_OPTIONS = ("queue", "payload_json", "max_attempts", "priority", "misfire_policy", "catchup_limit",
                "starting_deadline_us", "overlap_policy", "backoff", "timeout_us", "jitter_us", "history_limit",
                "target")
_JOB_APPLIED = ("state", "shard", "next_fire_us", "created_us", "updated_us", "raft_index")
# From entry version 11 the API resolves each job's retention and sends it last.
JOB_RETENTION = ("finished_ttl_us", "history_ttl_us", "keep_dead_letters")
JOBS = Layouts("Job", (
    (*_JOB_OPTIONS, "job_id", "schedule", "schedule_spec", *_JOB_APPLIED),
    (*_JOB_OPTIONS, "job_id", "schedule", "schedule_spec", "idempotency_key", *_JOB_APPLIED),
    (*_JOB_OPTIONS, "job_id", "schedule", "schedule_spec", *JOB_RETENTION, *_JOB_APPLIED),
    (*_JOB_OPTIONS, "job_id", "schedule", "schedule_spec", "idempotency_key", *JOB_RETENTION, *_JOB_APPLIED),
))

# claims._RUN_TEMPLATE's keys; then with the summary of the occurrences a catch-up
# left out (claims._summary).
_RUN = ("run_id", "job_id", "scheduled_us", "state", "attempt", "queue", "priority", "max_attempts", "backoff",
        "timeout_us", "available_us", "worker_id", "fence", "lease_until_us", "attempt_deadline_us", "created_us",
        "finished_us", "result_json", "error", "reason", "trigger", "starting_deadline_us")
RUNS = Layouts("Run", (
    _RUN,
    (*_RUN, "skipped_count", "skipped_until_us"),
))
