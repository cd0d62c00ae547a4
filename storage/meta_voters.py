"""Which nodes vote in the metadata group: `meta_replicas` of them (3 or 5, fixed at
bootstrap) once the cluster has that many, an odd number in between; every other node
follows the group's log without a vote (an observer), so it still knows the registry
and the placement and is still heard from by the leader.

Pure, like placement.py: the placement driver asks for the next change, carries it out,
and asks again. The rules, in order:
1. A voter on a dead or removed node is taken out (before a replacement is added: a
   3-voter group with one dead keeps its quorum of 2 on its live voters).
2. Below the target, or with a voter draining and a node to replace it, the lowest-id
   alive node that does not vote is added.
3. Above the target, a voter is taken out: a draining one first, then a suspect one,
   then the highest id; the leader last among equals (it must hand over first).
Nothing changes when the live voters are not a quorum (Raft could not commit the change:
an operator must act)."""
from __future__ import annotations

from typing import Any, Literal, Mapping, Sequence

from schedulerd.storage.placement import GONE, SERVES, NodeState

# Every node that serves counts towards the target: a suspect node may be back in a
# moment, and a draining one keeps its vote until it is removed, unless a node can take
# its place (it does not stay).
_STAYS = frozenset({"alive", "suspect"})

VoterChange = tuple[Literal["add", "remove"], str, str]  # kind, node id, reason


def target(nodes: Mapping[str, NodeState], meta_replicas: int) -> int:
    """How many voters the metadata group should have with these nodes: `meta_replicas`
    when there are that many, else the largest odd number of nodes there are (one or
    two nodes: all of them)."""
    counted = sum(1 for state in nodes.values() if state in SERVES)
    size = min(meta_replicas, counted)
    return size if size < 3 or size % 2 == 1 else size - 1


def next_change(nodes: Mapping[str, NodeState], voters: Sequence[str], meta_replicas: int,
                leader: str | None) -> VoterChange | None:
    """The next change to the metadata group's voters (see the module's rules), or None."""
    live = [v for v in voters if nodes.get(v) in SERVES]
    if len(live) <= len(voters) // 2:
        return None
    gone = sorted(v for v in voters if nodes.get(v) in GONE or v not in nodes)
    if gone:
        return "remove", gone[0], f"node {gone[0]} is {nodes.get(gone[0], 'unknown')}"
    want = target(nodes, meta_replicas)
    staying = [v for v in voters if nodes.get(v) in _STAYS]
    candidates = sorted(n for n, state in nodes.items() if state == "alive" and n not in voters)
    if candidates and (len(voters) < want or len(staying) < want):
        reason = "fewer voters than the target" if len(voters) < want else "a voter is draining"
        return "add", candidates[0], reason
    if len(voters) > want:  # every voter serves here: the gone ones were taken out first
        order = {"draining": 0, "suspect": 1, "alive": 2}
        ranked = sorted(sorted(voters, reverse=True), key=lambda v: (order[nodes[v]], v == leader))
        return "remove", ranked[0], f"more voters than the target of {want}"
    return None


def votes(view: Mapping[str, Any], node_id: str) -> bool | None:
    """Whether node `node_id` should run its metadata replica as a voter, from the
    placement and the voter change under way (a node being added votes, one being taken
    out stops first, so it never stands for election outside the group); None before the
    cluster is bootstrapped."""
    members = view["placement"].get("meta")
    if view["cluster"] is None or members is None:
        return None
    change = view["changes"].get("meta")
    if change is not None and change["node_id"] == node_id:
        return bool(change["kind"] == "add")
    return node_id in members
