"""The aiohttp application: error mapping in one middleware, cluster and
health routes here, job and task routes in their own modules."""
from __future__ import annotations

import logging
import re
from importlib.metadata import version
from typing import Any, Awaitable, Callable

from aiohttp import web

from schedulerd import auth, dashboard, exposure, namespaces, openapi, routes_jobs, routes_preview, routes_tasks, views
from schedulerd import request as request_mod
from schedulerd.auth import TokenFile
from schedulerd.errors import InvalidRequest, SchedulerError, Unavailable, status_of
from schedulerd.timefmt import to_iso
from schedulerd.lease_queue import LeaseQueue
from schedulerd.limits import Limits
from schedulerd.metrics import Metrics
from schedulerd.node import Node
from storage.db import last_applied
from storage import queries
from storage.queries import state_digest

log = logging.getLogger("schedulerd.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RETRY_AFTER_S = "1"
# An audit record's key in hex, as next_cursor gives it.
_AUDIT_CURSOR = re.compile(r"(?:[0-9a-f]{2})*")


def error_response(status: int, code: str, message: str) -> web.Response:
    resp = views.respond({"error": {"code": code, "message": message}}, status=status)
    if status == 503:
        resp.headers["Retry-After"] = RETRY_AFTER_S
    if status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="schedulerd"'
    return resp


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except SchedulerError as exc:
        return error_response(status_of(exc), exc.code, exc.message)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(413, "too_large", f"request body is too large: {exc.text}")
    except web.HTTPNotFound:
        return error_response(404, "not_found", f"no route {request.method} {request.path}")
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        resp = error_response(405, "method_not_allowed", f"{request.method} not allowed; use {allowed}")
        resp.headers["Allow"] = allowed  # RFC 9110 15.5.6: a 405 names the methods that are
        return resp
    except Exception:
        log.exception("request_failed method=%s path=%s", request.method, request.path)
        return error_response(500, "internal", "internal error; see the server log")


def auth_middleware(tokens: TokenFile | None) -> Any:
    """Authenticate and authorize by route; without a tokens file every caller is admin."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        if resource is None:
            return await handler(request)  # no such route: the 404 says nothing worth hiding
        route = resource.canonical
        if tokens is None or auth.required_scopes(request.method, route) is None:
            request[auth.PRINCIPAL] = auth.OPEN if tokens is None else None
            return await handler(request)
        principal = tokens.authenticate(request.headers.get("Authorization"))
        auth.authorize(principal, request.method, route)
        request[auth.PRINCIPAL] = principal
        return await handler(request)

    return check


def server_options(limits: Limits) -> dict[str, Any]:
    """What aiohttp's server enforces before any handler runs: line, header and header-time limits."""
    return {"access_log": None, "max_line_size": limits.header_line_bytes_max,
            "max_field_size": limits.header_line_bytes_max, "max_headers": limits.headers_max,
            "keepalive_timeout": limits.header_read_s_max}


def make_app(node: Node, leases: LeaseQueue, tokens: TokenFile | None = None) -> web.Application:
    metrics = Metrics(node, lambda: leases.waiters)
    metrics.attach()
    policy = exposure.ExposurePolicy.build(node.config.http_host, node.config.allowed_hosts,
                                           node.config.allowed_origins)
    app = web.Application(middlewares=[metrics.middleware, errors_middleware, exposure.middleware(policy),
                                       auth_middleware(tokens)],
                          client_max_size=node.config.limits.request_bytes_max)
    app.on_response_prepare.append(exposure.cors_on_prepare(policy))
    app[request_mod.LIMITS] = node.config.limits

    async def cluster(request: web.Request) -> web.Response:
        return views.respond({"node": node.config.raft.self_addr,
                              "http": f"{node.config.http_host}:{node.config.http_port}",
                              "clock": to_iso(node.clock.now_us()),
                              "groups": [g.status() for g in node.groups],
                              "poll_waiters": leases.waiters})

    async def queues(request: web.Request) -> web.Response:
        """Per queue: runs leasable now, runs queued for later, the oldest ready run's wait."""
        now = node.now_us()
        stats: dict[str, list[int]] = {}
        cut = False
        for group in node.groups:
            with node.read(group) as (txn, tables):
                cut |= queries.queue_stats(txn, tables, now, node.config.limits.metrics_scan_max, stats)
        principal = request.get(auth.PRINCIPAL)
        shown = []
        for stored, (ready, later, oldest) in sorted(stats.items()):
            namespace, queue = namespaces.split(stored)
            if isinstance(principal, auth.Principal) and not principal.may_use(namespace):
                continue
            shown.append({"queue": queue, "namespace": namespace, "ready": ready, "waiting": later,
                          "oldest_ready_age_s": (now - oldest) / 1_000_000})
        return views.respond({"queues": shown, "truncated": cut})

    async def audit_log(request: web.Request) -> web.Response:
        """Newest first; the cursor is the last record's position."""
        request_mod.check_query(request, request_mod.PAGE_QUERY)
        limit = request_mod.query_int(request, "limit", default=100, low=1, high=node.config.limits.page_size_max,
                                      limit_name="page_size_max")
        cursor = request.query.get("cursor")
        if cursor is not None and not _AUDIT_CURSOR.fullmatch(cursor):
            raise InvalidRequest("cursor must be a value returned as next_cursor")
        before = bytes.fromhex(cursor) if cursor else None
        records: list[tuple[bytes, dict[str, Any]]] = []
        for group in node.groups:
            with node.read(group) as (txn, tables):
                records.extend(queries.audit_records(txn, tables, limit=limit, before=before))
        records.sort(key=lambda kr: (kr[1]["at_us"], kr[0]), reverse=True)
        page = records[:limit]
        return views.respond({
            "records": [{"at": to_iso(r["at_us"]), "who": r["who"], "what": r["what"], "via": r["via"],
                         "outcome": r["outcome"], "raft_index": r["raft_index"]} for _, r in page],
            "next_cursor": page[-1][0].hex() if len(page) == limit else None})

    async def digest(request: web.Request) -> web.Response:
        """A hash of each group's whole replicated state at its last applied index:
        replicas that applied the same entries must report the same digest."""
        out = []
        for group in node.groups:
            with node.read(group) as (txn, tables):
                out.append({"group": group.group_id, "last_applied": last_applied(txn, tables),
                            "digest": state_digest(txn, tables)})
        return views.respond({"groups": out})

    spec = openapi.document(version("schedulerd"), node.config.limits, tokens=tokens is not None)

    async def openapi_json(request: web.Request) -> web.Response:
        return views.respond(spec)

    async def healthz(request: web.Request) -> web.Response:
        return views.respond({"ok": True})

    async def readyz(request: web.Request) -> web.Response:
        problems = _readiness_problems([g.status() for g in node.groups])
        if problems:
            raise Unavailable("; ".join(problems))
        return views.respond({"ok": True})

    app.add_routes([web.get("/v1/cluster", cluster), web.get("/v1/cluster/digest", digest),
                    web.get("/v1/queues", queues), web.get("/ui", dashboard.page), web.get("/v1/audit", audit_log),
                    web.get("/healthz", healthz), web.get("/readyz", readyz),
                    web.get("/metrics", metrics.handle), web.get("/v1/openapi.json", openapi_json)])
    app.add_routes(routes_jobs.routes(node))
    app.add_routes(routes_tasks.routes(node, leases))
    app.add_routes(routes_preview.routes(node))
    return app


def _readiness_problems(statuses: list[dict[str, Any]]) -> list[str]:
    problems = []
    for s in statuses:
        if s["leader"] is None:
            problems.append(f"group {s['group']} has no leader")
        elif not s["ready"]:
            problems.append(f"group {s['group']} is catching up (applied {s['last_applied']})")
    return problems
