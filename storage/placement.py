"""Where each Raft group's replicas live, and the next change that brings the cluster
closer to what it should be: every group on R live nodes, groups per node within one of
even, leaders per node within one of even.

A pure function of the registry and the placement (no clock, no I/O), so every replica
of the metadata group would plan the same and a test can drive it through any history.
The placement driver (the metadata group's leader) carries out a change, waits for it to
finish, and asks again.

The rules, in the order they are tried for each group:
1. A member on a dead or removed node is taken out first, before a replacement is added:
   a 3-member group with one dead member keeps a quorum of 2 on its live ones, while
   adding first would make it 4 members that need 3 acks, the new one's among them,
   before it has caught up.
2. A group with fewer than R members gets one on the least loaded live node it lacks.
3. A group with more than R members loses the one on a leaving (draining) node, or else
   the one on the most loaded node: the second step of a move.
4. A member on a draining node gets a replacement added (then rule 3 takes it out).
5. When groups per node differ by more than one, a group of the most loaded node is added
   to the least loaded one (then rule 3 takes it off the most loaded).
A live member is never taken out of a group that would then have fewer than R members
(or fewer than the live nodes, when there are not R of them); a group whose live members
are not a quorum is not changed at all (Raft could not commit the change: an operator
must act); and no group is changed while an earlier change to it is still under way."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, Mapping

NodeState = Literal["alive", "suspect", "dead", "draining", "removed"]
NODE_STATES: tuple[NodeState, ...] = ("alive", "suspect", "dead", "draining", "removed")
REPLICATION_FACTORS = (1, 3, 5)
# A suspect node keeps its replicas (it may be back in a moment) but is given no new ones.
_TAKES_REPLICAS = frozenset({"alive"})
# A node that serves keeps its replicas (and its metadata vote); a gone one never serves again.
SERVES = frozenset({"alive", "suspect", "draining"})
GONE = frozenset({"dead", "removed"})

Placement = Mapping[int, tuple[str, ...]]  # group -> member node ids


@dataclass(frozen=True)
class Change:
    """One membership change: add `node_id` to `group`, or remove it."""
    kind: Literal["add", "remove"]
    group: int
    node_id: str
    reason: str


@dataclass(frozen=True)
class LeaderMove:
    group: int
    to_node: str


def initial(node_ids: Iterable[str], groups: Iterable[int], replication_factor: int) -> dict[int, tuple[str, ...]]:
    """The bootstrap placement: each group on `replication_factor` nodes, round robin, so
    groups per node differ by at most one."""
    nodes = sorted(node_ids)
    if replication_factor > len(nodes):
        raise ValueError(f"replication factor {replication_factor} needs at least that many nodes, "
                         f"and {len(nodes)} were given")
    placement: dict[int, tuple[str, ...]] = {}
    for i, group in enumerate(sorted(groups)):
        placement[group] = tuple(sorted(nodes[(i * replication_factor + k) % len(nodes)]
                                        for k in range(replication_factor)))
    return placement


def loads(nodes: Mapping[str, NodeState], placement: Placement) -> dict[str, int]:
    """Replicas held by each node that holds or may take replicas."""
    count = {node_id: 0 for node_id, state in nodes.items() if state in SERVES}
    for members in placement.values():
        for node_id in members:
            if node_id in count:
                count[node_id] += 1
    return count


def target_size(nodes: Mapping[str, NodeState], replication_factor: int) -> int:
    """Members a group should have: R, or every node that keeps replicas when there are fewer.
    A suspect or draining node still counts: a group shrunk below R because one member
    went quiet for a few seconds, or because a drain had nowhere to go, would lose a copy
    for nothing (and with the quiet member dead, its quorum)."""
    return min(replication_factor, sum(1 for state in nodes.values() if state in SERVES)) or replication_factor


def plan(nodes: Mapping[str, NodeState], placement: Placement, replication_factor: int,
         busy: frozenset[int] = frozenset(), max_changes: int = 1) -> list[Change]:
    """Up to `max_changes` changes, each to a different group not in `busy`, repairs first."""
    load = loads(nodes, placement)
    size = target_size(nodes, replication_factor)
    changes: list[Change] = []
    for rule in (_remove_gone, _add_missing, _remove_extra, _replace_draining, _balance):
        for group in sorted(placement):
            if len(changes) >= max_changes:
                return changes
            if group in busy or any(c.group == group for c in changes) or not _has_quorum(placement[group], nodes):
                continue
            change = rule(group, placement[group], nodes, load, size)
            if change is not None:
                changes.append(change)
                load = _after(load, change)
    return changes


def _has_quorum(members: tuple[str, ...], nodes: Mapping[str, NodeState]) -> bool:
    """Raft commits a membership change only with a quorum of the current members."""
    return sum(1 for m in members if nodes.get(m, "removed") not in GONE) > len(members) // 2


def _after(load: dict[str, int], change: Change) -> dict[str, int]:
    if change.node_id not in load:
        return load
    return dict(load, **{change.node_id: load[change.node_id] + (1 if change.kind == "add" else -1)})


def _least_loaded(load: Mapping[str, int], nodes: Mapping[str, NodeState], exclude: Iterable[str]) -> str | None:
    skip = set(exclude)
    candidates = [(n, node_id) for node_id, n in load.items() if nodes[node_id] in _TAKES_REPLICAS and node_id not in skip]
    return min(candidates)[1] if candidates else None


def _remove_gone(group: int, members: tuple[str, ...], nodes: Mapping[str, NodeState],
                 load: Mapping[str, int], size: int) -> Change | None:
    gone = [m for m in members if nodes.get(m, "removed") in GONE]
    if gone:
        return Change("remove", group, min(gone), f"node {min(gone)} is {nodes.get(min(gone), 'removed')}")
    return None


def _add_missing(group: int, members: tuple[str, ...], nodes: Mapping[str, NodeState],
                 load: Mapping[str, int], size: int) -> Change | None:
    if len(members) >= size or any(nodes.get(m, "removed") in GONE for m in members):
        return None
    target = _least_loaded(load, nodes, members)
    return None if target is None else Change("add", group, target, f"{len(members)} of {size} replicas")


def _remove_extra(group: int, members: tuple[str, ...], nodes: Mapping[str, NodeState],
                  load: Mapping[str, int], size: int) -> Change | None:
    if len(members) <= size:
        return None
    leaving = sorted(m for m in members if nodes.get(m) == "draining")
    if leaving:
        return Change("remove", group, leaving[0], f"node {leaving[0]} is draining")
    victim = max(members, key=lambda m: (load.get(m, 0), m))
    return Change("remove", group, victim, f"{len(members)} replicas, {size} wanted")


def _replace_draining(group: int, members: tuple[str, ...], nodes: Mapping[str, NodeState],
                      load: Mapping[str, int], size: int) -> Change | None:
    if not any(nodes.get(m) == "draining" for m in members):
        return None
    target = _least_loaded(load, nodes, members)
    return None if target is None else Change("add", group, target, "a replacement for a draining node")


def _balance(group: int, members: tuple[str, ...], nodes: Mapping[str, NodeState],
             load: Mapping[str, int], size: int) -> Change | None:
    takers = {node_id: n for node_id, n in load.items() if nodes[node_id] in _TAKES_REPLICAS}
    if len(members) != size or not takers:
        return None
    heaviest = max(takers.values())
    if not any(load.get(m) == heaviest for m in members):
        return None
    target = _least_loaded(takers, nodes, members)
    if target is None or heaviest - takers[target] <= 1:
        return None
    return Change("add", group, target, f"balance: {heaviest} replicas on one node, {takers[target]} on {target}")


def is_balanced(nodes: Mapping[str, NodeState], placement: Placement, replication_factor: int) -> bool:
    """Every group on its target number of distinct nodes that take replicas, and groups per
    such node within one of even."""
    size = target_size(nodes, replication_factor)
    for members in placement.values():
        if len(set(members)) != len(members) or len(members) != size \
                or any(nodes.get(m) not in _TAKES_REPLICAS for m in members):
            return False
    takers = [n for node_id, n in loads(nodes, placement).items() if nodes[node_id] in _TAKES_REPLICAS]
    return not takers or max(takers) - min(takers) <= 1


def leader_moves(placement: Placement, leaders: Mapping[int, str], nodes: Mapping[str, NodeState]) -> list[LeaderMove]:
    """Leadership transfers that bring leaders per node within one of even: one at a time,
    from a node with the most to a member of that group with the fewest."""
    count = {node_id: 0 for node_id, state in nodes.items() if state in _TAKES_REPLICAS}
    for group, leader in leaders.items():
        if leader in count:
            count[leader] += 1
    if not count:
        return []
    for group in sorted(leaders):
        leader = leaders[group]
        if leader not in count or count[leader] < max(count.values()):
            continue
        options = [(count[m], m) for m in placement.get(group, ()) if m in count and m != leader]
        if options and count[leader] - min(options)[0] > 1:
            return [LeaderMove(group, min(options)[1])]
    return []


def preferred_leaders(placement: Placement, nodes: Mapping[str, NodeState]) -> dict[int, str]:
    """The member of each group that should lead it: leaders per node that takes replicas
    within one of even (when the placement allows it). Every node computes the same from
    the same placement, so each group's leader alone can tell whether to hand over.

    Greedy in group order (each group to its member leading fewest so far), then the moves
    of leader_moves until there are none."""
    count = {node_id: 0 for node_id, state in nodes.items() if state in _TAKES_REPLICAS}
    chosen: dict[int, str] = {}
    for group in sorted(placement):
        options = sorted((count[m], m) for m in placement[group] if m in count)
        if options:
            chosen[group] = options[0][1]
            count[options[0][1]] += 1
    for _ in range(len(chosen) * len(count)):
        moves = leader_moves(placement, chosen, nodes)
        if not moves:
            break
        chosen[moves[0].group] = moves[0].to_node
    return chosen
