"""GET /v1/openapi.json: the HTTP API described as OpenAPI 3.1.

Written next to the handlers, checked against them: tests/unit/test_openapi.py
fails when a route exists without a description here (or the reverse), or when
the job fields drift from schedulerd/jobspec.py, whose field list builds the
job schema below."""
from __future__ import annotations

from typing import Any

from schedulerd import auth
from schedulerd.limits import Limits
from schedulerd.api.openapi_schemas import (BACKFILL_ANSWER, BACKFILL_REQUEST, DURATION, ERROR, FENCE, IDEMPOTENCY_KEY, INT, ITEM_RESULTS, JOB, JOB_ID,
                                        LEASE_ITEM, NAMESPACE, OCCURRENCE, OCCURRENCE_TIME, QUEUE, RUN, RUN_ID, STR,
                                        TASK, TIME, TIMEZONE, WORKER_ID, Schema, batch, cron, job_create, job_patch,
                                        nullable, obj, page)
from schedulerd.api.openapi_schemas import (CALENDAR, CALENDAR_NAME, CALENDAR_PUT, QUEUE_STATS, QUEUE_VIEW,
                                            queue_limits_put)
from schedulerd.storage import queue_limits
from schedulerd.storage.model import JobState, RunState

# Answers that are not JSON, by route.
_TEXT_ANSWERS = {"/ui": "text/html", "/metrics": "text/plain"}


def _body(schema: Schema, required: bool = True) -> Schema:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def _ok(description: str, schema: Schema | None = None, status: str = "200", *also: str) -> dict[str, Any]:
    answer: Schema = {"description": description}
    if schema is not None:
        answer["content"] = {"application/json": {"schema": schema}}
    refused = {"description": "The request was refused; nothing changed.",
               "content": {"application/json": {"schema": ERROR}}}
    return {status: answer, **{s: answer for s in also}, "4XX": refused,
            "503": {"description": "No quorum, or this node's disk is full: retry (Retry-After).",
                    "content": {"application/json": {"schema": ERROR}}}}


def _param(name: str, where: str, schema: Schema, description: str = "") -> Schema:
    return {"name": name, "in": where, "required": where == "path", "schema": schema, "description": description}


JOB_PARAM = _param("job_id", "path", JOB_ID)
RUN_PARAM = _param("run_id", "path", RUN_ID)
NODE_PARAM = _param("node_id", "path", {"type": "string", "pattern": "^n-[0-9a-f]{12}$"})
# W3C Trace Context: stored with each job created and delivered in its tasks; invalid ones are ignored.
TRACE_HEADERS = (_param("traceparent", "header", STR, "W3C traceparent the job is created in; each of its tasks "
                        "carries it. An invalid one is ignored (W3C Trace Context), not refused."),
                 _param("tracestate", "header", STR, "W3C tracestate, kept with a valid traceparent."))


def _cursor(regex: str) -> Schema:
    return _param("cursor", "query", {"type": "string", "pattern": regex}, "From the previous page's next_cursor.")


JOBS_CURSOR = _param("cursor", "query", STR, "From the previous page's next_cursor.")
RUNS_CURSOR = _cursor("^[0-9]{1,19}$")
DEAD_LETTER_CURSOR = _cursor("^[0-9]{1,19}:" + RUN_ID["pattern"][1:])
AUDIT_CURSOR = _cursor("^([0-9a-f]{2})*$")
QUEUE_FILTER = _param("queue", "query", QUEUE)
QUEUE_PARAM = _param("name", "path", QUEUE)
CALENDAR_PARAM = _param("name", "path", CALENDAR_NAME)


def operations(limits: Limits) -> dict[str, dict[str, Any]]:
    """{path: {method: operation}}, with the node's limits; paths use aiohttp's {name}
    placeholders, as OpenAPI does."""
    runs_page = page("runs", RUN)
    create = job_create(limits)
    preview_n = _param("n", "query", {"type": "integer", "minimum": 1, "maximum": limits.preview_n_max})
    page_size = _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": limits.page_size_max,
                                          "default": min(100, limits.page_size_max)})
    return {
        "/v1/jobs": {
            "post": {"summary": "Create a job", "tags": ["jobs"],
                     "parameters": [_param("Idempotency-Key", "header", IDEMPOTENCY_KEY,
                                           "Or the body's idempotency_key; both given must be equal."),
                                    *TRACE_HEADERS],
                     "requestBody": _body(create),
                     "responses": _ok("Created (200: the same idempotent request again).", JOB, "201", "200")},
            "get": {"summary": "List jobs", "tags": ["jobs"],
                    "parameters": [_param("state", "query", {"enum": [s.value for s in JobState]}),
                                   QUEUE_FILTER, _param("selector", "query", STR,
                                                        "A label selector: team=billing,env!=prod,tier in (a,b),"
                                                        "owner,!legacy (Kubernetes syntax)."),
                                   page_size, JOBS_CURSOR],
                    "responses": _ok("A page of jobs.", page("jobs", JOB))}},
        **{f"/v1/jobs:{action}": {
            "post": {"summary": f"{action.capitalize()} every job a label selector selects, "
                                f"{limits.bulk_batch_max} jobs per Raft entry", "tags": ["jobs"],
                     "requestBody": _body(obj(("selector",), selector=STR)),
                     "responses": _ok("How many jobs were selected, and how many changed.", obj(
                         action=STR, selector=STR, matched=INT, changed=INT))}}
           for action in ("pause", "resume", "cancel")},
        "/v1/jobs:batch": {
            "post": {"summary": f"Create up to {limits.create_batch_max} jobs in one Raft entry", "tags": ["jobs"],
                     "parameters": [_param("Prefer", "header", STR,
                                           "return=minimal: each created job's result without its view."),
                                    *TRACE_HEADERS],
                     "requestBody": _body(obj(("jobs",), jobs={"type": "array", "items": create, "minItems": 1,
                                                               "maxItems": limits.create_batch_max})),
                     "responses": _ok("One result per job, in order.", ITEM_RESULTS)}},
        "/v1/jobs/{job_id}": {
            "get": {"summary": "Get a job", "tags": ["jobs"], "parameters": [JOB_PARAM],
                    "responses": _ok("The job.", JOB)},
            "patch": {"summary": "Change a job (runs already claimed keep theirs)", "tags": ["jobs"],
                      "parameters": [JOB_PARAM], "requestBody": _body(job_patch(limits)),
                      "responses": _ok("The job.", JOB)},
            "delete": {"summary": "Cancel a job: no new occurrences; queued runs cancelled. With purge=true, "
                                  "then delete it and its runs (its id may be created again)", "tags": ["jobs"],
                       "parameters": [JOB_PARAM, _param("purge", "query", {"type": "string", "enum": ["true", "false"],
                                                                         "default": "false"})],
                       "responses": _ok("The job, cancelled; or, purged, what went.",
                                        {"anyOf": [JOB, obj(job_id=STR, purged={"const": True},
                                                            deleted_runs=INT)]})}},
        "/v1/jobs/{job_id}/pause": {
            "post": {"summary": "Pause a job", "tags": ["jobs"], "parameters": [JOB_PARAM],
                     "responses": _ok("The job.", JOB)}},
        "/v1/jobs/{job_id}/resume": {
            "post": {"summary": "Resume a job from now (no catch-up of the pause)", "tags": ["jobs"],
                     "parameters": [JOB_PARAM], "responses": _ok("The job.", JOB)}},
        "/v1/jobs/{job_id}/trigger": {
            "post": {"summary": "Run a job now, once, with its own idempotency key", "tags": ["jobs"],
                     "parameters": [JOB_PARAM], "responses": _ok("The new run.", obj(run=RUN), "201")}},
        "/v1/jobs/{job_id}/backfill": {
            "post": {"summary": "Run each past occurrence of the job's schedule in [start, end) that has no run yet "
                                f"(at most {limits.backfill_occurrences_max}); dry_run lists them and changes nothing",
                     "tags": ["jobs"], "parameters": [JOB_PARAM], "requestBody": _body(BACKFILL_REQUEST),
                     "responses": _ok("Each occurrence of the range, with its run.", BACKFILL_ANSWER)}},
        "/v1/jobs/{job_id}/runs": {
            "get": {"summary": "A job's runs, newest first", "tags": ["runs"],
                    "parameters": [JOB_PARAM, page_size, RUNS_CURSOR], "responses": _ok("A page of runs.", runs_page)}},
        "/v1/runs": {
            "get": {"summary": "Runs in one state across every job, in run id order", "tags": ["runs"],
                    "parameters": [{**_param("state", "query", {"enum": [s.value for s in RunState]}),
                                    "required": True}, QUEUE_FILTER, page_size,
                                   _cursor(RUN_ID["pattern"])],
                    "responses": _ok("A page of runs.", runs_page)}},
        "/v1/runs/{run_id}": {
            "get": {"summary": "Get a run", "tags": ["runs"], "parameters": [RUN_PARAM],
                    "responses": _ok("The run.", RUN)},
            "delete": {"summary": "Discard a dead letter (409 for a run in any other state)", "tags": ["runs"],
                       "parameters": [RUN_PARAM],
                       "responses": _ok("The run as it was.", obj(run_id=STR, discarded={"const": True}, run=RUN))}},
        "/v1/runs/{run_id}/retry": {
            "post": {"summary": "Re-drive a dead letter (a fresh round of attempts)", "tags": ["runs"],
                     "parameters": [RUN_PARAM], "responses": _ok("The run, queued.", obj(run=RUN))}},
        "/v1/runs/{run_id}/cancel": {
            "post": {"summary": "Cancel one run: a queued or waiting one at once; a running one has its lease revoked "
                                "(its worker hears it at its next heartbeat, and its ack or nack is refused)",
                     "tags": ["runs"], "parameters": [RUN_PARAM], "responses": _ok("The run, cancelled.",
                                                                                   obj(run=RUN))}},
        "/v1/dead-letter": {
            "get": {"summary": "Dead-lettered runs, oldest first", "tags": ["runs"],
                    "parameters": [QUEUE_FILTER, page_size, DEAD_LETTER_CURSOR],
                    "responses": _ok("A page of runs.", runs_page)}},
        "/v1/preview": {
            "get": {"summary": "Next fire times of a schedule (give cron or every), without creating a job",
                    "tags": ["jobs"],
                    "parameters": [_param("cron", "query", cron(limits)), _param("timezone", "query", TIMEZONE),
                                   _param("every", "query", DURATION), preview_n,
                                   _param("from", "query", TIME, "Fire times after this instant (default: now).")],
                    "responses": _ok("Fire times.", obj(fire_times={"type": "array", "items": TIME},
                                                        warnings={"type": "array", "items": STR}))}},
        "/v1/jobs/{job_id}/preview": {
            "get": {"summary": "A job's next occurrences, each with the time its run becomes available (jitter "
                               "applied)", "tags": ["jobs"], "parameters": [JOB_PARAM, preview_n],
                    "responses": _ok("The next occurrences.", obj(
                        job_id=STR, state={"enum": [s.value for s in JobState]},
                        occurrences={"type": "array", "items": obj(
                            scheduled_time=TIME, start_time=TIME, run_id=STR,
                            skipped={"type": "string", "description": "Why this occurrence will not run (calendar: "
                                                                      "its skip_calendar lists its day)"})}))}},
        "/v1/jobs/{job_id}/occurrences/{time}": {
            "get": {"summary": "Why an instant of a job did or did not run: a verdict, one sentence and its facts, "
                               "from the records (read-only)", "tags": ["jobs"],
                    "parameters": [JOB_PARAM, _param("time", "path", OCCURRENCE_TIME)],
                    "responses": _ok("The verdict.", OCCURRENCE)}},
        "/v1/tasks/poll": {
            "post": {"summary": "Long-poll for due tasks; each comes leased to this worker", "tags": ["workers"],
                     "requestBody": _body(obj(
                         ("worker_id", "queues"), worker_id=WORKER_ID,
                         queues={"type": "array", "minItems": 1, "maxItems": limits.poll_queues_max, "items": QUEUE},
                         max_tasks={"type": "integer", "minimum": 1, "maximum": limits.lease_batch_max},
                         wait_s={"type": "number", "minimum": 0, "maximum": limits.long_poll_s_max})),
                     "responses": _ok("Tasks (empty after wait_s), and the cluster's time their lease_until is on.",
                                      obj(tasks={"type": "array", "items": TASK}, now=TIME))}},
        "/v1/tasks/heartbeat": {
            "post": {"summary": "Extend many leases", "tags": ["workers"],
                     "requestBody": _body(batch("leases", LEASE_ITEM, limits.ack_batch_max)),
                     "responses": _ok("One result per lease, and the cluster's time.",
                                      {**ITEM_RESULTS, "properties": {**ITEM_RESULTS["properties"], "now": TIME}})}},
        "/v1/tasks/ack": {
            "post": {"summary": "Ack many runs", "tags": ["workers"],
                     "requestBody": _body(batch("acks", {**LEASE_ITEM, "properties": {
                         **LEASE_ITEM["properties"], "result": {}}}, limits.ack_batch_max)),
                     "responses": _ok("One result per ack.", ITEM_RESULTS)}},
        "/v1/tasks/{run_id}/heartbeat": {
            "post": {"summary": "Extend one lease", "tags": ["workers"], "parameters": [RUN_PARAM],
                     "requestBody": _body(obj(("worker_id", "fence"), worker_id=WORKER_ID, fence=FENCE)),
                     "responses": _ok("The new lease end, and the cluster's time.",
                                      obj(lease_until=TIME, now=TIME))}},
        "/v1/tasks/{run_id}/ack": {
            "post": {"summary": "Ack one run (409 stale_fence if the lease is no longer yours)", "tags": ["workers"],
                     "parameters": [RUN_PARAM],
                     "requestBody": _body(obj(("worker_id", "fence"), worker_id=WORKER_ID, fence=FENCE, result={})),
                     "responses": _ok("The run.", obj(run=RUN))}},
        "/v1/tasks/{run_id}/nack": {
            "post": {"summary": "Fail one attempt: retry after backoff, or dead-letter", "tags": ["workers"],
                     "parameters": [RUN_PARAM],
                     "requestBody": _body(obj(("worker_id", "fence"), worker_id=WORKER_ID, fence=FENCE, error=STR)),
                     "responses": _ok("The run.", obj(run=RUN))}},
        "/v1/cluster": {
            "get": {"summary": "This node, its Raft groups and their leaders", "tags": ["operations"],
                    "responses": _ok("Cluster status.", {"type": "object"})}},
        "/v1/cluster/digest": {
            "get": {"summary": "A hash of each group's replicated state (equal on converged replicas)",
                    "tags": ["operations"], "responses": _ok("Digests.", {"type": "object"})}},
        "/v1/cluster/nodes": {
            "post": {"summary": "Register a joining node (admin scope; `schedulerd --join` calls it)",
                     "tags": ["operations"],
                     "requestBody": _body(obj(("node_id", "http", "raft"), node_id=STR, http=STR, raft=STR)),
                     "responses": _ok("Registered.", obj(node_id=STR, joined={"type": "boolean"}), "200", "201")}},
        "/v1/cluster/nodes/{node_id}": {
            "get": {"summary": "One node's state in the registry (no token: a node that was away asks it)",
                    "tags": ["operations"], "parameters": [NODE_PARAM],
                    "responses": _ok("The node's state.", obj(node_id=STR, state=STR))},
            "delete": {"summary": "Drain a node out of the cluster (admin scope): its replicas move, then it leaves",
                       "tags": ["operations"], "parameters": [NODE_PARAM],
                       "responses": _ok("Draining.", obj(node_id=STR, state=STR), "202")}},
        "/v1/queues": {
            "get": {"summary": "Per queue: ready now, queued for later, the oldest ready run's wait, running now",
                    "tags": ["operations"],
                    "responses": _ok("Queues (and every queue with limits).", obj(
                        queues={"type": "array", "items": obj(**QUEUE_STATS)}, truncated={"type": "boolean"}))}},
        "/v1/queues:history": {
            "get": {"summary": "Per queue, the last 15 minutes in 10-second slots: dispatches per second and the "
                               "lateness p50/p99 of first leases (the dashboard's charts)",
                    "tags": ["operations"],
                    "responses": _ok("Queue history.", obj(slot_s=INT, queues={"type": "array", "items": obj(
                        queue=STR, namespace=STR, points={"type": "array", "items": obj(
                            time=INT, dispatched_per_s={"type": "number"},
                            lateness_p50_s={"type": ["number", "null"]},
                            lateness_p99_s={"type": ["number", "null"]})})}))}},
        "/v1/queues/{name}": {
            "get": {"summary": "One queue: its limits, each group's share of them, and what waits and runs",
                    "tags": ["operations"], "parameters": [QUEUE_PARAM], "responses": _ok("The queue.", QUEUE_VIEW)},
            "put": {"summary": "Set a queue's limits, cluster-wide: max_running and max_starts_per_s (a field left out "
                               f"or null lifts it; at most queue_limits_max, {limits.queue_limits_max}, queues have "
                               "limits). Each group enforces its share from its next lease",
                    "tags": ["operations"], "parameters": [QUEUE_PARAM],
                    "requestBody": _body(queue_limits_put(limits.queue_running_max, queue_limits.STARTS_PER_S_MIN,
                                                          limits.queue_starts_per_s_max)),
                    "responses": _ok("The queue, with its limits as stored.", QUEUE_VIEW)}},
        "/v1/calendars": {
            "get": {"summary": f"Every holiday calendar, by name (at most calendars_max, {limits.calendars_max})",
                    "tags": ["calendars"],
                    "responses": _ok("Calendars.", obj(calendars={"type": "array", "items": CALENDAR}))}},
        "/v1/calendars/{name}": {
            "get": {"summary": "One calendar, with some of the jobs that name it", "tags": ["calendars"],
                    "parameters": [CALENDAR_PARAM], "responses": _ok("The calendar.", CALENDAR)},
            "put": {"summary": "Create or replace a calendar; jobs naming it follow it from their next claim on "
                               f"(at most calendar_ranges_max, {limits.calendar_ranges_max}, ranges once merged)",
                    "tags": ["calendars"], "parameters": [CALENDAR_PARAM], "requestBody": _body(CALENDAR_PUT),
                    "responses": _ok("The calendar as stored (201: created).", CALENDAR, "200", "201")},
            "delete": {"summary": "Delete a calendar (409 while a scheduled or paused job names it)",
                       "tags": ["calendars"], "parameters": [CALENDAR_PARAM],
                       "responses": _ok("Deleted.", obj(name=STR, deleted={"type": "boolean"}))}},
        "/v1/audit": {
            "get": {"summary": "Who changed what, when (admin scope); newest first", "tags": ["operations"],
                    "parameters": [page_size, AUDIT_CURSOR],
                    "responses": _ok("Audit records.", obj(records={"type": "array", "items": obj(
                        at=TIME, who=STR, what=STR, via=STR, outcome=STR, raft_index=INT)},
                        next_cursor=nullable(STR)))}},
        "/ui": {"get": {"summary": "The web dashboard (HTML)", "tags": ["operations"], "responses": _ok("HTML page.")}},
        "/v1/openapi.json": {
            "get": {"summary": "This document", "tags": ["operations"],
                    "responses": _ok("OpenAPI 3.1.", {"type": "object"})}},
        "/metrics": {
            "get": {"summary": "Prometheus metrics", "tags": ["operations"],
                    "responses": _ok("Prometheus text format.")}},
        "/healthz": {
            "get": {"summary": "The process answers", "tags": ["operations"],
                    "responses": _ok("Alive.", obj(ok={"type": "boolean"}, node_id=nullable(STR)))}},
        "/readyz": {
            "get": {"summary": "Every group has a leader and this node has caught up", "tags": ["operations"],
                    "responses": _ok("Ready.", obj(ok={"type": "boolean"}))}},
    }


def document(version: str, limits: Limits, tokens: bool) -> dict[str, Any]:
    """The document of a node, with tokens (`--tokens-file`) or open: a route that needs
    no token says `security: []`, the others the bearer scheme; an open node needs none."""
    paths = operations(limits)
    namespace = _param("X-Namespace", "header", NAMESPACE, "Namespace of the jobs, runs and queues the call is about.")
    for path, ops in paths.items():
        for method, op in ops.items():
            if path.startswith(("/v1/jobs", "/v1/runs", "/v1/tasks", "/v1/dead-letter", "/v1/queues/{")):
                op["parameters"] = [*op.get("parameters", []), namespace]
            if path in _TEXT_ANSWERS:
                op["responses"]["200"]["content"] = {_TEXT_ANSWERS[path]: {"schema": STR}}
            if tokens and auth.required_scopes(method.upper(), path) is None:
                op["security"] = []
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "schedulerd", "version": version,
                 "description": "Distributed job scheduler: jobs, runs, workers (long-poll leasing), operations."},
        "paths": paths}
    if tokens:
        doc["components"] = {"securitySchemes": {"bearer": {
            "type": "http", "scheme": "bearer", "description": "A token from `schedulerd token create`."}}}
        doc["security"] = [{"bearer": []}]
    return doc
