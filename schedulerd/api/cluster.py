"""The handlers of the node's own routes: cluster status and digest, the audit log, health
and readiness, metrics and the OpenAPI document (the table is api/routes.py)."""
from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from schedulerd import topology, views
from schedulerd.api import inputs
from schedulerd.api.keys import LEASES, METRICS, NODE, SPEC
from schedulerd.errors import InvalidRequest, Unavailable
from schedulerd.storage import queries
from schedulerd.storage.queries import state_digest
from schedulerd.storage.tables import last_applied
from schedulerd.timefmt import to_iso

# An audit record's key in hex, as next_cursor gives it.
_AUDIT_CURSOR = re.compile(r"(?:[0-9a-f]{2})*")


async def cluster(request: web.Request) -> web.Response:
    """This node and its groups (`node`, `groups`: what tools read before the topology
    existed), and the registry and placement as its metadata replica has them."""
    node = request.app[NODE]
    leases = request.app[LEASES]
    groups = [g.status() for g in node.groups]
    body = {"node": node.config.raft.self_addr,
            "http": f"{node.config.http_host}:{node.config.http_port}",
            "clock": to_iso(node.clock.now_us()),
            "groups": groups,
            "poll_waiters": leases.waiters}
    if node.topology is not None:
        body.update(node.topology.status({g["group"]: g["leader"] for g in groups}))
        body["data_groups"] = topology.data_groups(node.topology.meta.view(), groups, node.config.raft.groups)
    return views.respond(body)


async def audit_log(request: web.Request) -> web.Response:
    """Newest first; the cursor is the last record's position."""
    node = request.app[NODE]
    inputs.check_query(request, inputs.PAGE_QUERY)
    limit = inputs.query_int(request, "limit", default=100, low=1, high=node.config.limits.page_size_max,
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
    node = request.app[NODE]
    out = []
    for group in node.groups:
        with node.read(group) as (txn, tables):
            out.append({"group": group.group_id, "last_applied": last_applied(txn, tables),
                        "digest": state_digest(txn, tables)})
    return views.respond({"groups": out})


async def openapi_document(request: web.Request) -> web.Response:
    spec = request.app[SPEC]
    return views.respond(spec)


async def healthz(request: web.Request) -> web.Response:
    """The process answers, and says which node it is (a member registering a joiner checks)."""
    topology = request.app[NODE].topology
    return views.respond({"ok": True, "node_id": topology.node_id if topology is not None else None})


async def readyz(request: web.Request) -> web.Response:
    node = request.app[NODE]
    problems = _readiness_problems([g.status() for g in node.groups])
    if node.topology is not None:
        problems += node.topology.readiness_problems()
        evicted = node.topology.evicted()
        if evicted is not None:
            problems.append(evicted)
    if problems:
        raise Unavailable("; ".join(problems))
    return views.respond({"ok": True})


async def metrics(request: web.Request) -> web.Response:
    return await request.app[METRICS].handle(request)


def _readiness_problems(statuses: list[dict[str, Any]]) -> list[str]:
    problems = []
    for s in statuses:
        if s["leader"] is None:
            problems.append(f"group {s['group']} has no leader")
        elif not s["ready"]:
            problems.append(f"group {s['group']} is catching up (applied {s['last_applied']})")
    return problems
