"""The metadata group's state machine: the cluster's shape, the node registry and where
each data group's replicas live.

Pure, like the rest of storage/: `apply(state, command)` changes a plain dict and answers
a result; the time and every id arrive in the command. The state is small (a few kB per
hundred nodes), held whole in memory and snapshotted whole.

A membership change of a group is two entries: `begin_change` records it (one per group at
a time, and only against the placement epoch the planner saw), the placement driver carries
it out in the group's own Raft log, and `end_change` records how it ended; only a change
that ended well moves the group's members and the epoch.

It also holds the named holiday calendars (storage/calendars.py), which the data groups'
leaders copy into the claim entries of the jobs that name one, and the queues' limits
(storage/queue_limits.py), which the nodes copy into their lease entries."""
from __future__ import annotations

import copy
from typing import Any

from schedulerd.storage import placement

# Which state a node may go to from each: a dead node's replicas are re-created elsewhere,
# so it never serves again (it is removed once out of every group); a drain can be called off.
TRANSITIONS: dict[str, frozenset[str]] = {
    "alive": frozenset({"suspect", "dead", "draining", "removed"}),
    "suspect": frozenset({"alive", "dead", "draining", "removed"}),
    "draining": frozenset({"alive", "removed"}),
    "dead": frozenset({"removed"}),
    "removed": frozenset(),
}
META = "meta"  # the metadata group's key in the placement, beside the data groups' numbers
META_REPLICAS = (3, 5)


def empty() -> dict[str, Any]:
    return {"cluster": None, "epoch": 0, "nodes": {}, "placement": {}, "changes": {},
            "moves": {"done": 0, "failed": 0}, "calendars": {}, "queue_limits": {}, "queue_limits_revision": 0}


def apply(state: dict[str, Any], command: dict[str, Any]) -> dict[str, Any]:
    """Apply one command to `state` in place; a refused command changes nothing."""
    handler = _HANDLERS.get(command.get("op", ""))
    if handler is None:
        return _refused(f"unknown op {command.get('op')!r}; known: {sorted(_HANDLERS)}")
    if command["op"] not in ("bootstrap", "register") and state["cluster"] is None:
        return _refused("the cluster is not bootstrapped")
    scratch = copy.deepcopy(state)
    result = handler(scratch, command)
    if result["ok"]:
        state.clear()
        state.update(scratch)
    return result


def _refused(error: str) -> dict[str, Any]:
    return {"ok": False, "error": error}


def _bootstrap(state: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """Fix the cluster's shape and place the groups on the nodes it starts with, once each
    of them registered (by its Raft address: every node computes the same first placement
    from the same peer list before the metadata exists, placement.initial over the sorted
    addresses, and the entry records that placement by node id)."""
    if state["cluster"] is not None:
        return _refused("the cluster is already bootstrapped")
    addrs = sorted(c["raft_addrs"])
    rf, groups, meta_n = c["replication_factor"], c["groups"], c["meta_replicas"]
    if rf not in placement.REPLICATION_FACTORS:
        return _refused(f"replication_factor must be one of {placement.REPLICATION_FACTORS}, not {rf}")
    if len(set(addrs)) != len(addrs):
        return _refused("the Raft addresses must be distinct")
    if meta_n not in META_REPLICAS:
        return _refused(f"meta_replicas must be one of {META_REPLICAS}, not {meta_n}")
    if not 1 <= groups <= 1024:
        return _refused(f"groups must be within 1..1024, not {groups}")
    if len(addrs) < rf:
        return _refused(f"replication factor {rf} needs at least {rf} nodes; {len(addrs)} given")
    by_raft = {n["raft"]: node_id for node_id, n in state["nodes"].items()}
    missing = [a for a in addrs if a not in by_raft]
    if missing:
        return _refused(f"waiting for {', '.join(missing)} to register")
    state["cluster"] = {"cluster_id": c["cluster_id"], "groups": groups, "replication_factor": rf,
                        "meta_replicas": meta_n, "created_us": c["now"]}
    layout = placement.initial(addrs, range(groups), rf)
    state["placement"] = {str(g): sorted(by_raft[a] for a in members) for g, members in layout.items()}
    state["placement"][META] = sorted(by_raft[a] for a in addrs)  # every first node; the driver trims it
    state["epoch"] = 1
    return {"ok": True, "epoch": 1}


def _node(n: dict[str, Any], now: int) -> dict[str, Any]:
    return {"node_id": n["node_id"], "http": n["http"], "raft": n["raft"], "state": "alive",
            "since_us": now, "joined_us": now}


def _register(state: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """A node says where it is. A new id on the Raft address of a node still counted in is
    that machine with a wiped disk (one process at a time listens on an address): the old
    node is dead, its replicas are re-created elsewhere, and the new one joins afresh."""
    node_id, raft = c["node_id"], c["raft"]
    known = state["nodes"].get(node_id)
    if known is None:
        for other in state["nodes"].values():
            if other["raft"] == raft and other["state"] not in ("dead", "removed"):
                other["state"], other["since_us"] = "dead", c["now"]
        state["nodes"][node_id] = _node(c, c["now"])
        return {"ok": True, "joined": True}
    if known["state"] in ("dead", "removed"):
        return _refused(f"node {node_id} is {known['state']}: wipe its data dir and join it as a new node")
    if known["raft"] != raft:
        return _refused(f"node {node_id} is known at Raft address {known['raft']}, not {raft}: "
                        "a node keeps its Raft address (join it as a new node to move it)")
    known["http"] = c["http"]
    if known["state"] == "suspect":
        known["state"], known["since_us"] = "alive", c["now"]
    return {"ok": True, "joined": False}


def _set_state(state: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    node = state["nodes"].get(c["node_id"])
    if node is None:
        return _refused(f"no node {c['node_id']!r}")
    to = c["state"]
    if to not in TRANSITIONS[node["state"]]:
        allowed = sorted(TRANSITIONS[node["state"]]) or "nothing"
        return _refused(f"node {c['node_id']} is {node['state']} and can go to {allowed}, not {to}")
    if to == "removed" and any(c["node_id"] in members for members in data_placement(state).values()):
        return _refused(f"node {c['node_id']} still holds replicas: drain it first")
    node["state"], node["since_us"] = to, c["now"]
    return {"ok": True}


def _begin_change(state: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    group, kind, node_id = str(c["group"]), c["kind"], c["node_id"]
    if group not in state["placement"]:
        return _refused(f"no group {group}")
    if c["epoch"] != state["epoch"]:
        return _refused(f"placement epoch is {state['epoch']}, the change was planned at {c['epoch']}")
    if group in state["changes"]:
        return _refused(f"group {group} has a change under way: {state['changes'][group]}")
    members = state["placement"][group]
    if kind == "add":
        node = state["nodes"].get(node_id)
        if node is None or node["state"] != "alive":
            return _refused(f"node {node_id} is not alive: it takes no replica")
        if node_id in members:
            return _refused(f"node {node_id} is already in group {group}")
    elif kind == "remove":
        if node_id not in members:
            return _refused(f"node {node_id} is not in group {group}")
    else:
        return _refused(f"kind must be add or remove, not {kind!r}")
    state["changes"][group] = {"kind": kind, "node_id": node_id, "started_us": c["now"], "reason": c["reason"]}
    return {"ok": True}


def _end_change(state: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """Record how a change ended; `started_us` names the change, so a late report of an
    earlier one cannot end a later change to the same group."""
    group = str(c["group"])
    change = state["changes"].get(group)
    if change is None:
        return _refused(f"group {group} has no change under way")
    if change["started_us"] != c["started_us"]:
        return _refused(f"group {group}'s change under way began at {change['started_us']}, not {c['started_us']}")
    del state["changes"][group]
    if not c["done"]:
        state["moves"]["failed"] += 1
        return {"ok": True, "epoch": state["epoch"]}
    members = state["placement"][group]
    if change["kind"] == "add":
        members.append(change["node_id"])
        members.sort()
    else:
        members.remove(change["node_id"])
    state["epoch"] += 1
    state["moves"]["done"] += 1
    return {"ok": True, "epoch": state["epoch"]}


def _calendar_set(state: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """Create or replace a calendar; its days come normalised (calendars.normalise) from the
    API. The count limit travels in the command, so every replica judges it alike."""
    calendars = state["calendars"]
    name = c["name"]
    created = name not in calendars
    if created and len(calendars) >= c["calendars_max"]:
        return _refused(f"there are {len(calendars)} calendars, the most calendars_max allows")
    calendars[name] = {"timezone": c["timezone"], "ranges": c["ranges"], "updated_us": c["now"]}
    return {"ok": True, "created": created}


def _calendar_delete(state: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    if state["calendars"].pop(c["name"], None) is None:
        return _refused(f"no calendar {c['name']!r}")
    return {"ok": True}


def _queue_limits_set(state: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """Set or lift a queue's limits (validated by the API). Each write takes the next revision,
    by which the data groups tell newer limits from older; lifted limits stay as a revision with
    none, so a lease entry still carrying the older ones cannot bring them back."""
    limits = state["queue_limits"]
    queue = c["queue"]
    lifted = c["max_running"] is None and c["max_starts_per_s"] is None
    in_use = sum(1 for q, limit in limits.items() if q != queue and limited(limit))
    if not lifted and in_use >= c["queue_limits_max"]:
        return _refused(f"{in_use} queues have limits, the most queue_limits_max allows")
    state["queue_limits_revision"] += 1
    limits[queue] = {"max_running": c["max_running"], "max_starts_per_s": c["max_starts_per_s"],
                     "revision": state["queue_limits_revision"], "updated_us": c["now"]}
    return {"ok": True, "revision": state["queue_limits_revision"]}


def limited(limit: dict[str, Any]) -> bool:
    """Whether a queue's stored limits limit anything (a lifted one stays, with none)."""
    return limit["max_running"] is not None or limit["max_starts_per_s"] is not None


_HANDLERS = {"bootstrap": _bootstrap, "register": _register, "set_state": _set_state,
             "begin_change": _begin_change, "end_change": _end_change,
             "calendar_set": _calendar_set, "calendar_delete": _calendar_delete,
             "queue_limits_set": _queue_limits_set}


def data_placement(state: dict[str, Any]) -> dict[int, tuple[str, ...]]:
    """The data groups' members, as storage/placement.py plans over them."""
    return {int(g): tuple(m) for g, m in state["placement"].items() if g != META}


def planned_placement(state: dict[str, Any]) -> dict[int, tuple[str, ...]]:
    """The data groups' members as they will be once every change under way has ended well:
    what the planner counts loads on, so two changes planned a moment apart do not both
    take a replica off the same node."""
    out = data_placement(state)
    for key, change in state["changes"].items():
        if key == META:
            continue
        members = set(out[int(key)])
        if change["kind"] == "add":
            members.add(change["node_id"])
        else:
            members.discard(change["node_id"])
        out[int(key)] = tuple(sorted(members))
    return out


def node_states(state: dict[str, Any]) -> dict[str, placement.NodeState]:
    return {node_id: node["state"] for node_id, node in state["nodes"].items()}
