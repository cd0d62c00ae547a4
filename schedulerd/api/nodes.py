"""The handlers of the node registry's routes: a new node registered by a member (a join),
and a node drained and removed (`schedctl cluster remove-node`)."""
from __future__ import annotations

import re

import aiohttp
from aiohttp import web

from schedulerd import identity, views
from schedulerd.api import forward, inputs
from schedulerd.api.keys import NODE
from schedulerd.errors import Conflict, InvalidRequest, NotFound, Unavailable
from schedulerd.raft.conf import group_addr
from schedulerd.topology import Topology

PROBE_S = 3.0
_HOST_PORT = re.compile(r"[A-Za-z0-9.\-\[\]:]{1,253}:[0-9]{1,5}")


def _topology(request: web.Request) -> Topology:
    topology = request.app[NODE].topology
    if topology is None:
        raise Unavailable("this node has no topology yet")
    return topology


def _address(data: dict[str, object], name: str) -> str:
    value = inputs.string(data, name, max_len=260)
    if not _HOST_PORT.fullmatch(value):
        raise InvalidRequest(f"{name} must be HOST:PORT, not {value!r}")
    try:
        group_addr(value, 0)
    except ValueError as exc:
        raise InvalidRequest(f"{name}: {exc}") from None
    return value


async def register(request: web.Request) -> web.Response:
    """A node joining the cluster, registered by this member on its behalf."""
    topology = _topology(request)
    data = await inputs.body(request)
    node_id = inputs.string(data, "node_id", max_len=32)
    if not identity.NODE_ID_RE.fullmatch(node_id):
        raise InvalidRequest("node_id must be n- and 12 hex digits (the joining node's data dir holds it)")
    http, raft = _address(data, "http"), _address(data, "raft")
    await _answers_as(request, http, node_id)
    result = await topology.propose_checked({"op": "register", "node_id": node_id, "http": http, "raft": raft})
    return views.respond({"node_id": node_id, "joined": result["joined"]}, status=201 if result["joined"] else 200)


async def _answers_as(request: web.Request, http: str, node_id: str) -> None:
    """Register only a node this member can reach and that says it is `node_id`: a node that
    never comes up would be given a vote in the metadata group, and two such lose it its quorum."""
    scheme = "https" if request.app[NODE].config.http_tls else "http"
    try:
        async with request.app[forward.CLIENT].get(f"{scheme}://{http}/healthz",
                                                   timeout=aiohttp.ClientTimeout(total=PROBE_S)) as response:
            answer = await response.json(content_type=None) if response.status == 200 else None
    except (aiohttp.ClientError, OSError, ValueError, TimeoutError) as exc:
        raise Unavailable(f"node {node_id} is not reachable at http {http} from this member: {exc}") from None
    if not isinstance(answer, dict) or answer.get("node_id") != node_id:
        raise Conflict(f"the node at {http} is not {node_id}")


async def standing(request: web.Request) -> web.Response:
    """One node's state in the registry, asked without a token by a node that was away: a node
    taken out of the metadata group hears no more of it, so it learns here that it was
    declared dead or removed."""
    node_id = request.match_info["node_id"]
    known = _topology(request).meta.view()["nodes"].get(node_id)
    if known is None:
        raise NotFound(f"no node {node_id!r} in the registry")
    return views.respond({"node_id": node_id, "state": known["state"]})


async def remove(request: web.Request) -> web.Response:
    """Drain a node: its replicas move to the others, then it leaves the cluster."""
    topology = _topology(request)
    node_id = request.match_info["node_id"]
    known = topology.meta.view()["nodes"].get(node_id)
    if known is None:
        raise NotFound(f"no node {node_id!r} in the registry")
    if known["state"] not in ("draining", "removed"):
        await topology.propose_checked({"op": "set_state", "node_id": node_id, "state": "draining"})
    node = topology.meta.view()["nodes"][node_id]
    return views.respond({"node_id": node_id, "state": node["state"]}, status=202)
