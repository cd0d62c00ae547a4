"""The JSON Schemas of the OpenAPI document: what each request may hold, as the
handlers check it, and what each answer holds, nulls included.

A schema says what the server does, exactly where JSON Schema can say it
(patterns, lengths, ranges, enums) and more loosely where it cannot (whether a
cron expression ever fires, a duration's total): the server never refuses a
request outside such a field's stated bounds for a reason the schema could have
stated."""
from __future__ import annotations

import re
from typing import Any

from schedulerd import jobspec, namespaces, targets
from schedulerd.api import occurrences
from schedulerd.limits import Limits
from schedulerd.node import RUN_ID_RE
from schedulerd.storage.model import JobState, MisfirePolicy, OverlapPolicy, RunState
from schedulerd.storage.occurrences import Cause, Verdict

Schema = dict[str, Any]


def pattern(regex: re.Pattern[str]) -> str:
    """A Python regex the server fullmatches, as an anchored ECMA-262 pattern."""
    body = regex.pattern.removeprefix("^").removesuffix(r"\Z")
    return f"^{body}$"


def nullable(schema: Schema) -> Schema:
    kind = schema.get("type")
    if kind is None:
        return {"anyOf": [schema, {"type": "null"}]}
    kinds = kind if isinstance(kind, list) else [kind]
    return {**schema, "type": [*kinds, "null"]}


def _any_case(word: str) -> str:
    """A pattern matching word in any letter case (ECMA-262 has no inline (?i))."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
TIME: Schema = {"type": "string", "format": "date-time", "description": "ISO 8601 with Z or an offset"}
JOB_ID: Schema = {"type": "string", "pattern": pattern(jobspec.ID_RE), "maxLength": 128}
QUEUE: Schema = {"type": "string", "pattern": pattern(jobspec.QUEUE_RE), "maxLength": 64}
RUN_ID: Schema = {"type": "string", "pattern": pattern(RUN_ID_RE)}
NAMESPACE: Schema = {"type": "string", "pattern": pattern(namespaces.NAME_RE), "maxLength": 64,
                     "default": namespaces.DEFAULT}
WORKER_ID: Schema = {"type": "string", "minLength": 1, "maxLength": 128}
FENCE: Schema = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
IDEMPOTENCY_KEY: Schema = {"type": "string", "minLength": 1, "maxLength": jobspec.IDEMPOTENCY_KEY_CHARS_MAX}
DURATION: Schema = {"type": "string", "pattern": "^([0-9]{1,12}(ms|s|m|h|d))+$",
                    "examples": ["250ms", "90s", "1h30m"],
                    "description": "units ms s m h d; in total from 1s to 366d"}
TIMEZONE: Schema = {"type": "string", "examples": ["Europe/Berlin", "UTC"], "description": "An IANA zone name"}
CALENDAR_NAME: Schema = {"type": "string", "pattern": pattern(jobspec.CALENDAR_NAME_RE), "maxLength": 64}
DAY: Schema = {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$", "examples": ["2026-12-25"]}
DAY_RANGE: Schema = {"type": "object", "required": ["from", "to"], "additionalProperties": False,
                     "properties": {"from": DAY, "to": DAY}, "description": "Both days included."}
CALENDAR_PUT: Schema = {
    "type": "object", "required": ["dates"], "additionalProperties": False,
    "properties": {"timezone": {**TIMEZONE, "default": "UTC", "description": "The zone the days are in"},
                   "dates": {"type": "array", "items": {"anyOf": [DAY, DAY_RANGE]},
                             "description": "Days and ranges; stored merged into sorted disjoint ranges"}}}
CALENDAR: Schema = {"type": "object", "required": ["name", "timezone", "dates"], "properties": {
    "name": CALENDAR_NAME, "timezone": TIMEZONE, "dates": {"type": "array", "items": DAY_RANGE},
    "updated_at": {"type": "string", "format": "date-time"},
    "used_by": {"type": "array", "items": {"type": "string"},
                "description": "Some jobs that name it (GET of one calendar; of the namespaces the caller may use)"}}}

QUEUE_STATS: dict[str, Schema] = {
    "queue": QUEUE, "namespace": NAMESPACE, "ready": INT, "waiting": INT, "oldest_ready_age_s": {"type": "number"},
    "running": INT,
    "max_running": {"type": ["integer", "null"], "description": "At most this many runs of the queue leased at once, "
                                                                "cluster-wide (null: no limit)"},
    "max_starts_per_s": {"type": ["number", "null"], "description": "At most this many leases of the queue granted "
                                                                    "per second, cluster-wide (null: no limit)"}}
QUEUE_VIEW: Schema = {"type": "object", "required": ["queue", "namespace", "max_running", "max_starts_per_s"],
                      "properties": {
    **QUEUE_STATS, "updated_at": {"type": ["string", "null"], "format": "date-time"}, "groups": INT,
    "max_running_per_group": {"type": ["array", "null"], "items": INT,
                              "description": "Each group's share of max_running, by group number"},
    "max_starts_per_s_per_group": {"type": ["number", "null"], "description": "Each group's share of max_starts_per_s"},
    "truncated": {"type": "boolean"}}}


def queue_limits_put(running_max: int, starts_per_s_min: float, starts_per_s_max: float) -> Schema:
    return {"type": "object", "additionalProperties": False, "properties": {
        "max_running": {"type": ["integer", "null"], "minimum": 1, "maximum": running_max,
                        "description": "At least the cluster's number of groups; null or left out: no limit"},
        "max_starts_per_s": {"type": ["number", "null"], "minimum": starts_per_s_min, "maximum": starts_per_s_max,
                             "description": "A token bucket holding a second's worth; null or left out: no limit"}}}


TARGET: Schema = {
    "type": ["object", "null"], "description": "Run by the built-in executor (schedctl worker http).",
    "required": ["kind", "url"], "additionalProperties": False, "properties": {
        "kind": {"const": "http"},
        "url": {"type": "string", "pattern": targets.URL_PATTERN,
                "maxLength": targets.URL_CHARS_MAX,
                "description": "Loopback, link-local and cloud-metadata addresses are refused unless the "
                               "node's --target-allow opens them."},
        "method": {"enum": list(targets.METHODS), "default": "POST"},
        "headers": {"type": "object", "maxProperties": targets.HEADERS_MAX,
                    "propertyNames": {"pattern": targets.HEADER_NAME_PATTERN, "not": {"pattern": "^(" + "|".join(
                        _any_case(name) for name in sorted(targets.RESERVED_HEADERS)) + ")$"}},
                    "additionalProperties": {"type": "string", "maxLength": targets.HEADER_CHARS_MAX,
                                             "pattern": "^[^\r\n]*$"}},
        "body": {"type": ["string", "null"], "description": "Default: the job's payload as JSON."},
        "timeout_s": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": targets.TIMEOUT_S_MAX}}}


def _ranged(option: str, schema: Schema) -> Schema:
    """A numeric option's schema with the range the API allows it (jobspec.RANGES)."""
    low, high = jobspec.RANGES[option]
    return {**schema, "minimum": low, "maximum": high}


def _seconds(option: str, nullable_: bool = True) -> Schema:
    return _ranged(option, {"type": ["number", "null"] if nullable_ else "number", "description": "seconds"})


def cron(limits: Limits) -> Schema:
    return {"type": "string", "minLength": 1, "maxLength": limits.cron_chars_max,
            "examples": ["0 2 * * *", "*/15 9-17 * * 1-5"],
            "description": "5 fields (minute hour day month weekday), 6 (seconds first), or a shorthand: "
                           "@hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually"}


def job_fields(limits: Limits) -> dict[str, Schema]:
    bounds = {"start_at": {**TIME, "description": "No occurrence before this (an every counts from it)."},
              "end_at": {**TIME, "description": "No occurrence after this; the job then completes."}}
    schedule = {"description": "Exactly one of at, cron (+ timezone), every; cron and every may be bounded.",
                "oneOf": [
        {"type": "object", "required": ["at"], "additionalProperties": False, "properties": {"at": TIME}},
        {"type": "object", "required": ["cron"], "additionalProperties": False,
         "properties": {"cron": cron(limits), "timezone": {**TIMEZONE, "default": "UTC"}, **bounds}},
        {"type": "object", "required": ["every"], "additionalProperties": False,
         "properties": {"every": DURATION, **bounds}}]}
    return {
        "job_id": {**nullable(JOB_ID), "description": "Yours; generated when absent or null."},
        "idempotency_key": {**IDEMPOTENCY_KEY, "description": "Same key + same body: 200 with the first job; "
                                                             "different body: 409. Or the Idempotency-Key header."},
        "schedule": schedule,
        "queue": {**QUEUE, "default": "default"},
        "payload": {"description": "Any JSON value, handed to the worker as is."},
        "max_attempts": _ranged("max_attempts", {"type": "integer", "default": 3}),
        "priority": _ranged("priority", {"type": "integer", "default": 0}),
        "misfire_policy": {"enum": [p.value for p in MisfirePolicy], "default": MisfirePolicy.FIRE_ONCE.value},
        "catchup_limit": _ranged("catchup_limit", {"type": "integer", "default": 100}),
        "starting_deadline_s": _seconds("starting_deadline_s"),
        "overlap_policy": {"enum": [p.value for p in OverlapPolicy], "default": OverlapPolicy.ALLOW.value},
        "backoff": {"type": "object", "additionalProperties": False,
                    "properties": {"base_ms": _ranged("backoff.base_ms", INT),
                                   "factor": _ranged("backoff.factor", {"type": "number"}),
                                   "max_ms": _ranged("backoff.max_ms", INT)}},
        "timeout_s": _seconds("timeout_s"),
        "jitter_s": _seconds("jitter_s", nullable_=False),
        "history_limit": _ranged("history_limit", {"type": "integer", "default": 100}),
        "labels": {"type": "object", "maxProperties": limits.labels_max,
                   "additionalProperties": {"type": "string", "maxLength": 63},
                   "description": "Kubernetes-style labels, selected on by GET /v1/jobs?selector="},
        "description": {"type": ["string", "null"], "maxLength": limits.description_chars_max},
        "max_runs": _ranged("max_runs", {"type": ["integer", "null"], "default": None,
                                         "description": "Complete the job once this many occurrences have run "
                                                        "(triggers not counted); null: no limit."}),
        "finished_ttl_s": _ranged("finished_ttl_s", {
            "type": "number", "description": "seconds a finished one-off or a cancelled job is kept, with its "
                                             "runs; 0: forever. Default: the node's --finished-ttl."}),
        "history_ttl_s": _ranged("history_ttl_s", {
            "type": "number", "description": "seconds a repeating job's ended runs are kept, whatever "
                                             "history_limit allows; 0: forever. Default: finished_ttl_s."}),
        "keep_dead_letters": {"type": "boolean", "default": False,
                              "description": "Dead letters stay until re-driven or discarded, whatever the TTLs."},
        "pause_on_failure": {"type": "boolean", "default": False,
                             "description": "Pause the job when one of its runs is dead-lettered (pause_cause says "
                                            "which); resuming it clears that."},
        "skip_calendar": {"type": ["string", "null"], "pattern": pattern(jobspec.CALENDAR_NAME_RE),
                          "maxLength": 64, "description": "A calendar (PUT /v1/calendars/{name}): an occurrence on "
                                                          "one of its days is skipped (reason calendar)."},
        "target": TARGET,
    }


def job_create(limits: Limits) -> Schema:
    fields = job_fields(limits)
    return {"type": "object", "required": ["schedule"], "additionalProperties": False,
            "properties": {name: fields[name] for name in sorted(jobspec.CREATE_FIELDS)}}


def job_patch(limits: Limits) -> Schema:
    fields = job_fields(limits)
    return {"type": "object", "additionalProperties": False, "minProperties": 1,
            "properties": {name: fields[name] for name in sorted(jobspec.OPTION_FIELDS)}}


TRACEPARENT: Schema = {"type": "string", "pattern": "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
                       "description": "Only when the job was created with a W3C trace context"}
JOB: Schema = {"type": "object", "properties": {
    "job_id": STR, "namespace": STR, "state": {"enum": [s.value for s in JobState]},
    "schedule": {"type": "object"}, "queue": STR, "payload": {}, "max_attempts": INT, "priority": INT,
    "misfire_policy": STR, "catchup_limit": INT, "starting_deadline_s": {"type": ["number", "null"]},
    "overlap_policy": STR, "backoff": {"type": "object"}, "timeout_s": {"type": ["number", "null"]},
    "jitter_s": {"type": "number"}, "history_limit": INT, "target": {"type": ["object", "null"]},
    "finished_ttl_s": {"type": "number"}, "history_ttl_s": {"type": "number"}, "keep_dead_letters": {"type": "boolean"},
    "idempotency_key": nullable(STR), "next_fire_time": nullable(TIME), "created_at": TIME, "updated_at": TIME,
    "last_run": {"type": ["object", "null"], "properties": {"run_id": STR, "scheduled_time": TIME,
                                                             "state": {"enum": [s.value for s in RunState]}}},
    "last_success_time": nullable(TIME), "max_runs": {"type": ["integer", "null"]},
    "labels": {"type": "object", "additionalProperties": STR}, "description": nullable(STR),
    "runs_remaining": {"type": ["integer", "null"]}, "pause_on_failure": {"type": "boolean"},
    "pause_cause": {"type": ["object", "null"], "properties": {"reason": STR, "run_id": STR, "time": TIME}},
    "skip_calendar": nullable(STR), "warnings": {"type": "array", "items": STR},
    "traceparent": TRACEPARENT, "tracestate": STR}}
RUN: Schema = {"type": "object", "properties": {
    "run_id": STR, "job_id": STR, "namespace": STR, "queue": STR, "state": {"enum": [s.value for s in RunState]},
    "scheduled_time": TIME, "available_at": nullable(TIME), "attempt": INT, "max_attempts": INT,
    "priority": INT, "fence": INT, "worker_id": nullable(STR), "lease_until": nullable(TIME),
    "created_at": nullable(TIME), "finished_at": nullable(TIME), "result": {}, "error": nullable(STR),
    "reason": nullable(STR), "trigger": {"type": "boolean"}, "buffered": {"type": "boolean"}, "skipped_count": INT, "skipped_until": nullable(TIME)}}
TASK: Schema = {"type": "object", "properties": {
    "run_id": STR, "job_id": STR, "namespace": STR, "queue": STR, "scheduled_time": TIME, "attempt": INT,
    "fence": INT, "idempotency_key": STR, "lease_until": TIME, "payload": {}, "target": {"type": ["object", "null"]},
    "timeout_s": {"type": ["number", "null"]},
    # Only in a task whose job was created with a trace context (W3C; schedulerd/tracing.py).
    "traceparent": TRACEPARENT, "tracestate": STR}}
ERROR: Schema = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["code", "message"], "properties": {"code": STR, "message": STR}}}}
ITEM_RESULTS: Schema = {"type": "object", "properties": {"results": {"type": "array", "items": {
    "type": "object", "properties": {"run_id": STR, "job_id": STR, "ok": {"type": "boolean"},
                                     "lease_until": TIME, "job": JOB, "warnings": {"type": "array", "items": STR},
                                     "error": ERROR["properties"]["error"]}}}}}
LEASE_ITEM: Schema = {"type": "object", "required": ["run_id", "fence"],
                      "properties": {"run_id": {"type": "string", "minLength": 1, "maxLength": 256},
                                     "fence": FENCE}}


# GET /v1/jobs/{id}/occurrences/{time}: the instant, and the verdict with its facts (docs/api.md).
OCCURRENCE_TIME: Schema = {"type": "string", "pattern": pattern(occurrences.TIME_RE),
                           "examples": ["2026-11-30T02:00:00Z", "2026-11-30T03:00:00+01:00"],
                           "description": occurrences.TIME_FORMAT}
OCCURRENCE: Schema = {"type": "object", "required": ["job_id", "time", "verdict", "explanation"], "properties": {
    "job_id": STR, "time": TIME, "verdict": {"enum": [v.value for v in Verdict]}, "explanation": STR,
    "run_id": STR, "state": {"enum": [s.value for s in RunState]}, "attempt": INT, "max_attempts": INT,
    "start_time": nullable(TIME), "finished_at": nullable(TIME), "reason": nullable(STR),
    "trigger": {"type": "boolean"}, "buffered": {"type": "boolean"}, "skipped_from": TIME,
    "skipped_until": nullable(TIME), "skipped_count": {"type": ["integer", "null"]},
    "previous_occurrence": nullable(TIME), "next_occurrence": nullable(TIME), "schedule": {"type": "object"},
    "bound": {"enum": ["start_at", "end_at"]}, "start_at": nullable(TIME), "end_at": nullable(TIME),
    "created_at": TIME, "job_state": {"enum": [s.value for s in JobState]}, "job_updated_at": TIME,
    "next_fire_time": nullable(TIME), "runs_remaining": INT, "kept_runs": INT, "oldest_kept_time": nullable(TIME),
    "history_limit": INT, "history_ttl_s": {"type": "number"},
    "pruned_by": {"type": "array", "items": {"enum": ["history_limit", "history_ttl"]}},
    "possible_causes": {"type": "array", "items": {"enum": [c.value for c in Cause]}},
    "skip_calendar": {**STR, "description": "A coming occurrence on a day of the job's calendar, as it stands now."}}}


BACKFILL_REQUEST: Schema = {
    "type": "object", "required": ["start", "end"], "additionalProperties": False,
    "properties": {"start": {**TIME, "description": "The first instant of the range (included)."},
                   "end": {**TIME, "description": "The end of the range (excluded); not in the future."},
                   "dry_run": {"type": "boolean", "default": False},
                   "overlap_policy": {"enum": [p.value for p in OverlapPolicy],
                                      "description": "Instead of the job's own, for these runs."}}}
BACKFILL_ANSWER: Schema = {"type": "object", "properties": {
    "job_id": STR, "dry_run": {"type": "boolean"}, "already_had_run": INT, "created": INT, "would_create": INT,
    "next_fire_time": nullable(TIME),
    "occurrences": {"type": "array", "items": {"type": "object", "properties": {
        "scheduled_time": TIME, "already_had_run": {"type": "boolean"}, "run_id": STR,
        "state": {"enum": [s.value for s in RunState]}, "reason": nullable(STR)}}}}}


def obj(required: tuple[str, ...] = (), **props: Schema) -> Schema:
    schema: Schema = {"type": "object", "properties": props}
    if required:
        schema["required"] = list(required)
    return schema


def batch(name: str, item: Schema, max_items: int) -> Schema:
    """A worker's batch request: its id and 1..max_items items."""
    return obj(("worker_id", name), worker_id=WORKER_ID,
               **{name: {"type": "array", "minItems": 1, "maxItems": max_items, "items": item}})


def page(name: str, item: Schema) -> Schema:
    return obj(**{name: {"type": "array", "items": item}}, next_cursor=nullable(STR))
