"""An in-memory stand-in for a schedulerd cluster: just enough of docs/api.md to
test the client and the CLI, plus scripted faults (503, dropped connection,
hang) so failover and retry paths run without a real daemon.

Several `FakeServer`s can share one `FakeCluster`, the way real nodes share
their replicated state: a create applied through one is visible through all.
"""
from __future__ import annotations

import json
import re
import socket
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator
from urllib.parse import parse_qs, unquote, urlsplit

NOW = "2026-01-01T00:00:00Z"
LEASE_UNTIL = "2099-01-01T00:00:30Z"  # far ahead: the SDK drops tasks whose lease already ended
JOB_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
# Scheduling options a job accepts on create and PATCH (docs/api.md); stored as given.
OPTIONS = ("misfire_policy", "catchup_limit", "starting_deadline_s", "overlap_policy", "backoff",
           "timeout_s", "jitter_s", "history_limit", "finished_ttl_s", "history_ttl_s", "keep_dead_letters",
           "max_runs", "labels", "description", "skip_calendar")
PATCHABLE = {"schedule", "queue", "payload", "max_attempts", "priority", *OPTIONS}
PREVIEW_N_MAX = 100
# Faults a test can script for the next matching request.
UNAVAILABLE = "unavailable"  # 503 no leader; nothing applied
OUTCOME_UNKNOWN = "outcome_unknown"  # applied, then 503 outcome_unknown
DROP = "drop"  # applied, then the connection closes without an answer
HANG = "hang"  # applied, then no answer until the cluster stops
HTML_500 = "html_500"  # a proxy-style 500 with an HTML body; nothing applied
HANG_S_MAX = 10.0  # a hung handler gives up by itself even if a test forgets


class FakeError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class Seen:
    """One request as the fake received it."""

    port: int
    method: str
    path: str  # still percent-encoded, as sent
    query: dict[str, str]
    body: Any
    headers: dict[str, str]


@dataclass
class _Fault:
    method: str
    path: str
    kind: str
    port: int | None


@dataclass
class FakeCluster:
    """The replicated state plus the request log and pending faults; thread-safe."""

    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Idempotency-Key -> (the create body it came with, the job it made).
    idempotency: dict[str, tuple[Any, str]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    faults: list[_Fault] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: threading.Event = field(default_factory=threading.Event)
    nodes: list[dict[str, Any]] = field(default_factory=list)  # what /v1/cluster lists

    def fail_next(self, method: str, path: str, kind: str, *, port: int | None = None,
                  times: int = 1) -> None:
        """Answer the next `times` requests to `method path` (on `port`, if given) with `kind`."""
        with self.lock:
            self.faults.extend(_Fault(method, path, kind, port) for _ in range(times))

    def add_run(self, job_id: str, **fields: Any) -> dict[str, Any]:
        """Seed a run of an existing job, as the leader's due scan would."""
        with self.lock:
            return self.new_run(job_id, **fields)

    def new_run(self, job_id: str, **fields: Any) -> dict[str, Any]:
        """add_run for callers that hold the lock (the route handlers)."""
        job = self.jobs[job_id]
        run_id = f"0-{len(self.runs) + 1}-0"
        run = {"run_id": run_id, "job_id": job_id, "scheduled_time": NOW,
               "state": "queued", "attempt": 0, "queue": job["queue"],
               "priority": job["priority"], "available_at": NOW, "worker_id": None,
               "fence": 0, "lease_until": None, "created_at": NOW,
               "finished_at": None, "result": None, "error": None}
        run.update(fields)
        self.runs[run_id] = run
        return run

    def requests(self, method: str, path: str) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.method == method and s.path == path]

    def take_fault(self, method: str, path: str, port: int) -> str | None:
        for fault in self.faults:
            if fault.method == method and fault.path == path and fault.port in (None, port):
                self.faults.remove(fault)
                return fault.kind
        return None


def _page(items: list[dict[str, Any]], key: str, query: dict[str, str],
          name: str) -> dict[str, Any]:
    """Items after `cursor` (exclusive) in `key` order, `limit` of them."""
    limit = int(query.get("limit", "100"))
    if not 1 <= limit <= 1000:
        raise FakeError(400, "limit_exceeded", f"limit {limit}: allowed 1..1000")
    cursor = query.get("cursor")
    rest = [item for item in items if cursor is None or item[key] > cursor]
    page = rest[:limit]
    next_cursor = page[-1][key] if len(rest) > limit else None
    return {name: page, "next_cursor": next_cursor}


def _job(cluster: FakeCluster, job_id: str) -> dict[str, Any]:
    if job_id not in cluster.jobs:
        raise FakeError(404, "not_found", f"no job {job_id!r}")
    return cluster.jobs[job_id]


def _run(cluster: FakeCluster, run_id: str) -> dict[str, Any]:
    if run_id not in cluster.runs:
        raise FakeError(404, "not_found", f"no run {run_id!r}")
    return cluster.runs[run_id]


def create_job(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
               body: Any, key: str | None = None) -> tuple[int, Any]:
    if not isinstance(body, dict):
        raise FakeError(400, "invalid_request", "body must be a JSON object")
    key = key or body.get("idempotency_key")
    if key is not None and key in cluster.idempotency:
        first_body, first_job = cluster.idempotency[key]
        if first_body != body:
            raise FakeError(409, "conflict", f"idempotency key {key!r} was used for another job")
        return 200, cluster.jobs[first_job]
    job_id = body.get("job_id") or uuid.uuid4().hex
    if not JOB_ID.fullmatch(job_id):
        raise FakeError(400, "invalid_job", f"job_id {job_id!r}: allowed [A-Za-z0-9_.-]{{1,128}}")
    schedule = body.get("schedule")
    if not isinstance(schedule, dict) or len(set(schedule) & {"at", "cron", "every"}) != 1:
        raise FakeError(400, "invalid_job", "schedule: give exactly one of at, cron, every")
    if job_id in cluster.jobs:
        raise FakeError(409, "conflict", f"job {job_id!r} exists")
    job = {"job_id": job_id, "state": "scheduled", "schedule": schedule,
           "queue": body.get("queue", "default"), "payload": body.get("payload"),
           "max_attempts": body.get("max_attempts", 3), "priority": body.get("priority", 0),
           "next_fire_time": schedule.get("at", NOW), "created_at": NOW, "updated_at": NOW,
           **{name: body[name] for name in OPTIONS if name in body}}
    cluster.jobs[job_id] = job
    if key is not None:
        cluster.idempotency[key] = (body, job_id)
    return 201, job


def list_jobs(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
              body: Any) -> tuple[int, Any]:
    jobs = [job for _, job in sorted(cluster.jobs.items())
            if query.get("state") in (None, job["state"])
            and query.get("queue") in (None, job["queue"])]
    return 200, _page(jobs, "job_id", query, "jobs")


def get_job(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
            body: Any) -> tuple[int, Any]:
    return 200, _job(cluster, params["job_id"])


def cancel_job(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
               body: Any) -> tuple[int, Any]:
    job = _job(cluster, params["job_id"])
    if job["state"] == "completed":
        raise FakeError(409, "conflict", f"job {job['job_id']!r} is completed")
    job.update(state="cancelled", next_fire_time=None)
    return 200, job


def update_job(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
               body: Any) -> tuple[int, Any]:
    job = _job(cluster, params["job_id"])
    unknown = sorted(set(body) - PATCHABLE)
    if unknown:
        raise FakeError(400, "invalid_job", f"unknown field(s) in job: {', '.join(unknown)}")
    if job["state"] == "cancelled":
        raise FakeError(409, "conflict", f"job {job['job_id']!r} is cancelled")
    job.update(body, updated_at=NOW)
    return 200, job


def job_action(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
               body: Any) -> tuple[int, Any]:
    """pause | resume | trigger, with the state rules of docs/api.md."""
    job, action = _job(cluster, params["job_id"]), params["action"]
    refused = {"cancelled"} if action == "trigger" else {"cancelled", "completed"}
    if job["state"] in refused:
        raise FakeError(409, "conflict", f"job {job['job_id']!r} is {job['state']}")
    if action == "trigger":
        return 201, {"run": cluster.new_run(job["job_id"], trigger=True)}
    if action == "pause":
        job.update(state="paused", next_fire_time=None, updated_at=NOW)
    else:
        job.update(state="scheduled", next_fire_time=NOW, updated_at=NOW)
    return 200, job


def dead_letters(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
                 body: Any) -> tuple[int, Any]:
    runs = [run for run in cluster.runs.values() if run["state"] == "dead_letter"
            and query.get("queue") in (None, run["queue"])]
    return 200, _page(runs, "run_id", query, "runs")


def retry_run(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
              body: Any) -> tuple[int, Any]:
    run = _run(cluster, params["run_id"])
    if run["state"] != "dead_letter":
        raise FakeError(409, "conflict", f"run {run['run_id']!r} is {run['state']}, not dead_letter")
    run.update(state="queued", available_at=NOW, worker_id=None, lease_until=None,
               finished_at=None)
    return 200, {"run": run}


def preview(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
            body: Any) -> tuple[int, Any]:
    """Not the real cron math: n minutes after NOW, enough to check what is sent and shown."""
    if ("cron" in query) == ("every" in query):
        raise FakeError(400, "invalid_job", "give exactly one of cron=EXPR or every=DURATION")
    n = int(query.get("n", "10"))
    if n > PREVIEW_N_MAX:
        raise FakeError(400, "limit_exceeded", f"n={n} is over preview_n_max ({PREVIEW_N_MAX})")
    doc: dict[str, Any] = {"fire_times": [f"2026-01-01T00:{minute:02d}:00Z" for minute in range(1, n + 1)]}
    if query.get("timezone") == "EST":
        doc["warnings"] = ["timezone 'EST' is a fixed offset"]
    return 200, doc


def job_preview(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
                body: Any) -> tuple[int, Any]:
    job = _job(cluster, params["job_id"])
    n = int(query.get("n", "10"))
    return 200, {"job_id": job["job_id"], "state": job["state"], "occurrences": [
        {"scheduled_time": f"2026-01-01T00:{minute:02d}:00Z", "start_time": f"2026-01-01T00:{minute:02d}:07Z"}
        for minute in range(1, n + 1)]}


def job_runs(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
             body: Any) -> tuple[int, Any]:
    job_id = _job(cluster, params["job_id"])["job_id"]
    runs = [run for run in cluster.runs.values() if run["job_id"] == job_id]
    return 200, _page(runs, "run_id", query, "runs")


def list_runs(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
              body: Any) -> tuple[int, Any]:
    runs = [run for run in cluster.runs.values() if run["state"] == query["state"]
            and query.get("queue") in (None, run.get("queue"))]
    return 200, _page(runs, "run_id", query, "runs")


def get_run(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
            body: Any) -> tuple[int, Any]:
    return 200, _run(cluster, params["run_id"])


def poll(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
         body: Any) -> tuple[int, Any]:
    ready = [run for run in cluster.runs.values()
             if run["state"] == "queued" and run["queue"] in body["queues"]]
    tasks = []
    for run in ready[: body["max_tasks"]]:
        run.update(state="running", attempt=run["attempt"] + 1, fence=run["fence"] + 1,
                   worker_id=body["worker_id"], lease_until=LEASE_UNTIL)
        job = cluster.jobs[run["job_id"]]
        tasks.append({**{k: run[k] for k in ("run_id", "job_id", "queue", "scheduled_time",
                                              "attempt", "fence", "lease_until")},
                      "idempotency_key": f"{run['job_id']}:{run['scheduled_time']}",
                      "payload": job["payload"]})
    return 200, {"tasks": tasks}


def task_op(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
            body: Any) -> tuple[int, Any]:
    run = _run(cluster, params["run_id"])
    if (run["state"], run["worker_id"], run["fence"]) != ("running", body["worker_id"],
                                                         body["fence"]):
        raise FakeError(409, "stale_fence", f"run {run['run_id']!r}: lease not held")
    verb = params["verb"]
    if verb == "heartbeat":
        return 200, {"lease_until": LEASE_UNTIL}
    if verb == "ack":
        run.update(state="succeeded", finished_at=NOW, result=body.get("result"))
    else:
        run.update(state="retry_wait", error=body["error"])
    return 200, {"run": run}


def _task_batch(cluster: FakeCluster, query: dict[str, str], body: Any, verb: str,
                field: str) -> tuple[int, Any]:
    results = []
    for item in body[field]:
        try:
            task_op(cluster, {"run_id": item["run_id"], "verb": verb}, query,
                    {"worker_id": body["worker_id"], "fence": item["fence"], "result": item.get("result")})
        except FakeError as exc:
            results.append({"run_id": item["run_id"], "ok": False,
                            "error": {"code": exc.code, "message": exc.message}})
        else:
            results.append({"run_id": item["run_id"], "ok": True, "lease_until": LEASE_UNTIL}
                           if verb == "heartbeat" else {"run_id": item["run_id"], "ok": True})
    return 200, {"results": results}


def heartbeat_batch(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
                    body: Any) -> tuple[int, Any]:
    return _task_batch(cluster, query, body, "heartbeat", "leases")


def ack_batch(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
              body: Any) -> tuple[int, Any]:
    return _task_batch(cluster, query, body, "ack", "acks")


def cluster_info(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
                 body: Any) -> tuple[int, Any]:
    groups = [{"group": g, "leader": "127.0.0.1:9080", "is_leader": True, "term": 3 + g,
               "commit_index": 120 + g, "last_applied": 120 + g, "ready": True,
               "peers": [], "entry_version": 6, "entry_version_newest": 6 + g} for g in range(2)]
    return 200, {"node": "127.0.0.1:9080", "groups": groups, "nodes": cluster.nodes}


def bulk_action(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
                body: Any) -> tuple[int, Any]:
    """Not the real selectors: team=X picks the jobs labelled so; enough to check what is sent and shown."""
    key, _, value = body["selector"].partition("=")
    matched = [j for j in cluster.jobs.values() if (j.get("labels") or {}).get(key) == value]
    target = {"pause": "paused", "resume": "scheduled", "cancel": "cancelled"}[params["action"]]
    changed = [j for j in matched if j["state"] != target]
    for job in changed:
        job["state"] = target
    return 200, {"action": params["action"], "selector": body["selector"], "matched": len(matched),
                 "changed": len(changed)}


def health(cluster: FakeCluster, params: dict[str, str], query: dict[str, str],
           body: Any) -> tuple[int, Any]:
    return 200, {"ok": True}


Handler = Callable[[FakeCluster, dict[str, str], dict[str, str], Any], tuple[int, Any]]
ROUTES: list[tuple[str, re.Pattern[str], Handler]] = [
    (method, re.compile(pattern), handler) for method, pattern, handler in [
        ("POST", r"/v1/jobs", create_job),
        ("POST", r"/v1/jobs:(?P<action>pause|resume|cancel)", bulk_action),
        ("GET", r"/v1/jobs", list_jobs),
        ("GET", r"/v1/jobs/(?P<job_id>[^/]+)", get_job),
        ("DELETE", r"/v1/jobs/(?P<job_id>[^/]+)", cancel_job),
        ("PATCH", r"/v1/jobs/(?P<job_id>[^/]+)", update_job),
        ("POST", r"/v1/jobs/(?P<job_id>[^/]+)/(?P<action>pause|resume|trigger)", job_action),
        ("GET", r"/v1/dead-letter", dead_letters),
        ("POST", r"/v1/runs/(?P<run_id>[^/]+)/retry", retry_run),
        ("GET", r"/v1/preview", preview),
        ("GET", r"/v1/jobs/(?P<job_id>[^/]+)/preview", job_preview),
        ("POST", r"/v1/tasks/heartbeat", heartbeat_batch),
        ("POST", r"/v1/tasks/ack", ack_batch),
        ("GET", r"/v1/jobs/(?P<job_id>[^/]+)/runs", job_runs),
        ("GET", r"/v1/runs", list_runs),
        ("GET", r"/v1/runs/(?P<run_id>[^/]+)", get_run),
        ("POST", r"/v1/tasks/poll", poll),
        ("POST", r"/v1/tasks/(?P<run_id>[^/]+)/(?P<verb>heartbeat|ack|nack)", task_op),
        ("GET", r"/v1/cluster", cluster_info),
        ("GET", r"/healthz", health),
    ]
]


def _route(cluster: FakeCluster, method: str, path: str, query: dict[str, str],
           body: Any, headers: dict[str, str]) -> tuple[int, Any]:
    for route_method, pattern, handler in ROUTES:
        match = pattern.fullmatch(path)
        if match and route_method == method:
            params = {k: unquote(v) for k, v in match.groupdict().items()}
            if handler is create_job:
                return create_job(cluster, params, query, body, headers.get("Idempotency-Key"))
            return handler(cluster, params, query, body)
    raise FakeError(404, "not_found", f"no route {method} {path}")


class _RequestHandler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep pytest output for failures that matter

    def _handle(self, method: str) -> None:
        cluster, port = self.server.cluster, self.server.server_address[1]
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = json.loads(raw) if raw else None
        with cluster.lock:
            cluster.seen.append(Seen(port, method, parts.path, query, body, dict(self.headers)))
            fault = cluster.take_fault(method, parts.path, port)
            if fault == UNAVAILABLE:
                status, doc = 503, _error_doc("unavailable", "no leader for group 0")
            elif fault == HTML_500:
                self._send(500, b"<html><body>Internal Server Error</body></html>", "text/html")
                return
            else:
                try:
                    status, doc = _route(cluster, method, parts.path, query, body,
                                         dict(self.headers))
                except FakeError as exc:
                    status, doc = exc.status, _error_doc(exc.code, exc.message)
        if parts.path == "/v1/tasks/poll" and status == 200 and not doc["tasks"]:
            # Long-poll: an empty answer comes only after wait_s, as the daemon's does.
            cluster.stopped.wait(min(body["wait_s"], HANG_S_MAX))
        if fault in (DROP, HANG):
            if fault == HANG:
                cluster.stopped.wait(HANG_S_MAX)
            self.close_connection = True
            return
        if fault == OUTCOME_UNKNOWN:
            status, doc = 503, _error_doc("outcome_unknown", "timed out waiting for commit")
        self._send(status, json.dumps(doc).encode(), "application/json")

    def _send(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        if status == 503:
            self.send_header("Retry-After", "0")
        self.end_headers()
        self.wfile.write(payload)


def _error_doc(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


class _HTTPServer(ThreadingHTTPServer):
    # Hung handlers must not hold up teardown; they end when `stopped` is set.
    block_on_close = False

    def __init__(self, cluster: FakeCluster) -> None:
        super().__init__(("127.0.0.1", 0), _RequestHandler)
        self.cluster = cluster


class FakeServer:
    """One fake node on a free 127.0.0.1 port; listening as soon as it is built."""

    def __init__(self, cluster: FakeCluster) -> None:
        self._httpd = _HTTPServer(cluster)
        self.port: int = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # A short poll interval keeps shutdown() from adding 0.5 s per server.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


@contextmanager
def fake_cluster(nodes: int = 1) -> Iterator[tuple[FakeCluster, list[FakeServer]]]:
    """A fake cluster of `nodes` servers sharing one state, stopped on exit."""
    cluster = FakeCluster()
    servers = [FakeServer(cluster) for _ in range(nodes)]
    try:
        yield cluster, servers
    finally:
        cluster.stopped.set()
        for server in servers:
            server.stop()


def closed_port_url() -> str:
    """A URL where nothing listens: the port was free a moment ago and is closed now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
