"""Synchronous HTTP client of the schedulerd API (docs/api.md).

Stdlib only (`http.client`), so `schedctl` starts in milliseconds and a worker
process pulls in nothing it does not need. Every method returns the server's
JSON document unchanged and raises the typed errors of `schedulerd.errors`:
the same classes the server raised, rebuilt with `from_wire`.
"""
from __future__ import annotations

import http.client
import json
import ssl
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence
from urllib.parse import quote, urlencode, urlsplit

from schedulerd.errors import Conflict, OutcomeUnknown, SchedulerError, Unavailable
from schedulerd.sdk import wire

# A live node accepts a TCP connection in milliseconds; one that takes longer
# is down or blackholed, and waiting for it would eat the time meant for failover.
CONNECT_S_MAX = 2.0
# One server may use at most this share of the deadline, so a frozen node
# (accepts, never answers) still leaves time to try another.
ATTEMPT_SHARE = 0.5
# A long-poll legitimately stays silent for wait_s; this is the slack on top.
POLL_MARGIN_S = 5.0
# A 503's Retry-After is honoured, but never beyond this: an election takes
# about a second, and the caller's deadline matters more than the hint.
RETRY_AFTER_S_MAX = 2.0
USER_AGENT = "schedulerd-client/0.1"


@dataclass(frozen=True)
class _Server:
    url: str  # as given, without a trailing slash: used in messages
    https: bool
    host: str
    port: int | None
    prefix: str  # path before /v1, e.g. behind a reverse proxy


@dataclass(frozen=True)
class _Response:
    status: int
    body: bytes
    retry_after_s: float


class _TransportError(Exception):
    """No HTTP answer from one server: refused, reset, timed out or cut off.

    `ambiguous` is true when the request may have reached the server, i.e. the
    connection was up: a write may then have been applied without our knowing."""

    def __init__(self, reason: str, ambiguous: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.ambiguous = ambiguous


def _parse_servers(servers: Sequence[str] | str) -> list[_Server]:
    urls = servers.split(",") if isinstance(servers, str) else list(servers)
    parsed = [_parse_server(url.strip()) for url in urls if url.strip()]
    if not parsed:
        raise ValueError("no server URL given")
    return parsed


def _parse_server(url: str) -> _Server:
    # A bare host:port is the common typo; http is the daemon's default scheme.
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"bad server URL {url!r}: expected http(s)://HOST:PORT")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"bad server URL {url!r}: {exc}") from None
    return _Server(
        url=url.rstrip("/"),
        https=parts.scheme == "https",
        host=parts.hostname,
        port=port,
        prefix=parts.path.rstrip("/"),
    )


def _parse_member(url: str) -> _Server | None:
    """A learned member's URL, or None for an address no client could dial."""
    try:
        return _parse_server(url)
    except ValueError:
        return None


def _decode(response: _Response) -> Any:
    """The JSON document of a non-503 answer, or the typed error it carries."""
    status, body = response.status, response.body
    if 200 <= status < 300:
        try:
            return json.loads(body)
        except ValueError:
            raise SchedulerError(f"HTTP {status}: not JSON: {wire.short_text(body)}") from None
    raise wire.error_from(status, body)


def _retry_after_s(value: str | None) -> float:
    # Only the delta-seconds form: the daemon never sends an HTTP date.
    try:
        return max(0.0, float(value)) if value is not None else 0.0
    except ValueError:
        return 0.0


def _trace_headers(traceparent: str | None, tracestate: str | None) -> dict[str, str]:
    return {name: value for name, value in (("traceparent", traceparent), ("tracestate", tracestate))
            if value is not None}


def _maybe_applied(failures: Sequence[Exception]) -> bool:
    return any(
        isinstance(f, OutcomeUnknown) or (isinstance(f, _TransportError) and f.ambiguous)
        for f in failures
    )


class Client:
    """A client of one schedulerd cluster, given as one or more base URLs.

    Each call fails over: servers are tried in order starting with the last
    one that answered; a refused or dropped connection, a timeout or a 503
    moves on to the next; after a full round the client backs off (honouring
    `Retry-After`, capped) and goes round again until `timeout_s` has passed
    since the call began. Then it raises `Unavailable` naming what each server
    did last: "no server reachable: ..." when none answered, "the cluster could
    not serve this: ..." when some answered 503 (no leader, no quorum).
    A server that fails sends the client to the cluster's member list: the
    nodes `/v1/cluster` lists as serving are tried after the servers given
    (read at most every wire.MEMBERS_EVERY_S), so one URL of a cluster whose
    nodes come and go keeps working while any node it lists answers.
    A 4xx raises the typed error the server sent; any other unexpected
    answer (5xx, non-JSON) raises `SchedulerError` with the status.
    """

    def __init__(
        self,
        servers: Sequence[str] | str,
        timeout_s: float = 10.0,
        token: str | None = None,
        ca_file: str | None = None,
        namespace: str | None = None,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self._given = _parse_servers(servers)
        self._servers = list(self._given)  # the given servers, then the members learned
        self._members_read_at: float | None = None
        self.timeout_s = timeout_s
        self._token = token
        self._namespace = namespace  # sent as X-Namespace: jobs, runs and queues live in one
        # https servers are verified against the system CAs, or against ca_file's.
        self._tls = ssl.create_default_context(cafile=ca_file)
        self._preferred = 0  # index of the last server that answered

    # -- jobs ---------------------------------------------------------------

    def create_job(self, spec: Mapping[str, Any], *, traceparent: str | None = None,
                   tracestate: str | None = None) -> dict[str, Any]:
        """Create a job from `spec` (the body of `POST /v1/jobs`); returns the job.
        `traceparent` and `tracestate` (W3C Trace Context) are sent as those headers: the job
        keeps them and each of its tasks carries them (an invalid one is ignored, not refused).

        Safe to retry. Without a `job_id` in `spec` the client generates one
        (`uuid4().hex`) before the first attempt, so every attempt proposes the
        same job. If an attempt may have landed (connection cut or timed out
        after sending, or 503 `outcome_unknown`) and a later attempt gets 409
        `conflict`, the first attempt did create the job: the client fetches
        and returns it. The flip side: a job created by someone else under the
        same caller-chosen id in that window is returned as if it were ours.
        When the call gives up after such an ambiguous attempt it raises
        `OutcomeUnknown` naming the job_id to retry with.

        With an `idempotency_key` in `spec` the server does the deduplication:
        the key is also sent as the `Idempotency-Key` header (the body keeps
        it), a repeat answers 200 with the original job, and no job_id is
        generated, so a later call with the same key and spec, from any
        process, has the same body and gets the same job back.
        """
        body = dict(spec)
        key = body.get("idempotency_key")
        if not body.get("job_id") and key is None:
            body["job_id"] = uuid.uuid4().hex
        job_id = body.get("job_id")
        headers = {**({"Idempotency-Key": str(key)} if key is not None else {}),
                   **_trace_headers(traceparent, tracestate)}
        failures: list[Exception] = []
        try:
            return self._request("POST", "/v1/jobs", body, failures=failures, headers=headers or None)
        except Conflict:
            # With a key our own landed attempt would have answered 200: a 409 is real.
            if key is not None or not _maybe_applied(failures):
                raise
            return self.get_job(str(job_id))
        except Unavailable as exc:
            if not _maybe_applied(failures):
                raise
            what = (f"job {job_id!r} may have been created: retry with this job_id"
                    if key is None else
                    f"the job with idempotency_key {key!r} may have been created: retry with this key")
            raise OutcomeUnknown(f"{exc.message}; {what}") from exc

    def create_jobs(self, specs: Sequence[Mapping[str, Any]], *, minimal: bool = False,
                    traceparent: str | None = None, tracestate: str | None = None) -> list[dict[str, Any]]:
        """Create up to the server's create_batch_max jobs in one entry (`POST /v1/jobs:batch`);
        one result per spec, in order: `{"job_id", "ok", "job"}` or `{"job_id", "ok": false, "error"}`.
        With `minimal`, created jobs come back as `{"job_id", "ok": true}` alone
        (`Prefer: return=minimal`), lighter for the server and the wire in a bulk import.
        `traceparent` and `tracestate` are each job's, as for `create_job`.

        Specs without job_id or idempotency_key get a generated job_id first, so a
        retried request proposes the same jobs; a job an ambiguous earlier attempt
        created then answers `conflict`, and is reported as created (fetched, unless minimal)."""
        bodies = [dict(spec) if spec.get("job_id") or spec.get("idempotency_key") is not None
                  else dict(spec, job_id=uuid.uuid4().hex) for spec in specs]
        failures: list[Exception] = []
        headers = {**({"Prefer": "return=minimal"} if minimal else {}), **_trace_headers(traceparent, tracestate)}
        results = self._request("POST", "/v1/jobs:batch", {"jobs": bodies}, failures=failures,
                                headers=headers or None)["results"]
        if _maybe_applied(failures):
            for i, r in enumerate(results):
                error = r.get("error") or {}
                if not r["ok"] and error.get("code") == Conflict.code and "idempotency_key" not in bodies[i]:
                    results[i] = {"job_id": r["job_id"], "ok": True}
                    if not minimal:
                        results[i]["job"] = self.get_job(r["job_id"])
        return results

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/jobs/{_part(job_id)}")

    def list_jobs(
        self,
        state: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        selector: str | None = None,
    ) -> dict[str, Any]:
        """One page: `{"jobs": [...], "next_cursor": "...|null"}`, ordered by job_id; with
        `selector`, only the jobs whose labels it selects (e.g. "team=billing,env!=prod")."""
        query = {"state": state, "queue": queue, "limit": limit, "cursor": cursor, "selector": selector}
        return self._request("GET", "/v1/jobs", query=query)

    def iter_jobs(
        self,
        state: str | None = None,
        queue: str | None = None,
        page_size: int = 100,
        selector: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Every matching job, fetching pages of `page_size` as it goes."""
        cursor: str | None = None
        while True:
            page = self.list_jobs(state=state, queue=queue, limit=page_size, cursor=cursor, selector=selector)
            yield from page["jobs"]
            next_cursor = page.get("next_cursor")
            if next_cursor is None:
                return
            # A server that hands back the cursor it was given would loop us forever.
            if next_cursor == cursor:
                raise SchedulerError(f"server returned the same cursor twice: {cursor!r}")
            cursor = next_cursor

    def cancel_job(self, job_id: str, purge: bool = False) -> dict[str, Any]:
        """Cancel a job (returns it); with purge, then delete it and its runs: returns
        `{"job_id", "purged": true, "deleted_runs"}`, and the id may be created again."""
        query = {"purge": "true"} if purge else None
        return self._request("DELETE", f"/v1/jobs/{_part(job_id)}", query=query)

    def discard_run(self, run_id: str) -> dict[str, Any]:
        """Delete a dead letter: `{"run_id", "discarded": true, "run": run}` (the run as it was)."""
        return self._request("DELETE", f"/v1/runs/{_part(run_id)}")

    def update_job(self, job_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """PATCH the fields in `changes` (any subset of a job's fields); returns the job.

        Retried like any call: applying the same changes twice leaves the same job."""
        return self._request("PATCH", f"/v1/jobs/{_part(job_id)}", dict(changes))

    def pause_job(self, job_id: str) -> dict[str, Any]:
        """No new occurrences until resumed; returns the job. Idempotent."""
        return self._request("POST", f"/v1/jobs/{_part(job_id)}/pause", {})

    def resume_job(self, job_id: str) -> dict[str, Any]:
        """Re-arm a paused job from now; returns the job. Idempotent."""
        return self._request("POST", f"/v1/jobs/{_part(job_id)}/resume", {})

    def list_runs(self, state: str, queue: str | None = None, limit: int = 100,
                  cursor: str | None = None) -> dict[str, Any]:
        """One page of the runs in `state` across every job, in run id order:
        `{"runs": [...], "next_cursor": "...|null"}`."""
        query = {"state": state, "queue": queue, "limit": limit, "cursor": cursor}
        return self._request("GET", "/v1/runs", query=query)

    def act_on_jobs(self, action: str, selector: str) -> dict[str, Any]:
        """Pause, resume or cancel ("pause" | "resume" | "cancel") every job whose labels the
        selector selects: `{"action", "selector", "matched", "changed"}`. Not retried once a
        request may have reached a server (a retry of an applied share would count nothing)."""
        return self._request("POST", f"/v1/jobs:{action}", {"selector": selector}, retry_ambiguous=False)

    def trigger_job(self, job_id: str) -> dict[str, Any]:
        """Run the job once more, now: `{"run": run}`.

        Not idempotent (each trigger is its own occurrence), so it is retried only
        while no attempt can have reached a server. After one that may have (cut
        or timed-out connection, 503 `outcome_unknown`) it raises `OutcomeUnknown`
        rather than risk a second run."""
        try:
            return self._request("POST", f"/v1/jobs/{_part(job_id)}/trigger", {},
                                 retry_ambiguous=False)
        except OutcomeUnknown as exc:
            raise OutcomeUnknown(f"{exc.message}; job {job_id!r} may have been triggered: "
                                 "look at its runs before triggering again") from exc

    def job_runs(
        self, job_id: str, limit: int = 100, cursor: str | None = None
    ) -> dict[str, Any]:
        """One page of runs, oldest first: `{"runs": [...], "next_cursor": ...}`."""
        query = {"limit": limit, "cursor": cursor}
        return self._request("GET", f"/v1/jobs/{_part(job_id)}/runs", query=query)

    def get_run(self, run_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/runs/{_part(run_id)}")

    def dead_letters(
        self, queue: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> dict[str, Any]:
        """One page of dead-lettered runs, oldest first: `{"runs": [...], "next_cursor": ...}`."""
        query = {"queue": queue, "limit": limit, "cursor": cursor}
        return self._request("GET", "/v1/dead-letter", query=query)

    def retry_run(self, run_id: str) -> dict[str, Any]:
        """Re-drive a dead letter: `{"run": run}`, queued with a fresh set of attempts.

        If an attempt may have landed and a later one gets 409 `conflict` (the run
        is no longer a dead letter), the first re-drove it: the run is fetched and
        returned, as create_job does with its job."""
        failures: list[Exception] = []
        try:
            return self._request("POST", f"/v1/runs/{_part(run_id)}/retry", {},
                                 failures=failures)
        except Conflict:
            if not _maybe_applied(failures):
                raise
            return {"run": self.get_run(run_id)}

    def backfill(self, job_id: str, start: str, end: str, *, dry_run: bool = False,
                 overlap_policy: str | None = None) -> dict[str, Any]:
        """Run each past occurrence of the job's schedule in [start, end) that has no run yet
        (ISO 8601 instants); dry_run lists them and changes nothing. A repeat makes nothing twice."""
        body: dict[str, Any] = {"start": start, "end": end, "dry_run": dry_run}
        if overlap_policy is not None:
            body["overlap_policy"] = overlap_policy
        return self._request("POST", f"/v1/jobs/{_part(job_id)}/backfill", body)

    def cancel_run(self, run_id: str) -> dict[str, Any]:
        """Cancel one queued, waiting or running run: `{"run": run}`. A repeat of a cancel
        that landed is answered as the first was."""
        return self._request("POST", f"/v1/runs/{_part(run_id)}/cancel", {})

    def preview(
        self,
        cron: str | None = None,
        timezone: str | None = None,
        every: str | None = None,
        n: int = 10,
        after: str | None = None,
    ) -> dict[str, Any]:
        """The next `n` fire times of a cron (in `timezone`) or every schedule, from
        the server's now or after the ISO 8601 instant `after`: `{"fire_times": [...]}`
        (and `warnings`, for a zone that deserves one). Creates nothing."""
        query = {"cron": cron, "timezone": timezone, "every": every, "n": n, "from": after}
        return self._request("GET", "/v1/preview", query=query)

    def preview_job(self, job_id: str, n: int = 10) -> dict[str, Any]:
        """An existing job's next `n` occurrences, each with the time its run becomes
        available (jitter applied): `{"job_id", "state", "occurrences": [...]}`."""
        return self._request("GET", f"/v1/jobs/{_part(job_id)}/preview", query={"n": n})

    def explain_occurrence(self, job_id: str, time: str) -> dict[str, Any]:
        """Why the job did or did not run at `time` (an ISO 8601 instant with Z or an offset):
        `{"job_id", "time", "verdict", "explanation", ...facts}`, read from the records."""
        return self._request("GET", f"/v1/jobs/{_part(job_id)}/occurrences/{_part(time)}")

    def cluster(self) -> dict[str, Any]:
        return self._request("GET", "/v1/cluster")

    def remove_node(self, node_id: str) -> dict[str, Any]:
        """Start draining a node out of the cluster (admin scope): `{"node_id", "state"}`."""
        return self._request("DELETE", f"/v1/cluster/nodes/{quote(node_id, safe='')}")

    def audit(self, limit: int = 100, cursor: str | None = None) -> dict[str, Any]:
        """One page of the audit log, newest first (admin scope): `{"records": [...], "next_cursor"}`."""
        return self._request("GET", "/v1/audit", query={"limit": limit, "cursor": cursor})

    def queues(self) -> dict[str, Any]:
        """Per queue: ready now, waiting for later, the oldest ready run's age, running now and
        its limits (`GET /v1/queues`)."""
        return self._request("GET", "/v1/queues")

    def get_queue(self, queue: str) -> dict[str, Any]:
        """One queue of the client's namespace: its limits, each group's share of them, and what
        waits and runs (`GET /v1/queues/{name}`)."""
        return self._request("GET", f"/v1/queues/{_part(queue)}")

    def set_queue_limits(self, queue: str, max_running: int | None = None,
                         max_starts_per_s: float | None = None) -> dict[str, Any]:
        """Set a queue's limits, cluster-wide; None lifts that limit (`PUT /v1/queues/{name}`).
        Returns the queue as `get_queue` does."""
        return self._request("PUT", f"/v1/queues/{_part(queue)}",
                             {"max_running": max_running, "max_starts_per_s": max_starts_per_s})

    def set_calendar(self, name: str, dates: Sequence[Any], timezone: str = "UTC") -> dict[str, Any]:
        """Create or replace a holiday calendar: `dates` holds "YYYY-MM-DD" days and
        {"from": day, "to": day} ranges, in `timezone`. Returns it as stored (merged ranges)."""
        return self._request("PUT", f"/v1/calendars/{_part(name)}", {"timezone": timezone, "dates": list(dates)})

    def get_calendar(self, name: str) -> dict[str, Any]:
        """One calendar, with `used_by`: some of the jobs that name it."""
        return self._request("GET", f"/v1/calendars/{_part(name)}")

    def list_calendars(self) -> dict[str, Any]:
        """Every calendar: `{"calendars": [...]}`."""
        return self._request("GET", "/v1/calendars")

    def delete_calendar(self, name: str) -> dict[str, Any]:
        """Delete a calendar; a Conflict while a scheduled or paused job names it."""
        return self._request("DELETE", f"/v1/calendars/{_part(name)}")

    def metrics(self) -> str:
        """The Prometheus text of the node that answers (`GET /metrics`)."""
        return self._request("GET", "/metrics", text=True)

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/healthz")

    # -- tasks (workers) ----------------------------------------------------

    def poll(
        self,
        worker_id: str,
        queues: Sequence[str] | str,
        max_tasks: int = 1,
        wait_s: float = 0,
    ) -> dict[str, Any]:
        """Lease up to `max_tasks` due runs; waits up to `wait_s` for one: `{"tasks": [...]}`."""
        # A bare string would otherwise be sent as a list of one-letter queues.
        queue_list = [queues] if isinstance(queues, str) else list(queues)
        body = {"worker_id": worker_id, "queues": queue_list,
                "max_tasks": max_tasks, "wait_s": wait_s}
        return self._request("POST", "/v1/tasks/poll", body, wait_s=wait_s)

    def heartbeat(self, run_id: str, worker_id: str, fence: int) -> dict[str, Any]:
        body = {"worker_id": worker_id, "fence": fence}
        return self._request("POST", f"/v1/tasks/{_part(run_id)}/heartbeat", body)

    def ack(
        self, run_id: str, worker_id: str, fence: int, result: Any = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"worker_id": worker_id, "fence": fence}
        if result is not None:
            body["result"] = result
        return self._request("POST", f"/v1/tasks/{_part(run_id)}/ack", body)

    def nack(self, run_id: str, worker_id: str, fence: int, error: str) -> dict[str, Any]:
        body = {"worker_id": worker_id, "fence": fence, "error": error}
        return self._request("POST", f"/v1/tasks/{_part(run_id)}/nack", body)

    # -- transport ----------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, Any] | None = None,
        wait_s: float = 0,
        failures: list[Exception] | None = None,
        headers: Mapping[str, str] | None = None,
        retry_ambiguous: bool = True,
        text: bool = False,
    ) -> Any:
        """Send one request with failover and backoff (see the class docstring).

        `wait_s` is how long the server may legitimately hold the request (long
        poll): it extends both the deadline and each attempt's read timeout.
        Every retried failure is appended to `failures` when given. With
        `retry_ambiguous` false, a failure after which the request may have been
        applied raises `OutcomeUnknown` at once instead of being retried."""
        params = {k: v for k, v in (query or {}).items() if v is not None}
        target = f"{path}?{urlencode(params)}" if params else path
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        attempt_s = wait_s + POLL_MARGIN_S if wait_s else self.timeout_s * ATTEMPT_SHARE
        deadline = time.monotonic() + self.timeout_s + wait_s
        outcomes: dict[str, str] = {}  # each server's last failure, for the error a call gives up with
        pauses = wire.backoff_s()
        last: Exception = Unavailable("no attempt was made before the deadline")
        while True:
            retry_after_s = 0.0
            tried: set[str] = set()
            while (index := self._next_untried(tried)) is not None:
                server = self._servers[index]
                tried.add(server.url)
                read_s = min(attempt_s, deadline - time.monotonic())
                if read_s <= 0:
                    # The pause overslept the deadline (a loaded box), and a socket refuses a
                    # timeout of 0 or less.
                    raise _give_up(last, outcomes)
                try:
                    response = self._send(server, method, target, data, read_s, headers)
                except _TransportError as exc:
                    outcomes[server.url] = exc.reason
                    last = exc
                else:
                    outcomes.pop(server.url, None)
                    if response.status != 503:
                        self._preferred = index
                        if text and 200 <= response.status < 300:
                            return response.body.decode("utf-8", errors="replace")
                        return _decode(response)
                    last = wire.error_from(503, response.body)
                    outcomes[server.url] = f"answered 503: {last}"
                    retry_after_s = max(retry_after_s, response.retry_after_s)
                if failures is not None:
                    failures.append(last)
                if not retry_ambiguous and _maybe_applied([last]):
                    raise _outcome_unknown(server, last)
                if time.monotonic() >= deadline:
                    raise _give_up(last, outcomes)
                self._learn_members(deadline)
            pause_s = max(next(pauses), min(retry_after_s, RETRY_AFTER_S_MAX))
            if time.monotonic() + pause_s >= deadline:
                raise _give_up(last, outcomes)
            time.sleep(pause_s)

    def _next_untried(self, tried: set[str]) -> int | None:
        """The next server of this round, from the last one that answered on."""
        count = len(self._servers)
        for offset in range(count):
            index = (self._preferred + offset) % count
            if self._servers[index].url not in tried:
                return index
        return None

    def _learn_members(self, deadline: float) -> None:
        """Replace the learned servers with the nodes the first server to answer
        `/v1/cluster` lists as serving (same scheme as the first server given)."""
        now = time.monotonic()
        if self._members_read_at is not None and now - self._members_read_at < wire.MEMBERS_EVERY_S:
            return
        self._members_read_at = now
        scheme = "https" if self._given[0].https else "http"
        for server in list(self._servers):
            read_s = min(CONNECT_S_MAX, deadline - time.monotonic())
            if read_s <= 0:
                return
            try:
                response = self._send(server, "GET", "/v1/cluster", None, read_s)
                serving = wire.serving_urls(json.loads(response.body), scheme) if response.status == 200 else None
            except (_TransportError, ValueError):
                continue
            if serving is None:
                continue
            given = {s.url for s in self._given}
            learned = [url for url in serving if url not in given]
            current = self._servers[self._preferred].url
            self._servers = self._given + [parsed for parsed in map(_parse_member, learned) if parsed is not None]
            self._preferred = next((i for i, s in enumerate(self._servers) if s.url == current), 0)
            return

    def _send(
        self, server: _Server, method: str, target: str, data: bytes | None, read_s: float,
        extra_headers: Mapping[str, str] | None = None,
    ) -> _Response:
        timeout = min(read_s, CONNECT_S_MAX)
        conn = (http.client.HTTPSConnection(server.host, server.port, timeout=timeout, context=self._tls)
                if server.https else http.client.HTTPConnection(server.host, server.port, timeout=timeout))
        connected = False
        try:
            conn.connect()
            connected = True
            # Connect and read have separate budgets: see CONNECT_S_MAX.
            conn.sock.settimeout(read_s)
            headers = {**self._headers(data), **(extra_headers or {})}
            conn.request(method, server.prefix + target, body=data, headers=headers)
            response = conn.getresponse()
            return _Response(response.status, response.read(),
                             _retry_after_s(response.getheader("Retry-After")))
        except ConnectionRefusedError:
            raise _TransportError("connection refused", ambiguous=False) from None
        except TimeoutError:
            phase = "read" if connected else "connect"
            raise _TransportError(f"{phase} timed out", ambiguous=connected) from None
        except (OSError, http.client.HTTPException) as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise _TransportError(reason, ambiguous=connected) from None
        finally:
            conn.close()

    def _headers(self, data: bytes | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        if self._namespace is not None:
            headers["X-Namespace"] = self._namespace
        return headers


def _part(value: str) -> str:
    """One URL path segment: ids may hold '/', '?' or '%' in error cases."""
    return quote(str(value), safe="")


def _outcome_unknown(server: _Server, failure: Exception) -> OutcomeUnknown:
    """The error for a request that may have been applied and must not be resent."""
    if isinstance(failure, OutcomeUnknown):
        return failure
    reason = failure.reason if isinstance(failure, _TransportError) else str(failure)
    return OutcomeUnknown(f"{server.url}: {reason}; the request may have been applied")


def _give_up(last: Exception, outcomes: Mapping[str, str]) -> Exception:
    """The error a call ends with once every server failed it: what each one did last.

    A server that answered 503 is up but could not serve (its group had no leader, the
    cluster no quorum): that, not a bare "unreachable", is what the user needs to read."""
    if not isinstance(last, (_TransportError, Unavailable)) or not outcomes:
        return last
    where = "; ".join(f"{url}: {outcome}" for url, outcome in outcomes.items())
    answered = sum(outcome.startswith("answered") for outcome in outcomes.values())
    if not answered:
        return Unavailable(f"no server reachable: {where}")
    return Unavailable(f"the cluster could not serve this: {answered} of the {len(outcomes)} servers tried answered, "
                       f"and none could do it ({where})")
