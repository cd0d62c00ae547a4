"""Requests for data groups this node holds no replica of, sent on to a node that holds one.

A data group lives on R of the cluster's nodes, and a client may call any node. A handler
that needs a group it does not have raises Elsewhere; the middleware here sends the request,
as it came (method, path, query, body, credentials), to a holder and answers with that
node's answer. A batch spanning groups sends each holder its share (`send`), and a list
asks the holders of the groups it lacks for their part (`gather`).

A forwarded request carries FORWARDED and is never forwarded again: a node that finds the
placement moved under it answers 503 and the client retries. A write whose holder could not
be reached is tried on the next holder only if it was never sent; one sent without an answer
may have been applied and is answered as an unknown outcome."""
from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

import aiohttp
from aiohttp import web

from schedulerd import namespaces
from schedulerd.api.keys import NODE
from schedulerd.errors import Elsewhere, OutcomeUnknown, Unavailable, from_wire

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
FORWARDED = "X-Schedulerd-Forwarded"
# What a forwarded request keeps of the caller's headers.
_PASSED = ("Authorization", "Content-Type", "Accept", "Prefer", namespaces.HEADER, "Idempotency-Key", "traceparent",
           "tracestate")
TIMEOUT_S = 70.0  # above the longest long-poll a forwarded request may wait
CLIENT: web.AppKey[aiohttp.ClientSession] = web.AppKey("forward_client", aiohttp.ClientSession)


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Elsewhere as exc:
        if request.headers.get(FORWARDED):
            raise
        status, body, headers = await send(request, exc.group_id, request.method, request.path_qs,
                                           await request.read() if request.body_exists else None)
        return web.Response(status=status, body=body, headers=headers)


async def send(request: web.Request, group_id: int, method: str, path_qs: str,
               body: bytes | None) -> tuple[int, bytes, dict[str, str]]:
    """Send a request to a node holding `group_id`; (status, body, headers to pass back)."""
    node = request.app[NODE]
    holders = node.topology.holders(group_id) if node.topology is not None else []
    if not holders:
        raise Unavailable(f"group {group_id} has no replica on this node and no live node holds one")
    headers = {name: request.headers[name] for name in _PASSED if name in request.headers}
    headers[FORWARDED] = node.topology.node_id if node.topology is not None else "?"
    scheme = "https" if request.secure else "http"
    tried = []
    for http in holders:
        try:
            async with request.app[CLIENT].request(method, f"{scheme}://{http}{path_qs}", data=body,
                                                   headers=headers) as response:
                answer = await response.read()
                passed = {k: v for k, v in response.headers.items() if k in ("Content-Type", "Retry-After",
                                                                                 "Preference-Applied", "Location")}
                return response.status, answer, passed
        except aiohttp.ClientConnectorError as exc:
            tried.append(f"{http}: {exc.os_error or exc}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            if method in ("GET", "HEAD"):
                tried.append(f"{http}: {exc or type(exc).__name__}")
                continue
            raise OutcomeUnknown(f"group {group_id}'s node {http} did not answer ({exc or type(exc).__name__}); "
                                 "the request may have been applied: retry it with the same id") from None
    raise Unavailable(f"group {group_id}: no node holding it could be reached ({'; '.join(tried)})")


async def send_json(request: web.Request, group_id: int, path: str, payload: dict[str, Any]) -> dict[str, Any]:
    """POST a JSON body to a holder of `group_id` and return its JSON answer (errors raised as typed)."""
    status, body, _ = await send(request, group_id, "POST", path, json.dumps(payload).encode())
    return _decoded(status, body)


async def gather(request: web.Request, group_ids: list[int]) -> list[dict[str, Any]]:
    """The answers of holders to this GET, each asked for those of `group_ids` it holds
    (`groups=` in the query, answered in `groups_answered`), until every group is covered."""
    answers = []
    left = sorted(group_ids)
    while left:
        query = {**request.query, "groups": ",".join(str(g) for g in left)}
        status, body, _ = await send(request, left[0], "GET", str(request.rel_url.with_query(query)), None)
        answer = _decoded(status, body)
        covered = set(answer.get("groups_answered", ()))
        if left[0] not in covered:
            raise Unavailable(f"group {left[0]}: the node asked for it no longer holds it; retry")
        answers.append(answer)
        left = [g for g in left if g not in covered]
    return answers


def _decoded(status: int, body: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(body)
    except ValueError:
        raise Unavailable(f"a forwarded request got a {status} answer that is not JSON") from None
    if status >= 400:
        error = answer.get("error", {}) if isinstance(answer, dict) else {}
        raise from_wire(error.get("code", "internal"), error.get("message", f"status {status}"))
    if not isinstance(answer, dict):
        raise Unavailable(f"a forwarded request got a {status} answer that is not an object")
    return answer


async def open_client(app: web.Application) -> None:
    app[CLIENT] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))


async def close_client(app: web.Application) -> None:
    await app[CLIENT].close()
