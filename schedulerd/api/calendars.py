"""The handlers of the holiday calendar routes: `PUT|GET|DELETE /v1/calendars/{name}` and
`GET /v1/calendars`.

A calendar is a cluster object in the metadata group (storage/meta.py), named by jobs'
`skip_calendar`; its days are normalised here (storage/calendars.normalise) before they are
proposed. A calendar is written only once every data group held here writes entry version
19 (ops.CALENDAR_SINCE): the metadata group has no entry versions of its own, so that is
the sign the cluster's nodes run a build that knows calendars (docs/decisions.md)."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from schedulerd import auth, jobspec, namespaces, views
from schedulerd.api import forward, inputs, jobs
from schedulerd.api.keys import NODE
from schedulerd.errors import Conflict, Elsewhere, InvalidRequest, LimitExceeded, NotFound, Unavailable
from schedulerd.node import Node
from schedulerd.raft.group import Group
from schedulerd.storage import calendars, cron, ops
from schedulerd.timefmt import to_iso
from schedulerd.topology import Topology

USED_BY_MAX = 10  # job ids a calendar's view names among those that use it
DEFAULT_TIMEZONE = "UTC"


def _topology(node: Node) -> Topology:
    if node.topology is None:
        raise Unavailable("this node has no metadata view yet")
    return node.topology


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not jobspec.CALENDAR_NAME_RE.match(name):
        raise InvalidRequest("a calendar's name is 1-64 characters of A-Z a-z 0-9 _ . -")
    return name


def view(name: str, calendar: dict[str, Any]) -> dict[str, Any]:
    """A calendar as the API shows it: its days as the merged ranges it stores."""
    return {"name": name, "timezone": calendar["timezone"],
            "dates": [{"from": first, "to": last} for first, last in calendar["ranges"]],
            "updated_at": to_iso(calendar["updated_us"])}


async def list_calendars(request: web.Request) -> web.Response:
    """Every calendar, by name (at most calendars_max: one page)."""
    inputs.check_query(request, frozenset())
    stored = _topology(request.app[NODE]).meta.calendars()
    return views.respond({"calendars": [view(name, stored[name]) for name in sorted(stored)]})


async def get(request: web.Request) -> web.Response:
    """One calendar, with the jobs that name it (of the namespaces the caller may use). A node
    asked for some groups' users (`groups=`, by a node gathering them) answers those alone."""
    node = request.app[NODE]
    inputs.check_query(request, frozenset({"groups"}))
    name = _name(request)
    local, _ = jobs.listed_groups(request, node)
    if "groups" in request.query:
        return views.respond({"name": name, "used_by": _local_users(request, node, local, name),
                              "groups_answered": [g.group_id for g in local]})
    calendar = _stored(node, name)
    return views.respond({**view(name, calendar), "used_by": await _users(request, node, name)})


async def put(request: web.Request) -> web.Response:
    node = request.app[NODE]
    limits = node.config.limits
    name = _name(request)
    inputs.check_query(request, frozenset())
    data = await inputs.body(request)
    unknown = sorted(data.keys() - {"timezone", "dates"})
    if unknown:
        raise InvalidRequest(f"unknown field(s) {', '.join(unknown)}; a calendar has timezone and dates")
    timezone = data.get("timezone", DEFAULT_TIMEZONE)
    if not isinstance(timezone, str):
        raise InvalidRequest("timezone must be an IANA zone name like 'Europe/Berlin'")
    try:
        cron.zone(timezone)
    except cron.ScheduleError as exc:
        raise InvalidRequest(f"timezone: {exc}") from None
    if "dates" not in data:
        raise InvalidRequest("dates is required: a list of \"YYYY-MM-DD\" days and {\"from\", \"to\"} ranges")
    try:
        ranges = calendars.normalise(data["dates"])
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    if len(ranges) > limits.calendar_ranges_max:
        raise LimitExceeded(f"the dates make {len(ranges)} disjoint ranges; calendar_ranges_max is "
                            f"{limits.calendar_ranges_max}")
    topology = _topology(node)
    stored = topology.meta.calendars()
    if name not in stored and len(stored) >= limits.calendars_max:
        raise LimitExceeded(f"there are {len(stored)} calendars; calendars_max is {limits.calendars_max}")
    _require_upgraded(node)
    result = await topology.propose_checked({"op": "calendar_set", "name": name, "timezone": timezone,
                                             "ranges": ranges, "calendars_max": limits.calendars_max})
    return views.respond(view(name, topology.meta.calendars()[name]), status=201 if result["created"] else 200)


async def delete(request: web.Request) -> web.Response:
    """Delete a calendar no job uses. A job created naming it while this runs is not seen:
    its claims then carry no calendar of that name, and it skips nothing (docs/semantics.md)."""
    node = request.app[NODE]
    inputs.check_query(request, frozenset())
    name = _name(request)
    _stored(node, name)
    _require_upgraded(node)
    used = await _users(request, node, name)
    if used:
        more = f" and {len(used) - 1} more" if len(used) > 1 else ""
        raise Conflict(f"calendar {name!r} is used by job {used[0]!r}{more}: change their skip_calendar first")
    await _topology(node).propose_checked({"op": "calendar_delete", "name": name})
    return views.respond({"name": name, "deleted": True})


def _stored(node: Node, name: str) -> dict[str, Any]:
    calendar = _topology(node).meta.calendars().get(name)
    if calendar is None:
        raise NotFound(f"no calendar {name!r}")
    return calendar


def _require_upgraded(node: Node) -> None:
    """Refuse (409) a calendar write before every data group held here writes version 19; a
    node that holds none sends the request to one that holds group 0 (api/forward.py)."""
    if not node.groups:
        raise Elsewhere(0)
    for group in node.groups:
        node.require_entry_version(group, ops.CALENDAR_SINCE, "a holiday calendar")


async def _users(request: web.Request, node: Node, name: str) -> list[str]:
    """Up to USED_BY_MAX ids of the jobs that name the calendar and may still run, over every
    data group (the ones held elsewhere asked of their holders), in id order."""
    local, elsewhere = jobs.listed_groups(request, node)
    found = _local_users(request, node, local, name)
    for answer in await forward.gather(request, elsewhere) if elsewhere else []:
        found += answer["used_by"]
    return sorted(found)[:USED_BY_MAX]


def _local_users(request: web.Request, node: Node, groups: list[Group], name: str) -> list[str]:
    principal = request.get(auth.PRINCIPAL)
    found: list[str] = []
    for group in groups:
        with node.read(group) as (txn, tables):
            found += calendars.users(txn, tables, name, USED_BY_MAX)
    return sorted(job_id for job_id in found if not isinstance(principal, auth.Principal)
                  or principal.may_use(namespaces.split(job_id)[0]))[:USED_BY_MAX]
