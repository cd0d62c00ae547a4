"""Stored records -> the JSON shapes of docs/api.md. Field names here are a
contract with clients and tests: keep them."""
from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from schedulerd.namespaces import outward, split
from schedulerd.storage.queries import TaskPart
from schedulerd.timefmt import to_iso
from schedulerd.units import US_PER_S

# A leased run as a poll answers it: its view, and its payload's stored JSON text.
TaskView = tuple[dict[str, Any], str]


def _seconds(us: int | None) -> float | int | None:
    if us is None:
        return None
    return us // US_PER_S if us % US_PER_S == 0 else us / US_PER_S


REDACTED = "(redacted)"


def job(rec: dict[str, Any], headers_shown: bool = True,
        last: tuple[dict[str, Any] | None, int | None] = (None, None)) -> dict[str, Any]:
    """headers_shown False: the values of the target's headers (credentials for the
    endpoint it calls, often) are replaced by REDACTED, for callers who may only read.
    `last`: the run of the job's latest occurrence due, and when its latest success
    finished (queries.last_runs)."""
    last_run, last_success_us = last
    # Built in its outward form at once (as `outward` would leave it): a batch create
    # answers with up to create_batch_max of these.
    namespace, job_id = split(rec["job_id"])
    view = {
        "job_id": job_id,
        "state": rec["state"],
        "schedule": rec["schedule_spec"],
        "queue": split(rec["queue"])[1],
        "payload": msgspec.Raw(rec["payload_json"]),  # stored as the JSON text it was sent as
        "max_attempts": rec["max_attempts"],
        "priority": rec["priority"],
        "misfire_policy": rec["misfire_policy"],
        "catchup_limit": rec["catchup_limit"],
        "starting_deadline_s": _seconds(rec["starting_deadline_us"]),
        "overlap_policy": rec["overlap_policy"],
        "backoff": rec["backoff"],
        "timeout_s": _seconds(rec["timeout_us"]),
        "jitter_s": _seconds(rec["jitter_us"]),
        "history_limit": rec["history_limit"],
        "finished_ttl_s": _seconds(rec.get("finished_ttl_us", 0)),
        "history_ttl_s": _seconds(rec.get("history_ttl_us", 0)),
        "keep_dead_letters": rec.get("keep_dead_letters", False),
        "target": _target(rec.get("target"), headers_shown),
        "idempotency_key": rec.get("idempotency_key"),
        "next_fire_time": to_iso(rec["next_fire_us"]),
        "last_run": None if last_run is None else {"run_id": last_run["run_id"],
                                                   "scheduled_time": to_iso(last_run["scheduled_us"]),
                                                   "state": last_run["state"]},
        "last_success_time": to_iso(last_success_us),
        "labels": rec.get("labels") or {},
        "description": rec.get("description"),
        "max_runs": rec.get("max_runs"),
        "runs_remaining": None if rec.get("max_runs") is None else max(0, rec["max_runs"] - rec.get("runs_made", 0)),
        "pause_on_failure": rec.get("pause_on_failure", False),
        "skip_calendar": rec.get("skip_calendar"),
        "pause_cause": _pause_cause(rec.get("pause_cause")),
        "created_at": to_iso(rec["created_us"]),
        "updated_at": to_iso(rec["updated_us"]),
        "namespace": namespace,
    }
    if "traceparent" in rec:  # only a job created with a trace context (W3C; schedulerd/tracing.py) has one
        view["traceparent"] = rec["traceparent"]
        if "tracestate" in rec:
            view["tracestate"] = rec["tracestate"]
    return view


def _pause_cause(cause: dict[str, Any] | None) -> dict[str, Any] | None:
    """Why a job paused itself (pause_on_failure): the run that was dead-lettered, and when."""
    if cause is None:
        return None
    return {"reason": "run_dead_lettered", "run_id": cause["run_id"], "time": to_iso(cause["at_us"])}


def _target(target: dict[str, Any] | None, headers_shown: bool) -> dict[str, Any] | None:
    if headers_shown or not target or not target.get("headers"):
        return target
    return dict(target, headers={name: REDACTED for name in target["headers"]})


def run(rec: dict[str, Any]) -> dict[str, Any]:
    return outward({
        "run_id": rec["run_id"],
        "job_id": rec["job_id"],
        "scheduled_time": to_iso(rec["scheduled_us"]),
        "state": rec["state"],
        "attempt": rec["attempt"],
        "max_attempts": rec["max_attempts"],
        "queue": rec["queue"],
        "priority": rec["priority"],
        "available_at": to_iso(rec["available_us"]),
        "worker_id": rec["worker_id"],
        "fence": rec["fence"],
        "lease_until": to_iso(rec["lease_until_us"]),
        "created_at": to_iso(rec["created_us"]),
        "finished_at": to_iso(rec["finished_us"]),
        "result": msgspec.Raw(rec["result_json"]) if rec["result_json"] is not None else None,
        "error": rec["error"],
        "reason": rec.get("reason"),
        "trigger": rec.get("trigger", False),
        "buffered": rec.get("buffered", False),
        **({"skipped_count": rec["skipped_count"], "skipped_until": to_iso(rec["skipped_until_us"])}
           if "skipped_until_us" in rec else {}),
    })


def task(rec: dict[str, Any], job: TaskPart | None) -> TaskView:
    """A leased run as its worker gets it, with its job's target, and its job's payload
    as the JSON text stored at create ("null" for a job no longer stored): `tasks_json`
    splices it into the response unparsed."""
    # Built in its outward form at once (as `outward` would leave it): a poll renders up
    # to lease_batch_max of these, and the copy outward makes was a third of the cost.
    namespace, job_id = split(rec["job_id"])
    scheduled_time = to_iso(rec["scheduled_us"])
    view: dict[str, Any] = {
        "run_id": rec["run_id"],
        "job_id": job_id,
        "queue": split(rec["queue"])[1],
        "scheduled_time": scheduled_time,
        "attempt": rec["attempt"],
        "fence": rec["fence"],
        "idempotency_key": f"{rec['job_id']}:{scheduled_time}",  # the same on every redelivery
        "lease_until": to_iso(rec["lease_until_us"]),
        "target": job.target if job is not None else None,
        "timeout_s": _seconds(rec.get("timeout_us")),
        "namespace": namespace,
    }
    if job is None:
        return view, "null"
    if job.traceparent is not None:  # only a job created with a trace context (the usual task sends none)
        view["traceparent"] = job.traceparent
        if job.tracestate is not None:
            view["tracestate"] = job.tracestate
    return view, job.payload_json


def tasks_json(tasks: list[TaskView], now_us: int) -> str:
    """A poll's response body, compact. Payloads go out as stored: a poll carries up to
    lease_batch_max of them, and parsing then re-encoding each cost the serving node
    CPU and, with json's default ", ", grew a payload of small numbers by half. `now`
    is the cluster's time that `lease_until` is on: a worker measures the lease from it,
    not from its own clock."""
    items = [_compact(view)[:-1] + ',"payload":' + payload + "}" for view, payload in tasks]
    return '{"now":"' + to_iso(now_us) + '","tasks":[' + ",".join(items) + "]}"


RETURN_MINIMAL = "return=minimal"


def prefers_minimal(request: web.Request) -> bool:
    """`Prefer: return=minimal` (RFC 7240): a batch create answers each job's outcome without
    its view. An importer of many jobs rarely reads them back, and rendering and sending
    ~580 bytes per job cost the serving node ~4 µs of CPU per job."""
    return any(part.split(";", 1)[0].strip().lower() == RETURN_MINIMAL
               for value in request.headers.getall("Prefer", ()) for part in value.split(","))


def respond(body: Any, status: int = 200) -> web.Response:
    """Every API answer: encoded by msgspec, ~11x faster than json.dumps for a batch
    create's job views, and the only encoder that
    writes a job's stored payload (`msgspec.Raw`) without parsing it first."""
    return web.Response(body=_COMPACT.encode(body), status=status, content_type="application/json")


# msgspec writes a task's fields ~13x faster than json.dumps (which builds an encoder per
# call when given separators); a poll encodes up to lease_batch_max of them.
_COMPACT = msgspec.json.Encoder()


def _compact(value: Any) -> str:
    return _COMPACT.encode(value).decode()
