"""The handlers of the queue routes: `GET /v1/queues` (what waits and runs, per queue),
`GET /v1/queues:history` (the dashboard's charts), and `GET|PUT /v1/queues/{name}` (a
queue's limits).

A queue's limits live in the metadata group (storage/meta.py), cluster-wide; each data group
enforces its share of them in apply (storage/queue_limits.py). They are written only once every
data group held here writes entry version QUEUE_LIMITS_SINCE: an older build would grant
past them."""
from __future__ import annotations

from typing import Any, NamedTuple

from aiohttp import web

from schedulerd import auth, jobspec, namespaces, queue_history, views
from schedulerd.api import forward, inputs, jobs
from schedulerd.api.keys import METRICS, NODE
from schedulerd.errors import Elsewhere, InvalidRequest, LimitExceeded, Unavailable
from schedulerd.node import Node
from schedulerd.storage import meta, ops, queries, queue_limits
from schedulerd.timefmt import to_iso
from schedulerd.units import US_PER_S

LIMIT_FIELDS = frozenset({"max_running", "max_starts_per_s"})


class Gathered(NamedTuple):
    stats: dict[str, list[int]]  # per stored queue name: [ready, waiting, oldest ready time]
    running: dict[str, int]
    cut: bool  # a scan was cut short
    answered: list[int]  # the groups read here


async def _gather(request: web.Request, node: Node) -> Gathered:
    """What waits and runs per queue over every group: the nodes holding the groups this one
    lacks are asked for theirs."""
    now = node.now_us()
    local, elsewhere = jobs.listed_groups(request, node)
    stats: dict[str, list[int]] = {}
    running: dict[str, int] = {}
    cut = False
    for group in local:
        with node.read(group) as (txn, tables):
            cut |= queries.queue_stats(txn, tables, now, node.config.limits.metrics_scan_max, stats)
            cut |= queries.running_by_queue(txn, tables, node.config.limits.metrics_scan_max, running)
    for answer in await forward.gather(request, elsewhere) if elsewhere else []:
        cut |= answer["truncated"]
        for stored, (ready, later, oldest) in answer["stats"].items():
            entry = stats.setdefault(stored, [0, 0, now])
            entry[0], entry[1], entry[2] = entry[0] + ready, entry[1] + later, min(entry[2], oldest)
        for stored, count in answer.get("running", {}).items():  # a node of an older build sends none
            running[stored] = running.get(stored, 0) + count
    return Gathered(stats, running, cut, [g.group_id for g in local])


def _view(node: Node, stored: str, found: Gathered) -> dict[str, Any]:
    """One queue: what waits and runs, and its limits (null: none)."""
    namespace, queue = namespaces.split(stored)
    now = node.now_us()
    ready, later, oldest = found.stats.get(stored, (0, 0, now))
    limit = node.queue_limits().get(stored) or {"max_running": None, "max_starts_per_s": None}
    return {"queue": queue, "namespace": namespace, "ready": ready, "waiting": later,
            "oldest_ready_age_s": (now - oldest) / US_PER_S, "running": found.running.get(stored, 0),
            "max_running": limit["max_running"], "max_starts_per_s": limit["max_starts_per_s"]}


async def list_queues(request: web.Request) -> web.Response:
    """Per queue: runs leasable now, runs queued for later, the oldest ready run's wait, runs
    leased now, and its limits; a queue with limits is listed even while it holds no run."""
    node = request.app[NODE]
    inputs.check_query(request, frozenset({"groups"}))
    found = await _gather(request, node)
    if "groups" in request.query:
        return _for_asker(found)
    principal = request.get(auth.PRINCIPAL)
    limited = {q for q, limit in node.queue_limits().items() if meta.limited(limit)}
    shown = [_view(node, stored, found) for stored in sorted(found.stats.keys() | found.running.keys() | limited)
             if not isinstance(principal, auth.Principal) or principal.may_use(namespaces.split(stored)[0])]
    return views.respond({"queues": shown, "truncated": found.cut})


def _for_asker(found: Gathered) -> web.Response:
    """The answer to a node gathering from this one's groups: by stored name, with the oldest
    ready run as a time."""
    return views.respond({"stats": found.stats, "running": found.running, "truncated": found.cut,
                          "groups_answered": found.answered})


async def get(request: web.Request) -> web.Response:
    """One queue (of the request's namespace): its limits, how each group's share of them is
    set, and what waits and runs."""
    node = request.app[NODE]
    inputs.check_query(request, frozenset({"groups"}))
    stored = _stored_name(request)
    if "groups" in request.query:
        return _for_asker(await _gather(request, node))
    return await _answer(request, node, stored)


async def put(request: web.Request) -> web.Response:
    """Set a queue's limits; a field left out or null lifts that limit. Each group enforces
    its share from its next lease entry on."""
    node = request.app[NODE]
    inputs.check_query(request, frozenset())
    stored = _stored_name(request)
    data = await inputs.body(request)
    unknown = sorted(data.keys() - LIMIT_FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown field(s) {', '.join(unknown)}; a queue's limits are max_running and "
                             "max_starts_per_s")
    max_running = _max_running(node, data.get("max_running"))
    max_starts = _max_starts(node, data.get("max_starts_per_s"))
    limits = node.config.limits
    in_use = sum(1 for q, limit in node.queue_limits().items() if q != stored and meta.limited(limit))
    if (max_running is not None or max_starts is not None) and in_use >= limits.queue_limits_max:
        raise LimitExceeded(f"{in_use} queues have limits; queue_limits_max is {limits.queue_limits_max}")
    _require_upgraded(node)
    topology = node.topology
    if topology is None:
        raise Unavailable("this node has no metadata view yet")
    await topology.propose_checked({"op": "queue_limits_set", "queue": stored, "max_running": max_running,
                                    "max_starts_per_s": max_starts, "queue_limits_max": limits.queue_limits_max})
    return await _answer(request, node, stored)


async def _answer(request: web.Request, node: Node, stored: str) -> web.Response:
    found = await _gather(request, node)
    return views.respond({**_view(node, stored, found), **_division(node, stored), "truncated": found.cut})


def _max_running(node: Node, value: Any) -> int | None:
    groups, most = node.config.raft.groups, node.config.limits.queue_running_max
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise InvalidRequest(f"max_running must be a whole number from 1 to {most} (queue_running_max), or null "
                             f"for no limit; not {value!r}")
    if value < groups:
        raise InvalidRequest(f"max_running must be at least {groups}, the cluster's number of groups: each group "
                             f"leases up to its own share of the limit, and a group with no share would never start "
                             f"this queue's runs (docs/semantics.md, queue limits)")
    return value


def _max_starts(node: Node, value: Any) -> float | None:
    most = node.config.limits.queue_starts_per_s_max
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not queue_limits.STARTS_PER_S_MIN <= value <= most:
        raise InvalidRequest(f"max_starts_per_s must be a number from {queue_limits.STARTS_PER_S_MIN} to {most:g} "
                             f"(queue_starts_per_s_max), or null for no limit; not {value!r}")
    return float(value)


def _division(node: Node, stored: str) -> dict[str, Any]:
    """How the limits are divided: each group's max_running and max_starts_per_s."""
    groups = node.config.raft.groups
    limit = node.queue_limits().get(stored)
    max_running = limit["max_running"] if limit else None
    max_starts = limit["max_starts_per_s"] if limit else None
    return {"updated_at": to_iso(limit["updated_us"]) if limit else None,
            "groups": groups,
            "max_running_per_group": None if max_running is None else
            [queue_limits.running_share(max_running, groups, g, stored) for g in range(groups)],
            "max_starts_per_s_per_group": None if max_starts is None else
            queue_limits.rate_share(max_starts, groups) / queue_limits.TOKEN}


def _stored_name(request: web.Request) -> str:
    queue = request.match_info["name"]
    if not jobspec.QUEUE_RE.match(queue):
        raise InvalidRequest("a queue's name is 1-64 characters of A-Z a-z 0-9 _ . -")
    return namespaces.inside(namespaces.of_request(request), queue)


def _require_upgraded(node: Node) -> None:
    """Refuse (409) a limit before every data group held here writes version 21; a node that
    holds none sends the request to one that holds group 0 (api/forward.py)."""
    if not node.groups:
        raise Elsewhere(0)
    for group in node.groups:
        node.require_entry_version(group, ops.QUEUE_LIMITS_SINCE, "a queue limit")


async def history(request: web.Request) -> web.Response:
    """Per queue, the last 15 minutes in 10-second slots: dispatches per second and the
    lateness p50/p99 of first leases, over every group (holders of the groups this node
    lacks are asked for theirs), for the dashboard's charts."""
    node = request.app[NODE]
    inputs.check_query(request, frozenset({"groups"}))
    now = node.now_us()
    local, elsewhere = jobs.listed_groups(request, node)
    recorded = request.app[METRICS].history
    merged = recorded.of_groups([g.group_id for g in local], now)
    if "groups" in request.query:  # for the node that asked
        return views.respond({"history": {q: {str(s): c for s, c in slots.items()} for q, slots in merged.items()},
                              "groups_answered": [g.group_id for g in local]})
    for answer in await forward.gather(request, elsewhere) if elsewhere else []:
        for stored, slots in answer["history"].items():
            queue_history.merge(merged.setdefault(stored, {}), {int(s): c for s, c in slots.items()})
    principal = request.get(auth.PRINCIPAL)
    shown = []
    for stored, slots in sorted(merged.items()):
        namespace, queue = namespaces.split(stored)
        if isinstance(principal, auth.Principal) and not principal.may_use(namespace):
            continue
        shown.append({"queue": queue, "namespace": namespace,
                      "points": queue_history.points(slots, recorded.bounds_s, now)})
    return views.respond({"slot_s": queue_history.SLOT_S, "queues": shown})
