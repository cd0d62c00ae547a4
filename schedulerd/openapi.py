"""GET /v1/openapi.json: the HTTP API described as OpenAPI 3.1.

Written next to the handlers, checked against them: tests/unit/test_openapi.py
fails when a route exists without a description here (or the reverse), or when
the job fields drift from schedulerd/jobspec.py, whose field list builds the
job schema below."""
from __future__ import annotations

from typing import Any

from schedulerd.jobspec import CREATE_FIELDS, OPTION_FIELDS, RANGES
from schedulerd.limits import Limits
from storage.model import JobState, MisfirePolicy, OverlapPolicy, RunState

Schema = dict[str, Any]

_STR: Schema = {"type": "string"}
_INT: Schema = {"type": "integer"}
_TIME: Schema = {"type": "string", "format": "date-time", "description": "ISO 8601 with Z or an offset"}
_DURATION: Schema = {"type": "string", "examples": ["250ms", "90s", "1h30m"], "description": "units ms s m h d"}
_SECONDS: Schema = {"type": ["number", "null"], "minimum": 0, "description": "seconds"}
TARGET: Schema = {"type": ["object", "null"], "description": "Run by the built-in executor (schedctl worker http).",
                  "required": ["kind", "url"], "properties": {
                      "kind": {"const": "http"}, "url": {"type": "string", "format": "uri"},
                      "method": {"enum": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"], "default": "POST"},
                      "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                      "body": {"type": "string", "description": "Default: the job's payload as JSON."},
                      "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600}}}


def _ranged(option: str, schema: Schema) -> Schema:
    """A numeric option's schema with the range the API allows it (jobspec.RANGES)."""
    low, high = RANGES[option]
    return {**schema, "minimum": low, "maximum": high}


def _seconds(option: str, nullable: bool = True) -> Schema:
    return _ranged(option, {"type": ["number", "null"] if nullable else "number", "description": "seconds"})


JOB_FIELD_SCHEMAS: dict[str, Schema] = {
    "job_id": {"type": "string", "maxLength": 200, "description": "Yours; generated when absent."},
    "idempotency_key": {"type": "string", "description": "Same key + same body: 200 with the first job; "
                                                         "different body: 409. Or the Idempotency-Key header."},
    "schedule": {"type": "object", "description": "Exactly one of at, cron (+ timezone), every.",
                 "properties": {"at": _TIME, "cron": {"type": "string", "examples": ["0 2 * * *"]},
                                "timezone": {"type": "string", "examples": ["Europe/Berlin"]},
                                "every": _DURATION}},
    "queue": {"type": "string", "default": "default"},
    "payload": {"description": "Any JSON value, handed to the worker as is."},
    "max_attempts": _ranged("max_attempts", {"type": "integer", "default": 3}),
    "priority": _ranged("priority", {"type": "integer", "default": 0}),
    "misfire_policy": {"enum": [p.value for p in MisfirePolicy], "default": MisfirePolicy.FIRE_ONCE.value},
    "catchup_limit": _ranged("catchup_limit", {"type": "integer", "default": 100}),
    "starting_deadline_s": _seconds("starting_deadline_s"),
    "overlap_policy": {"enum": [p.value for p in OverlapPolicy], "default": OverlapPolicy.ALLOW.value},
    "backoff": {"type": "object", "properties": {"base_ms": _ranged("backoff.base_ms", _INT),
                                                 "factor": _ranged("backoff.factor", {"type": "number"}),
                                                 "max_ms": _ranged("backoff.max_ms", _INT)}},
    "timeout_s": _seconds("timeout_s"),
    "jitter_s": _seconds("jitter_s", nullable=False),
    "history_limit": _ranged("history_limit", {"type": "integer", "default": 100}),
    "target": TARGET,
}

JOB_CREATE: Schema = {"type": "object", "required": ["schedule"], "additionalProperties": False,
                      "properties": {name: JOB_FIELD_SCHEMAS[name] for name in sorted(CREATE_FIELDS)}}
JOB_PATCH: Schema = {"type": "object", "additionalProperties": False,
                     "properties": {name: JOB_FIELD_SCHEMAS[name] for name in sorted(OPTION_FIELDS)}}
JOB: Schema = {"type": "object", "properties": {
    **{name: JOB_FIELD_SCHEMAS[name] for name in sorted(OPTION_FIELDS)},
    "job_id": _STR, "state": {"enum": [s.value for s in JobState]}, "next_fire_time": _TIME,
    "created_at": _TIME, "updated_at": _TIME}}
RUN: Schema = {"type": "object", "properties": {
    "run_id": _STR, "job_id": _STR, "queue": _STR, "state": {"enum": [s.value for s in RunState]},
    "scheduled_time": _TIME, "available_at": _TIME, "attempt": _INT, "max_attempts": _INT, "fence": _INT,
    "worker_id": _STR, "lease_until": _TIME, "finished_at": _TIME, "idempotency_key": _STR, "trigger": {
        "type": "boolean"}, "result": {}, "error": _STR, "reason": _STR, "skipped_count": _INT,
    "skipped_until": _TIME}}
TASK: Schema = {"type": "object", "properties": {
    "run_id": _STR, "job_id": _STR, "queue": _STR, "scheduled_time": _TIME, "attempt": _INT, "fence": _INT,
    "idempotency_key": _STR, "lease_until": _TIME, "payload": {}, "target": TARGET, "timeout_s": _SECONDS}}
ERROR: Schema = {"type": "object", "properties": {"error": {"type": "object", "properties": {
    "code": _STR, "message": _STR}}}}
ITEM_RESULTS: Schema = {"type": "object", "properties": {"results": {"type": "array", "items": {
    "type": "object", "properties": {"run_id": _STR, "job_id": _STR, "ok": {"type": "boolean"},
                                     "lease_until": _TIME, "error": ERROR["properties"]["error"]}}}}}
LEASE_ITEM: Schema = {"type": "object", "required": ["run_id", "fence"], "properties": {"run_id": _STR, "fence": _INT}}


def _body(schema: Schema, required: bool = True) -> Schema:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def _ok(description: str, schema: Schema | None = None, status: str = "200") -> dict[str, Any]:
    answer: Schema = {"description": description}
    if schema is not None:
        answer["content"] = {"application/json": {"schema": schema}}
    return {status: answer, "4XX": {"description": "The request was refused; nothing changed.",
                                    "content": {"application/json": {"schema": ERROR}}},
            "503": {"description": "No quorum, or this node's disk is full: retry (Retry-After)."}}


def _param(name: str, where: str, schema: Schema, description: str = "") -> Schema:
    return {"name": name, "in": where, "required": where == "path", "schema": schema, "description": description}


def _obj(**props: Schema) -> Schema:
    return {"type": "object", "properties": props}


JOB_ID = _param("job_id", "path", _STR)
RUN_ID = _param("run_id", "path", _STR)
LIMIT = _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": Limits.page_size_max, "default": 100})
CURSOR = _param("cursor", "query", _STR, "From the previous page's next_cursor.")
WORKER = {"worker_id": _STR}


def operations() -> dict[str, dict[str, Any]]:
    """{path: {method: operation}}; paths use aiohttp's {name} placeholders, as OpenAPI does."""
    return {
        "/v1/jobs": {
            "post": {"summary": "Create a job", "tags": ["jobs"],
                     "parameters": [_param("Idempotency-Key", "header", _STR)], "requestBody": _body(JOB_CREATE),
                     "responses": _ok("Created (200: the same idempotent request again).", JOB, "201")},
            "get": {"summary": "List jobs", "tags": ["jobs"],
                    "parameters": [_param("state", "query", {"enum": [s.value for s in JobState]}),
                                   _param("queue", "query", _STR), LIMIT, CURSOR],
                    "responses": _ok("A page of jobs.", _obj(jobs={"type": "array", "items": JOB},
                                                             next_cursor=_STR))}},
        "/v1/jobs:batch": {
            "post": {"summary": f"Create up to {Limits.create_batch_max} jobs in one Raft entry", "tags": ["jobs"],
                     "parameters": [_param("Prefer", "header", _STR,
                                           "return=minimal: each created job's result without its view.")],
                     "requestBody": _body(_obj(jobs={"type": "array", "items": JOB_CREATE,
                                                     "maxItems": Limits.create_batch_max})),
                     "responses": _ok("One result per job, in order.", ITEM_RESULTS)}},
        "/v1/jobs/{job_id}": {
            "get": {"summary": "Get a job", "tags": ["jobs"], "parameters": [JOB_ID],
                    "responses": _ok("The job.", JOB)},
            "patch": {"summary": "Change a job (runs already claimed keep theirs)", "tags": ["jobs"],
                      "parameters": [JOB_ID], "requestBody": _body(JOB_PATCH), "responses": _ok("The job.", JOB)},
            "delete": {"summary": "Cancel a job: no new occurrences; queued runs cancelled", "tags": ["jobs"],
                       "parameters": [JOB_ID], "responses": _ok("The job, cancelled.", JOB)}},
        "/v1/jobs/{job_id}/pause": {
            "post": {"summary": "Pause a job", "tags": ["jobs"], "parameters": [JOB_ID],
                     "responses": _ok("The job.", JOB)}},
        "/v1/jobs/{job_id}/resume": {
            "post": {"summary": "Resume a job from now (no catch-up of the pause)", "tags": ["jobs"],
                     "parameters": [JOB_ID], "responses": _ok("The job.", JOB)}},
        "/v1/jobs/{job_id}/trigger": {
            "post": {"summary": "Run a job now, once, with its own idempotency key", "tags": ["jobs"],
                     "parameters": [JOB_ID], "responses": _ok("The new run.", _obj(run=RUN), "201")}},
        "/v1/jobs/{job_id}/runs": {
            "get": {"summary": "A job's runs, newest first", "tags": ["runs"], "parameters": [JOB_ID, LIMIT, CURSOR],
                    "responses": _ok("A page of runs.", _obj(runs={"type": "array", "items": RUN},
                                                             next_cursor=_STR))}},
        "/v1/runs/{run_id}": {
            "get": {"summary": "Get a run", "tags": ["runs"], "parameters": [RUN_ID],
                    "responses": _ok("The run.", RUN)}},
        "/v1/runs/{run_id}/retry": {
            "post": {"summary": "Re-drive a dead letter (a fresh round of attempts)", "tags": ["runs"],
                     "parameters": [RUN_ID], "responses": _ok("The run, queued.", _obj(run=RUN))}},
        "/v1/dead-letter": {
            "get": {"summary": "Dead-lettered runs, oldest first", "tags": ["runs"],
                    "parameters": [_param("queue", "query", _STR), LIMIT, CURSOR],
                    "responses": _ok("A page of runs.", _obj(runs={"type": "array", "items": RUN},
                                                             next_cursor=_STR))}},
        "/v1/preview": {
            "get": {"summary": "Next fire times of a schedule, without creating a job", "tags": ["jobs"],
                    "parameters": [_param("cron", "query", _STR), _param("timezone", "query", _STR),
                                   _param("every", "query", _STR),
                                   _param("n", "query", {"type": "integer", "minimum": 1,
                                                         "maximum": Limits.preview_n_max})],
                    "responses": _ok("Fire times.", _obj(fire_times={"type": "array", "items": _TIME}))}},
        "/v1/tasks/poll": {
            "post": {"summary": "Long-poll for due tasks; each comes leased to this worker", "tags": ["workers"],
                     "requestBody": _body(_obj(**WORKER, queues={"type": "array", "items": _STR},
                                               max_tasks={"type": "integer", "minimum": 1,
                                                          "maximum": Limits.lease_batch_max},
                                               wait_s={"type": "number", "minimum": 0,
                                                       "maximum": Limits.long_poll_s_max})),
                     "responses": _ok("Tasks (empty after wait_s), and the cluster's time their lease_until is on.",
                                      _obj(tasks={"type": "array", "items": TASK}, now=_TIME))}},
        "/v1/tasks/heartbeat": {
            "post": {"summary": "Extend many leases", "tags": ["workers"],
                     "requestBody": _body(_obj(**WORKER, leases={"type": "array", "items": LEASE_ITEM})),
                     "responses": _ok("One result per lease, and the cluster's time.",
                                      {**ITEM_RESULTS, "properties": {**ITEM_RESULTS["properties"], "now": _TIME}})}},
        "/v1/tasks/ack": {
            "post": {"summary": "Ack many runs", "tags": ["workers"],
                     "requestBody": _body(_obj(**WORKER, acks={"type": "array", "items": {
                         **LEASE_ITEM, "properties": {**LEASE_ITEM["properties"], "result": {}}}})),
                     "responses": _ok("One result per ack.", ITEM_RESULTS)}},
        "/v1/tasks/{run_id}/heartbeat": {
            "post": {"summary": "Extend one lease", "tags": ["workers"], "parameters": [RUN_ID],
                     "requestBody": _body(_obj(**WORKER, fence=_INT)),
                     "responses": _ok("The new lease end, and the cluster's time.",
                                      _obj(lease_until=_TIME, now=_TIME))}},
        "/v1/tasks/{run_id}/ack": {
            "post": {"summary": "Ack one run (409 stale_fence if the lease is no longer yours)", "tags": ["workers"],
                     "parameters": [RUN_ID], "requestBody": _body(_obj(**WORKER, fence=_INT, result={})),
                     "responses": _ok("The run.", _obj(run=RUN))}},
        "/v1/tasks/{run_id}/nack": {
            "post": {"summary": "Fail one attempt: retry after backoff, or dead-letter", "tags": ["workers"],
                     "parameters": [RUN_ID], "requestBody": _body(_obj(**WORKER, fence=_INT, error=_STR)),
                     "responses": _ok("The run.", _obj(run=RUN))}},
        "/v1/cluster": {
            "get": {"summary": "This node, its Raft groups and their leaders", "tags": ["operations"],
                    "responses": _ok("Cluster status.", {"type": "object"})}},
        "/v1/cluster/digest": {
            "get": {"summary": "A hash of each group's replicated state (equal on converged replicas)",
                    "tags": ["operations"], "responses": _ok("Digests.", {"type": "object"})}},
        "/v1/queues": {
            "get": {"summary": "Per queue: ready now, queued for later, the oldest ready run's wait",
                    "tags": ["operations"],
                    "responses": _ok("Queues.", _obj(queues={"type": "array", "items": _obj(
                        queue=_STR, ready=_INT, waiting=_INT, oldest_ready_age_s={"type": "number"})},
                        truncated={"type": "boolean"}))}},
        "/v1/audit": {
            "get": {"summary": "Who changed what, when (admin scope); newest first", "tags": ["operations"],
                    "parameters": [LIMIT, CURSOR],
                    "responses": _ok("Audit records.", _obj(records={"type": "array", "items": _obj(
                        at=_TIME, who=_STR, what=_STR, via=_STR, outcome=_STR, raft_index=_INT)},
                        next_cursor=_STR))}},
        "/ui": {
            "get": {"summary": "The web dashboard (HTML)", "tags": ["operations"],
                    "responses": {"200": {"description": "HTML page."}}}},
        "/v1/openapi.json": {
            "get": {"summary": "This document", "tags": ["operations"], "responses": _ok("OpenAPI 3.1.")}},
        "/metrics": {
            "get": {"summary": "Prometheus metrics", "tags": ["operations"],
                    "responses": {"200": {"description": "Prometheus text format."}}}},
        "/healthz": {
            "get": {"summary": "The process answers", "tags": ["operations"], "responses": _ok("Alive.")}},
        "/readyz": {
            "get": {"summary": "Every group has a leader and this node has caught up", "tags": ["operations"],
                    "responses": _ok("Ready.")}},
    }


def document(version: str) -> dict[str, Any]:
    paths = operations()
    namespace = _param("X-Namespace", "header", {"type": "string", "default": "default"},
                       "Namespace of the jobs, runs and queues the call is about.")
    for path, ops in paths.items():
        if path.startswith(("/v1/jobs", "/v1/runs", "/v1/tasks", "/v1/dead-letter")):
            for op in ops.values():
                op["parameters"] = [*op.get("parameters", []), namespace]
    return {"openapi": "3.1.0",
            "info": {"title": "schedulerd", "version": version,
                     "description": "Distributed job scheduler: jobs, runs, workers (long-poll leasing), operations."},
            "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
            "security": [{"bearer": []}],
            "paths": paths}
