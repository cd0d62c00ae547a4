"""The handlers of the job and run routes (the table is api/routes.py)."""
from __future__ import annotations

import re
from typing import Any, Callable

from aiohttp import web

from schedulerd import jobspec, labels, namespaces, targets, tracing, views
from schedulerd.api import forward, inputs
from schedulerd.api.keys import CREATES, NODE
from schedulerd.auth import audit_note, may_manage_jobs
from schedulerd.coalescer import Coalescer
from schedulerd.errors import InvalidJob, InvalidRequest, NotFound, SchedulerError, from_wire
from schedulerd.limits import Limits
from schedulerd.node import RUN_ID_RE, Node
from schedulerd.raft.group import Group
from schedulerd.storage import ops, queries, records
from schedulerd.storage.jobs import RETENTION
from schedulerd.storage.model import JobState, OverlapPolicy, RunState
from schedulerd.storage.ops import Op
from schedulerd.units import US_PER_S

JOB_STATES = {s.value for s in JobState}
RUN_STATES = {s.value for s in RunState}
NEW_OVERLAP_POLICIES = frozenset({OverlapPolicy.BUFFER_ALL.value, OverlapPolicy.CANCEL_OTHER.value})
SPEC_BYTES_ESTIMATE = 512  # a job's encoded size besides its payload, for sizing coalesced entries

# A runs cursor: the occurrence time (µs) to list after, as next_cursor gave it.
_TIME_CURSOR = re.compile(r"[0-9]{1,19}")


def creates_coalescer(node: Node) -> Coalescer:
    """The node's creates, coalesced: one Raft entry per create would cap single creates at
    the commit rate. The entry claims what is due within the lookahead as the leader's scan
    would (claims.claim_created)."""
    cfg, limits = node.config, node.config.limits
    return Coalescer(node.propose, Op.CREATE_JOBS, "jobs", "results", limits.create_entry_bytes_max,
                     extra=lambda group, items: {"now": node.now_us(), "claim_ahead_us": int(cfg.lookahead_s * US_PER_S),
                                    "grace_us": int(cfg.misfire_grace_s * US_PER_S),
                                    "finished_ttl_us": int(cfg.finished_ttl_s * US_PER_S)},
                     weight=lambda spec: len(spec.get("payload_json", "")) + SPEC_BYTES_ESTIMATE)


async def create(request: web.Request) -> web.Response:
    node = request.app[NODE]
    cfg = node.config
    limits = node.config.limits
    creates = request.app[CREATES]
    now = node.now_us()
    namespace = namespaces.of_request(request)
    spec = _in_namespace(namespace, jobspec.parse_job(await inputs.body(request), now, limits,
                                                      request.headers.get("Idempotency-Key")))
    targets.check_destination(spec.get("target"), cfg.destinations)
    _versions_carry(node, spec)
    trace = tracing.from_headers(request.headers)
    _with_trace(node, spec, trace)
    spec["audit"] = audit_note(request, f"create job {spec['job_id']}")
    with tracing.create_span(trace, [spec]):
        (result,) = await _create(node, creates, [spec])
    if not result["ok"]:
        raise from_wire(result["code"], result["message"])
    body = jobspec.warned(_created_view(node, result), spec["schedule"])
    return views.respond(body, status=200 if result.get("existing") else 201)


async def update(request: web.Request) -> web.Response:
    node = request.app[NODE]
    cfg = node.config
    limits = node.config.limits
    job_id = job_id_of(request)
    raw = await inputs.body(request)
    unknown = sorted(raw.keys() - jobspec.OPTION_FIELDS)
    if unknown:
        raise InvalidRequest(f"cannot update {', '.join(unknown)}; updatable: "
                             f"{', '.join(sorted(jobspec.OPTION_FIELDS))}")
    if not raw:
        raise InvalidRequest("nothing to update: send at least one field")
    current = job_record(node, job_id)
    changes = jobspec.parse_options(raw, node.now_us(), limits, backoff_base=current["backoff"])
    targets.check_destination(changes.get("target"), cfg.destinations)
    if changes.keys() & RETENTION:
        node.require_entry_version(node.group_of_job(job_id), ops.RETENTION_SINCE, "a job's retention")
    _check_new_fields(node, node.group_of_job(job_id), changes.get("schedule"), changes)
    jobspec.check_together({**current, **changes})
    if "queue" in changes:
        changes["queue"] = namespaces.inside(namespaces.of_request(request), changes["queue"])
    await _job_command(node, Op.UPDATE_JOB, job_id, {
        "changes": changes, "audit": audit_note(request, f"update job {job_id}: {', '.join(sorted(raw))}")})
    return views.respond(jobspec.warned(_job_view(node, job_id), changes.get("schedule")))


async def pause(request: web.Request) -> web.Response:
    return await _lifecycle(request, Op.PAUSE_JOB, "pause")


async def resume(request: web.Request) -> web.Response:
    return await _lifecycle(request, Op.RESUME_JOB, "resume")


async def trigger(request: web.Request) -> web.Response:
    return await _lifecycle(request, Op.TRIGGER_JOB, "trigger")


async def _lifecycle(request: web.Request, op: Op, verb: str) -> web.Response:
    node = request.app[NODE]
    job_id = job_id_of(request)
    result = await _job_command(node, op, job_id, {"audit": audit_note(request, f"{verb} job {job_id}")})
    if op == Op.TRIGGER_JOB:
        return views.respond({"run": views.run(result["run"])}, status=201)
    return views.respond(_job_view(node, job_id))


async def dead_letter_list(request: web.Request) -> web.Response:
    node = request.app[NODE]
    limits = node.config.limits
    inputs.check_query(request, inputs.PAGE_QUERY | {"queue", "groups"})
    limit = inputs.query_int(request, "limit", default=100, low=1, high=limits.page_size_max,
                             limit_name="page_size_max")
    after = _dead_letter_cursor(request.query.get("cursor"))
    namespace = namespaces.of_request(request)

    def read(txn: Any, tables: Any) -> tuple[list[dict[str, Any]], Any]:
        page, stop = queries.dead_letters(txn, tables, queue=_queue_filter(request), limit=limit, after=after,
                                          scan_max=limits.list_scan_max)
        return [r for r in page if namespaces.holds(namespace, r["job_id"])], stop

    return await _runs_page(request, node, limit, read, lambda r: (r["finished_us"], r["run_id"]),
                            lambda stop: f"{stop[0]}:{stop[1]}")


async def list_runs(request: web.Request) -> web.Response:
    """Runs in one state across every job of the namespace, in run id order."""
    node = request.app[NODE]
    limits = node.config.limits
    inputs.check_query(request, inputs.PAGE_QUERY | {"state", "queue", "groups"})
    state = request.query.get("state")
    if state not in RUN_STATES:
        raise InvalidRequest(f"state is required, one of {', '.join(sorted(RUN_STATES))}")
    limit, after = _page_args(request, limits, RUN_ID_RE)
    namespace = namespaces.of_request(request)

    def read(txn: Any, tables: Any) -> tuple[list[dict[str, Any]], Any]:
        return queries.list_runs(txn, tables, state=state, queue=_queue_filter(request), limit=limit, after=after,
                                 scan_max=limits.list_scan_max, holds=lambda job_id: namespaces.holds(namespace, job_id))

    return await _runs_page(request, node, limit, read, lambda r: r["run_id"], str)


async def _runs_page(request: web.Request, node: Node, limit: int,
                     read: Callable[[Any, Any], tuple[list[dict[str, Any]], Any]],
                     key: Callable[[dict[str, Any]], Any], cursor_of: Callable[[Any], str]) -> web.Response:
    """A page of runs from every group: `read` gives one local group's page and where it
    stopped, `key` each run's sort key, `cursor_of` the next_cursor of the page's stop."""
    local, elsewhere = listed_groups(request, node)
    items: list[tuple[Any, dict[str, Any]]] = []
    stops: list[Any] = []
    for group in local:
        with node.read(group) as (txn, tables):
            page, stop = read(txn, tables)
        items.extend((key(r), views.run(r)) for r in page)
        if stop is not None:
            stops.append(stop)
    page_items, stop = await _merged_page(request, items, stops, limit, "runs", elsewhere)
    return _page_response(request, local, "runs", page_items, stop, None if stop is None else cursor_of(stop))


def namespace_scope(request: web.Request) -> tuple[str, bool]:
    """The stored job ids of the request's namespace, for queries.list_jobs: (prefix,
    bare_only). The default namespace is the bare ids; another is the ids under its prefix."""
    namespace = namespaces.of_request(request)
    if namespace == namespaces.DEFAULT:
        return "", True
    return namespaces.inside(namespace, ""), False


def listed_groups(request: web.Request, node: Node) -> tuple[list[Group], list[int]]:
    """The groups a list reads here, and those it asks other nodes for. A list sent on by
    another node names its groups (`groups=`) and answers for those held here only."""
    raw = request.query.get("groups")
    if raw is None:
        return node.groups, [g for g in range(node.config.raft.groups) if node.local_group(g) is None]
    try:
        named = {int(g) for g in raw.split(",")}
    except ValueError:
        raise InvalidRequest("groups must be group numbers separated by commas") from None
    return [g for g in node.groups if g.group_id in named], []


async def _merged_page(request: web.Request, items: list[tuple[Any, dict[str, Any]]], stops: list[Any],
                       limit: int, field: str, elsewhere: list[int]) -> tuple[list[tuple[Any, dict[str, Any]]], Any]:
    """One page of (sort key, view) from this node's groups and the other nodes' answers for
    the rest: it ends at the smallest key any source stopped at, so none is skipped."""
    for answer in await forward.gather(request, elsewhere) if elsewhere else []:
        items.extend((tuple(k) if isinstance(k, list) else k, v) for k, v in zip(answer["keys"], answer[field]))
        if answer["stop"] is not None:
            stops.append(tuple(answer["stop"]) if isinstance(answer["stop"], list) else answer["stop"])
    items.sort(key=lambda item: item[0])
    if len(items) > limit:
        stops.append(items[limit - 1][0])
    stop = min(stops) if stops else None
    return [item for item in items if stop is None or item[0] <= stop], stop


def _page_response(request: web.Request, local: list[Group], field: str, items: list[tuple[Any, dict[str, Any]]],
                   stop: Any, cursor: str | None) -> web.Response:
    body: dict[str, Any] = {field: [view for _, view in items], "next_cursor": cursor}
    if "groups" in request.query:  # for the node that sent the list on
        body.update(groups_answered=[g.group_id for g in local], keys=[k for k, _ in items], stop=stop)
    return views.respond(body)


async def redrive(request: web.Request) -> web.Response:
    return views.respond({"run": views.run(await _run_command(request, Op.REDRIVE_RUN, "re-drive run"))})


async def cancel_run(request: web.Request) -> web.Response:
    """Cancel one run: a queued or waiting one at once; a running one loses its lease, and
    its worker hears it at its next heartbeat."""
    run = await _run_command(request, Op.CANCEL_RUN, "cancel run", (ops.RUN_CANCEL_SINCE, "cancelling one run"))
    return views.respond({"run": views.run(run)})


async def create_batch(request: web.Request) -> web.Response:
    node = request.app[NODE]
    cfg = node.config
    limits = node.config.limits
    creates = request.app[CREATES]
    now = node.now_us()
    raw = inputs.items(await inputs.body(request), "jobs", max_items=limits.create_batch_max,
                       limit_name="create_batch_max")
    namespace = namespaces.of_request(request)  # once a request: it was a header read and a regex per job
    trace = tracing.from_headers(request.headers)  # the request's, for each of its jobs
    specs = []
    for position, job in enumerate(raw):
        try:
            specs.append(_in_namespace(namespace, jobspec.parse_job(job, now, limits)))
            targets.check_destination(specs[-1].get("target"), cfg.destinations)
            _versions_carry(node, specs[-1])
            _with_trace(node, specs[-1], trace)
        except SchedulerError as exc:
            # The whole batch is refused; say which job, so a file import can point at it.
            named = f" (job_id {job.get('job_id')!r})" if isinstance(job, dict) and job.get("job_id") else ""
            raise type(exc)(f"jobs[{position}]{named}: {exc.message}") from None
    if len({s["job_id"] for s in specs}) != len(specs):
        raise InvalidRequest("job_id values in one batch must be distinct")
    minimal = views.prefers_minimal(request)

    def item(r: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"job_id": namespaces.split(r["job_id"])[1], "ok": r["ok"]}
        if not r["ok"]:
            out["error"] = {"code": r["code"], "message": r["message"]}
        elif not minimal:
            out["job"] = _created_view(node, r)
        return out

    def warned(position: int, answer: dict[str, Any]) -> dict[str, Any]:
        return jobspec.warned(answer, specs[position]["schedule"]) if answer.get("ok") else answer

    by_group: dict[int, list[int]] = {}
    for position, spec in enumerate(specs):
        by_group.setdefault(node.group_id_of_job(spec["job_id"]), []).append(position)
    # Decided once: a replica started or dropped while this node's share commits must not
    # leave a position answered by neither side.
    held = {g for g in by_group if node.local_group(g) is not None}
    here = [p for g, positions in by_group.items() if g in held for p in positions]
    if here:  # the shares sent on are audited where they are written
        specs[here[0]]["audit"] = audit_note(request, f"create {len(here)} jobs ({specs[here[0]]['job_id']}, ...)",
                                             count=len(here))
    answered: list[dict[str, Any]] = [{}] * len(specs)
    with tracing.create_span(trace, [specs[p] for p in here]):
        created = await _create(node, creates, [specs[p] for p in here])
    for position, r in zip(here, created):
        answered[position] = warned(position, item(r))
    for group_id, positions in by_group.items():
        if group_id not in held:  # this share goes to a node that holds the group
            share = await forward.send_json(request, group_id, request.path_qs, {"jobs": [raw[p] for p in positions]})
            for position, r in zip(positions, share["results"]):
                answered[position] = r
    response = views.respond({"results": answered}, status=200)
    if minimal:
        response.headers["Preference-Applied"] = views.RETURN_MINIMAL
    return response


async def get(request: web.Request) -> web.Response:
    node = request.app[NODE]
    return views.respond(_job_view(node, job_id_of(request), may_manage_jobs(request)))


async def list_jobs(request: web.Request) -> web.Response:
    node = request.app[NODE]
    limits = node.config.limits
    inputs.check_query(request, inputs.PAGE_QUERY | {"queue", "state", "groups", "selector"})
    state = request.query.get("state")
    if state is not None and state not in JOB_STATES:
        raise InvalidRequest(f"state must be one of {', '.join(sorted(JOB_STATES))}")
    selector = labels.parse_selector(request.query["selector"]) if "selector" in request.query else None
    limit = inputs.query_int(request, "limit", default=100, low=1, high=limits.page_size_max,
                             limit_name="page_size_max")
    local, elsewhere = listed_groups(request, node)
    items: list[tuple[Any, dict[str, Any]]] = []
    stops: list[Any] = []
    after = request.query.get("cursor") or None
    prefix, bare_only = namespace_scope(request)
    shown = may_manage_jobs(request)
    for group in local:
        now_us = node.now_us()
        with node.read(group) as (txn, tables):
            page, cursor = queries.list_jobs(txn, tables, state=state, queue=_queue_filter(request),
                                             limit=limit, after=after, scan_max=limits.list_scan_max,
                                             now_us=now_us, prefix=prefix, bare_only=bare_only,
                                             labels=None if selector is None else selector.matches)
            reader = records.Reader(txn, tables)
            lasts = [queries.last_runs(reader, j["job_id"], now_us) for j in page]
        items.extend((j["job_id"], views.job(j, shown, last)) for j, last in zip(page, lasts))
        if cursor is not None:
            stops.append(cursor)
    page_items, stop = await _merged_page(request, items, stops, limit, "jobs", elsewhere)
    return _page_response(request, local, "jobs", page_items, stop, stop)


async def cancel(request: web.Request) -> web.Response:
    """Cancel; with ?purge=true, then delete the job and its runs (its id is free again)."""
    node = request.app[NODE]
    inputs.check_query(request, frozenset({"purge"}))
    purge = inputs.query_bool(request, "purge")
    job_id = job_id_of(request)
    cancelling = audit_note(request, f"cancel job {job_id}")
    if not purge:
        await _job_command(node, Op.CANCEL_JOB, job_id, {"audit": cancelling})
        return views.respond(_job_view(node, job_id))
    node.require_entry_version(node.group_of_job(job_id), ops.PURGE_SINCE, "a purge")
    await _finish(node, job_id, cancelling)
    deleted = await _purge(node, job_id, audit_note(request, f"purge job {job_id}"))
    return views.respond({"job_id": namespaces.split(job_id)[1], "purged": True, "deleted_runs": deleted})


async def discard(request: web.Request) -> web.Response:
    """Delete a dead letter: it leaves the dead-letter list and its job's history."""
    run = await _run_command(request, Op.DISCARD_RUN, "discard dead letter",
                             (ops.PURGE_SINCE, "discarding a dead letter"))
    return views.respond({"run_id": run["run_id"], "discarded": True, "run": views.run(run)})


async def _run_command(request: web.Request, op: Op, audit_what: str,
                       needs: tuple[int, str] | None = None) -> dict[str, Any]:
    """Propose `op` on the run the path names (404 unless the caller may see it), once its
    group writes the entry version `needs` names; the run as the command left it."""
    node = request.app[NODE]
    run_id = request.match_info["run_id"]
    group = _visible_run(node, request, run_id)[0]
    if needs is not None:
        node.require_entry_version(group, *needs)
    result = await node.propose(group, op, {"run_id": run_id, "audit": audit_note(request, f"{audit_what} {run_id}")})
    if not result["ok"]:
        raise from_wire(result["code"], result["message"])
    return result["run"]


async def job_runs(request: web.Request) -> web.Response:
    node = request.app[NODE]
    limits = node.config.limits
    inputs.check_query(request, inputs.PAGE_QUERY)
    job_id = job_id_of(request)
    limit, cursor = _page_args(request, limits, _TIME_CURSOR)
    group = node.group_of_job(job_id)
    with node.read(group) as (txn, tables):
        if records.get_job(records.Reader(txn, tables), job_id) is None:
            raise NotFound(f"no job {job_id!r}")
        runs, nxt = queries.job_runs(txn, tables, job_id, limit=limit,
                                     after_us=int(cursor) if cursor else None)
    return views.respond({"runs": [views.run(r) for r in runs],
                          "next_cursor": str(nxt) if nxt is not None else None})


def _page_args(request: web.Request, limits: Limits, cursor_re: re.Pattern[str]) -> tuple[int, str | None]:
    """A list's page size and its cursor, which must be one it handed out (`cursor_re`)."""
    limit = inputs.query_int(request, "limit", default=100, low=1, high=limits.page_size_max,
                             limit_name="page_size_max")
    cursor = request.query.get("cursor")
    if cursor is not None and not cursor_re.fullmatch(cursor):
        raise InvalidRequest("cursor must be a value returned as next_cursor")
    return limit, cursor


async def get_run(request: web.Request) -> web.Response:
    node = request.app[NODE]
    return views.respond(views.run(_visible_run(node, request, request.match_info["run_id"])[1]))


def job_id_of(request: web.Request) -> str:
    """The stored id of the job the path names, in the request's namespace."""
    job_id = request.match_info["job_id"]
    if not jobspec.ID_RE.match(job_id):
        raise NotFound(f"no job {job_id!r}: job ids are 1-128 characters of A-Z a-z 0-9 _ . -")
    return namespaces.inside(namespaces.of_request(request), job_id)


def _queue_filter(request: web.Request) -> str | None:
    queue = request.query.get("queue")
    if queue is None:
        return None
    if not jobspec.QUEUE_RE.match(queue):
        raise InvalidRequest("queue must be 1-64 characters of A-Z a-z 0-9 _ . -")
    return namespaces.inside(namespaces.of_request(request), queue)


def _in_namespace(namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A parsed job spec with its id, queue and idempotency key in the namespace (the request's)."""
    if "idempotency_key" in spec:
        spec["idempotency_key"] = namespaces.key_inside(namespace, spec["idempotency_key"])
    if namespace != namespaces.DEFAULT:
        spec.update(job_id=namespaces.inside(namespace, spec["job_id"]),
                    queue=namespaces.inside(namespace, spec.get("queue", jobspec.SPEC_DEFAULTS["queue"])))
    return spec


def _versions_carry(node: Node, spec: dict[str, Any]) -> None:
    """A create naming its retention, a schedule's bounds or max_runs needs entries of the
    versions that carry them (409 until its group writes them); one naming no retention is
    created without (it never expires)."""
    group = node.local_group(node.group_id_of_job(spec["job_id"]))
    if group is None:  # a holder elsewhere checks its own
        return
    if spec.keys() & RETENTION:
        node.require_entry_version(group, ops.RETENTION_SINCE, "a job's retention")
    _check_new_fields(node, group, spec.get("schedule"), spec)


def _with_trace(node: Node, spec: dict[str, Any], trace: dict[str, str]) -> None:
    """The request's trace context into the job, when its group writes entries that carry it
    (ops.TRACE_SINCE). Before, the job is created without it: a tracing header does not refuse
    a create. A holder elsewhere takes it from the forwarded headers."""
    if not trace:
        return
    group = node.local_group(node.group_id_of_job(spec["job_id"]))
    if group is not None and group.versions.writes() >= ops.TRACE_SINCE:
        spec.update(trace)


def _check_new_fields(node: Node, group: Group, schedule: dict[str, Any] | None,
                      fields: dict[str, Any]) -> None:
    """A schedule's bounds, a job's max_runs, labels and description, pause_on_failure,
    skip_calendar and the overlap policies buffer_all and cancel_other need entries of the
    versions that carry them; skip_calendar must name a calendar that exists."""
    if schedule is not None and schedule.keys() & {"start_us", "end_us"}:
        node.require_entry_version(group, ops.BOUNDS_SINCE, "a schedule's start_at or end_at")
    if "max_runs" in fields:
        node.require_entry_version(group, ops.MAX_RUNS_SINCE, "max_runs")
    if fields.keys() & {"labels", "description"}:
        node.require_entry_version(group, ops.LABELS_SINCE, "labels and a description")
    if "pause_on_failure" in fields:
        node.require_entry_version(group, ops.PAUSE_ON_FAILURE_SINCE, "pause_on_failure")
    if "skip_calendar" in fields:
        node.require_entry_version(group, ops.CALENDAR_SINCE, "skip_calendar")
        name = fields["skip_calendar"]
        if name is not None and (node.topology is None or name not in node.topology.meta.calendars()):
            raise InvalidJob(f"skip_calendar names no calendar {name!r}: create it first (PUT /v1/calendars/{name})")
    if fields.get("overlap_policy") in NEW_OVERLAP_POLICIES:
        node.require_entry_version(group, ops.OVERLAP_HOLD_SINCE, f"overlap_policy {fields['overlap_policy']}")


def _visible_run(node: Node, request: web.Request, run_id: str) -> tuple[Group, dict[str, Any]]:
    """The run's group and record, if it exists in the request's namespace (404 otherwise)."""
    group = node.group_of_run(run_id)
    rec = None
    if group is not None:
        with node.read(group) as (txn, tables):
            rec = records.get_run(records.Reader(txn, tables), run_id)
    if group is None or rec is None or not namespaces.holds(namespaces.of_request(request), rec["job_id"]):
        raise NotFound(f"no run {run_id!r}")
    return group, rec


async def _create(node: Node, creates: Coalescer, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Propose creates (concurrent requests share entries); results in the order of specs."""
    by_group: dict[int, list[int]] = {}
    for position, spec in enumerate(specs):
        by_group.setdefault(node.group_of_job(spec["job_id"]).group_id, []).append(position)
    out: list[dict[str, Any]] = [{}] * len(specs)
    for group_id, positions in by_group.items():
        results = await creates.submit(node.group_of_job(specs[positions[0]]["job_id"]), [specs[p] for p in positions])
        for position, r in zip(positions, results):
            out[position] = r
    return out


async def _finish(node: Node, job_id: str, audit: dict[str, Any]) -> None:
    """Cancel a job before its purge, unless it is cancelled, or completed with nothing
    left to cancel (which a cancel refuses as a conflict)."""
    state = job_record(node, job_id)["state"]
    if state == JobState.CANCELLED:
        return
    result = await node.propose(node.group_of_job(job_id), Op.CANCEL_JOB, {"job_id": job_id, "audit": audit})
    if not result["ok"] and not (state == JobState.COMPLETED and result["code"] == "conflict"):
        raise from_wire(result["code"], result["message"])


async def _purge(node: Node, job_id: str, audit: dict[str, Any]) -> int:
    """Propose purge entries until the job is gone (each deletes at most purge_runs_max
    runs, and is audited); returns how many runs went."""
    deleted = 0
    while True:
        result = await _job_command(node, Op.PURGE_JOB, job_id,
                                    {"runs_max": node.config.limits.purge_runs_max, "audit": audit})
        deleted += result["deleted_runs"]
        if result["done"]:
            return deleted


async def _job_command(node: Node, op: Op, job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    result = await node.propose(node.group_of_job(job_id), op, {"job_id": job_id, **payload})
    if not result["ok"]:
        raise from_wire(result["code"], result["message"])
    return result


def _dead_letter_cursor(raw: str | None) -> tuple[int, str] | None:
    if raw is None:
        return None
    head, sep, run_id = raw.partition(":")
    if not sep or not _TIME_CURSOR.fullmatch(head) or not RUN_ID_RE.fullmatch(run_id):
        raise InvalidRequest("cursor must be a value returned as next_cursor")
    return int(head), run_id


def job_record(node: Node, job_id: str) -> dict[str, Any]:
    with node.read(node.group_of_job(job_id)) as (txn, tables):
        rec = records.get_job(records.Reader(txn, tables), job_id)
    if rec is None:
        raise NotFound(f"no job {job_id!r}")
    return rec


def _job_view(node: Node, job_id: str, headers_shown: bool = True) -> dict[str, Any]:
    now_us = node.now_us()
    with node.read(node.group_of_job(job_id)) as (txn, tables):
        reader = records.Reader(txn, tables)
        rec = records.get_job(reader, job_id)
        last = queries.last_runs(reader, job_id, now_us)
    if rec is None:
        raise NotFound(f"no job {job_id!r}")
    return views.job(queries.as_seen(rec, now_us), headers_shown, last)


def _created_view(node: Node, result: dict[str, Any]) -> dict[str, Any]:
    """The job a create made, as its entry stored it (reading it back cost a read txn and an
    unpack per job on this node); one created earlier under the same idempotency key is read."""
    job = result.get("job")
    if job is None:
        return _job_view(node, result["job_id"])
    return views.job(queries.as_seen(job, node.now_us()))


