"""HTTP routes for jobs and runs."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from schedulerd import jobspec, request as req, views
from schedulerd.errors import InvalidRequest, NotFound, from_wire
from schedulerd.node import Node
from storage import queries
from storage.model import JobState
from storage.ops import Op

JOB_STATES = {s.value for s in JobState}


def routes(node: Node) -> list[web.RouteDef]:
    limits = node.config.limits

    async def create(request: web.Request) -> web.Response:
        now = node.clock.now_us()
        spec = jobspec.parse_job(await req.body(request), now, limits)
        results = await _create(node, [spec], now)
        if not results[0]["ok"]:
            raise from_wire(results[0]["code"], results[0]["message"])
        return web.json_response(_job_view(node, spec["job_id"]), status=201)

    async def create_batch(request: web.Request) -> web.Response:
        now = node.clock.now_us()
        raw = req.items(await req.body(request), "jobs", max_items=limits.create_batch_max,
                        limit_name="create_batch_max")
        specs = [jobspec.parse_job(job, now, limits) for job in raw]
        if len({s["job_id"] for s in specs}) != len(specs):
            raise InvalidRequest("job_id values in one batch must be distinct")
        results = await _create(node, specs, now)
        out = [{"job_id": r["job_id"], "ok": True, "job": _job_view(node, r["job_id"])} if r["ok"]
               else {"job_id": r["job_id"], "ok": False, "error": {"code": r["code"], "message": r["message"]}}
               for r in results]
        return web.json_response({"results": out}, status=200)

    async def get(request: web.Request) -> web.Response:
        return web.json_response(_job_view(node, request.match_info["job_id"]))

    async def list_jobs(request: web.Request) -> web.Response:
        state = request.query.get("state")
        if state is not None and state not in JOB_STATES:
            raise InvalidRequest(f"state must be one of {', '.join(sorted(JOB_STATES))}")
        limit = req.query_int(request, "limit", default=100, low=1, high=limits.page_size_max,
                              limit_name="page_size_max")
        jobs: list[dict[str, Any]] = []
        cursors: list[str | None] = []
        after = request.query.get("cursor") or None
        for group in node.groups:
            with node.read(group) as (txn, tables):
                page, cursor = queries.list_jobs(txn, tables, state=state, queue=request.query.get("queue"),
                                                 limit=limit, after=after, scan_max=limits.list_scan_max)
            jobs.extend(page)
            cursors.append(cursor)
        jobs.sort(key=lambda j: j["job_id"])
        next_cursor = _merge_cursor(jobs, limit, cursors)
        if next_cursor is not None:
            jobs = [j for j in jobs if j["job_id"] <= next_cursor]
        return web.json_response({"jobs": [views.job(j) for j in jobs], "next_cursor": next_cursor})

    async def cancel(request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        result = await node.propose(node.group_of_job(job_id), Op.CANCEL_JOB, {"job_id": job_id})
        if not result["ok"]:
            raise from_wire(result["code"], result["message"])
        return web.json_response(_job_view(node, job_id))

    async def job_runs(request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        limit = req.query_int(request, "limit", default=100, low=1, high=limits.page_size_max,
                              limit_name="page_size_max")
        cursor = request.query.get("cursor")
        if cursor is not None and not cursor.isdigit():
            raise InvalidRequest("cursor must be a value returned as next_cursor")
        group = node.group_of_job(job_id)
        with node.read(group) as (txn, tables):
            if queries.get_job(txn, tables, job_id) is None:
                raise NotFound(f"no job {job_id!r}")
            runs, nxt = queries.job_runs(txn, tables, job_id, limit=limit,
                                         after_us=int(cursor) if cursor else None)
        return web.json_response({"runs": [views.run(r) for r in runs],
                                  "next_cursor": str(nxt) if nxt is not None else None})

    async def get_run(request: web.Request) -> web.Response:
        run_id = request.match_info["run_id"]
        group = node.group_of_run(run_id)
        rec = None
        if group is not None:
            with node.read(group) as (txn, tables):
                rec = queries.get_run(txn, tables, run_id)
        if rec is None:
            raise NotFound(f"no run {run_id!r}")
        return web.json_response(views.run(rec))

    return [
        web.post("/v1/jobs", create),
        web.post("/v1/jobs:batch", create_batch),
        web.get("/v1/jobs", list_jobs),
        web.get("/v1/jobs/{job_id}", get),
        web.delete("/v1/jobs/{job_id}", cancel),
        web.get("/v1/jobs/{job_id}/runs", job_runs),
        web.get("/v1/runs/{run_id}", get_run),
    ]


async def _create(node: Node, specs: list[dict[str, Any]], now: int) -> list[dict[str, Any]]:
    """Propose creates, one entry per group; results in the order of specs."""
    by_group: dict[int, list[dict[str, Any]]] = {}
    for spec in specs:
        by_group.setdefault(node.group_of_job(spec["job_id"]).group_id, []).append(spec)
    found: dict[str, dict[str, Any]] = {}
    for group_id, group_specs in by_group.items():
        result = await node.propose(node.groups[group_id], Op.CREATE_JOBS, {"now": now, "jobs": group_specs})
        found.update({r["job_id"]: r for r in result["results"]})
    return [found[s["job_id"]] for s in specs]


def _job_view(node: Node, job_id: str) -> dict[str, Any]:
    with node.read(node.group_of_job(job_id)) as (txn, tables):
        rec = queries.get_job(txn, tables, job_id)
    if rec is None:
        raise NotFound(f"no job {job_id!r}")
    return views.job(rec)


def _merge_cursor(jobs: list[dict[str, Any]], limit: int, cursors: list[str | None]) -> str | None:
    """The page ends at the smallest id any group stopped at, so no group's jobs are skipped."""
    stops = [c for c in cursors if c is not None]
    if len(jobs) > limit:
        stops.append(jobs[limit - 1]["job_id"])
    return min(stops) if stops else None

