"""The handlers of the worker routes: poll, heartbeat, ack, nack, single and batch (the
table is api/routes.py)."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from schedulerd import auth, jobspec, namespaces, tracing, views
from schedulerd.api import forward, inputs
from schedulerd.api.keys import COMMITS, LEASES, NODE
from schedulerd.coalescer import Coalescer
from schedulerd.errors import InvalidRequest, NotFound, from_wire
from schedulerd.node import Node
from schedulerd.raft.group import Group
from schedulerd.storage import queries, records
from schedulerd.storage.ops import Op
from schedulerd.timefmt import to_iso
from schedulerd.units import US_PER_S

# Appended to a run id outside the caller's namespace: no stored run has it, so apply answers not_found.
HIDDEN = "~"


async def poll(request: web.Request) -> web.Response:
    node = request.app[NODE]
    limits = node.config.limits
    leases = request.app[LEASES]
    data = await inputs.body(request)
    worker_id = inputs.string(data, "worker_id", max_len=128)
    queues = inputs.items(data, "queues", max_items=limits.poll_queues_max, limit_name="poll_queues_max")
    if not all(isinstance(q, str) and jobspec.QUEUE_RE.fullmatch(q) for q in queues):
        raise InvalidRequest("queues must be a list of queue names, each 1-64 characters of A-Z a-z 0-9 _ . -")
    max_tasks = inputs.integer(data, "max_tasks", low=1, high=limits.lease_batch_max, default=1,
                               limit_name="lease_batch_max")
    wait_s = inputs.number(data, "wait_s", low=0, high=limits.long_poll_s_max, default=0,
                           limit_name="long_poll_s_max")
    namespace = namespaces.of_request(request)
    tasks = await leases.poll(worker_id, [namespaces.inside(namespace, q) for q in dict.fromkeys(queues)],
                              max_tasks, wait_s)
    return web.Response(text=views.tasks_json(tasks, node.now_us()), content_type="application/json")


async def heartbeat_one(request: web.Request) -> web.Response:
    node = request.app[NODE]
    data = await inputs.body(request)
    node.group_of_run(request.match_info["run_id"])  # a run whose group is elsewhere: the request goes there
    result = (await _heartbeat(request, inputs.string(data, "worker_id", max_len=128),
                               _mine(node, request, [(request.match_info["run_id"], inputs.fence(data))]), []))[0]
    if not result["ok"]:
        raise from_wire(result["error"]["code"], result["error"]["message"])
    return views.respond({"lease_until": result["lease_until"], "now": to_iso(node.now_us())})


async def heartbeat_batch(request: web.Request) -> web.Response:
    node = request.app[NODE]
    limits = node.config.limits
    data = await inputs.body(request)
    worker_id = inputs.string(data, "worker_id", max_len=128)
    raw = inputs.items(data, "leases", max_items=limits.ack_batch_max, limit_name="ack_batch_max")
    pairs = [(inputs.string(item, "run_id"), inputs.fence(item)) for item in _objects(raw, "leases")]
    results = await _heartbeat(request, worker_id, _mine(node, request, pairs), raw)
    return views.respond({"results": results, "now": to_iso(node.now_us())})


async def ack_one(request: web.Request) -> web.Response:
    node = request.app[NODE]
    limits = node.config.limits
    data = await inputs.body(request)
    item = (request.match_info["run_id"], inputs.fence(data), inputs.result_json(data, limits.result_bytes_max))
    node.group_of_run(item[0])  # a run whose group is elsewhere: the request goes there
    result = (await _ack(request, inputs.string(data, "worker_id", max_len=128), _mine(node, request, [item]), []))[0]
    if not result["ok"]:
        raise from_wire(result["error"]["code"], result["error"]["message"])
    return views.respond({"run": result["run"]})


async def ack_batch(request: web.Request) -> web.Response:
    node = request.app[NODE]
    limits = node.config.limits
    data = await inputs.body(request)
    worker_id = inputs.string(data, "worker_id", max_len=128)
    raw = inputs.items(data, "acks", max_items=limits.ack_batch_max, limit_name="ack_batch_max")
    acks = [(inputs.string(item, "run_id"), inputs.fence(item), inputs.result_json(item, limits.result_bytes_max))
            for item in _objects(raw, "acks")]
    results = await _ack(request, worker_id, _mine(node, request, acks), raw, with_runs=False)
    return views.respond({"results": results})


async def nack(request: web.Request) -> web.Response:
    node = request.app[NODE]
    limits = node.config.limits
    data = await inputs.body(request)
    run_id = _mine(node, request, [(request.match_info["run_id"],)])[0][0]
    error = data.get("error", "")
    if not isinstance(error, str):
        raise InvalidRequest("error must be a string")
    group = _group(node, run_id)
    result = await node.propose(group, Op.NACK, {
        "worker_id": inputs.string(data, "worker_id", max_len=128), "run_id": run_id,
        "fence": inputs.fence(data), "error": error[: limits.error_chars_max] or "nack without error text"})
    if not result["ok"]:
        raise from_wire(result["code"], result["message"])
    return views.respond({"run": views.run(result["run"])})


def _objects(raw: list[Any], name: str) -> list[dict[str, Any]]:
    if not all(isinstance(item, dict) for item in raw):
        raise InvalidRequest(f"each item of {name} must be an object")
    return raw


def _group(node: Node, run_id: str) -> Group:
    group = node.group_of_run(run_id)
    if group is None:
        raise NotFound(f"no run {run_id!r}")
    return group


def _mine(node: Node, request: web.Request, items: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The items (run id first) with the run id of any run outside the request's namespace
    replaced by one that does not exist: the caller hears not_found, as for a wrong guess.
    A token for every namespace skips the reads: it could act in any of them anyway."""
    namespace = namespaces.of_request(request)  # read first: a malformed header is refused on every path
    principal = request.get(auth.PRINCIPAL)
    if not isinstance(principal, auth.Principal) or auth.ALL_NAMESPACES in principal.namespaces:
        return items
    out = []
    for item in items:
        group_id = node.group_id_of_run(item[0])
        group = None if group_id is None else node.local_group(group_id)  # elsewhere: its holder checks
        rec = None
        if group is not None:
            with node.read(group) as (txn, tables):
                rec = records.get_run(records.Reader(txn, tables), item[0])
        if rec is not None and not namespaces.holds(namespace, rec["job_id"]):
            item = (f"{item[0]}{HIDDEN}", *item[1:])
        out.append(item)
    return out


def _by_group(node: Node, items: list[tuple[Any, ...]], out: list[dict[str, Any]]) -> dict[int, list[int]]:
    """Positions of items per group (the first field of an item is its run id). An item
    whose run id no run can have gets its not_found result in `out` at once."""
    groups: dict[int, list[int]] = {}
    for position, item in enumerate(items):
        group_id = node.group_id_of_run(item[0])
        if group_id is None:
            out[position] = {"run_id": item[0], "ok": False,
                             "error": {"code": NotFound.code, "message": f"no run {item[0]!r}"}}
        else:
            groups.setdefault(group_id, []).append(position)
    return groups


async def _shares(request: web.Request, worker_id: str, items: list[tuple[Any, ...]], raw: list[Any], field: str,
                  submit: Any) -> list[dict[str, Any]]:
    """Per item its result: a group held here through `submit(group, positions)`, which
    fills the results; another group's share (its raw items) sent to a node holding it."""
    node = request.app[NODE]
    out: list[dict[str, Any]] = [{}] * len(items)
    for group_id, positions in _by_group(node, items, out).items():
        group = node.local_group(group_id)
        if group is not None:
            await submit(group, positions, out)
            continue
        share = await forward.send_json(request, group_id, request.path_qs,
                                        {"worker_id": worker_id, field: [raw[p] for p in positions]})
        for position, r in zip(positions, share["results"]):
            out[position] = r
    return out


def _trace_settled(node: Node, group: Group, runs: list[dict[str, Any]]) -> None:
    """The ack's span, linked to each acked run's job's trace context (read only when tracing is on)."""
    with node.read(group) as (txn, tables):
        parts = queries.task_parts(txn, tables, [run["job_id"] for run in runs])
    tracing.record("ack", "settle", "SERVER", [(run["run_id"], run["queue"], parts[run["job_id"]]) for run in runs])


def _item_result(r: dict[str, Any]) -> dict[str, Any]:
    if r["ok"]:
        return {"run_id": r["run_id"], "ok": True}
    return {"run_id": r["run_id"], "ok": False, "error": {"code": r["code"], "message": r["message"]}}


class TaskCommits:
    """Acks and heartbeats of all workers on this node, coalesced into Raft entries."""

    def __init__(self, node: Node) -> None:
        def lease_extension(group: Group, items: list[Any]) -> dict[str, Any]:
            now = node.now_us()
            return {"now": now, "lease_until": now + int(node.config.lease_s * US_PER_S)}

        limits = node.config.limits
        batch = limits.ack_entry_weight_max
        self.acks = Coalescer(node.propose, Op.ACK, "acks", "results", batch,
                              weight=lambda ack: 1 + len(ack[2] or "") // limits.ack_weight_bytes)
        self.heartbeats = Coalescer(node.propose, Op.HEARTBEAT, "leases", "results", batch, lease_extension)


async def _heartbeat(request: web.Request, worker_id: str, pairs: list[tuple[str, int]],
                     raw: list[Any]) -> list[dict[str, Any]]:
    commits = request.app[COMMITS]

    async def submit(group: Group, positions: list[int], out: list[dict[str, Any]]) -> None:
        results = await commits.heartbeats.submit(group, [[*pairs[p], worker_id] for p in positions])
        for position, r in zip(positions, results):
            out[position] = _item_result(r)
            if r["ok"]:
                out[position]["lease_until"] = to_iso(r["lease_until_us"])

    return await _shares(request, worker_id, pairs, raw, "leases", submit)


async def _ack(request: web.Request, worker_id: str, acks: list[tuple[str, int, str | None]], raw: list[Any],
               with_runs: bool = True) -> list[dict[str, Any]]:
    """Per ack its result; with_runs adds the acked run's view (the batch route answers without)."""
    commits = request.app[COMMITS]

    async def submit(group: Group, positions: list[int], out: list[dict[str, Any]]) -> None:
        results = await commits.acks.submit(group, [[*acks[p], worker_id] for p in positions])
        if tracing.on():
            _trace_settled(request.app[NODE], group, [r["run"] for r in results if r["ok"]])
        for position, r in zip(positions, results):
            out[position] = _item_result(r)
            if r["ok"] and with_runs:
                out[position]["run"] = views.run(r["run"])

    return await _shares(request, worker_id, acks, raw, "acks", submit)
