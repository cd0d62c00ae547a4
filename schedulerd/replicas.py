"""This node's data-group replicas kept to the placement: a replica starts when the
placement gives this node a group (or a change under way adds it), and stops and is deleted
once the placement no longer lists it.

Taking a replica away is the step that must never act on an old view: a replica of the
metadata group that has not caught up could still show a placement from before this node
was added. So a replica is dropped only while this node's metadata replica is current and
after the placement has left it out for DROP_AFTER_S."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from schedulerd.raft.conf import group_addr
from schedulerd.storage import meta

if TYPE_CHECKING:
    from schedulerd.node import Node

log = logging.getLogger("schedulerd.topology")

DROP_AFTER_S = 3.0


def wanted(view: dict[str, Any], node_id: str) -> dict[int, bool]:
    """The data groups this node should hold a replica of, each with whether it is joining
    (being added by a change under way) rather than placed."""
    out = {g: False for g, members in meta.data_placement(view).items() if node_id in members}
    for key, change in view["changes"].items():
        if key != meta.META and change["kind"] == "add" and change["node_id"] == node_id:
            out[int(key)] = True
    return out


def peers_of(view: dict[str, Any], group: int, node_id: str) -> list[str]:
    """The other members' Raft addresses in `group`, as the placement lists them."""
    nodes = view["nodes"]
    return sorted(group_addr(nodes[m]["raft"], group) for m in view["placement"][str(group)] if m != node_id)


class Replicas:
    def __init__(self, node: "Node", node_id: str) -> None:
        self.node = node
        self.node_id = node_id
        self._unwanted_since: dict[int, float] = {}

    def reconcile(self, view: dict[str, Any], current: bool) -> None:
        """Start what the placement gives this node, drop what it took away (see above)."""
        if view["cluster"] is None:
            return
        want = wanted(view, self.node_id)
        self.node.leaving = frozenset(
            {g.group_id for g in self.node.groups if g.group_id not in want}
            | {int(key) for key, change in view["changes"].items()
               if key != meta.META and change["kind"] == "remove" and change["node_id"] == self.node_id})
        for group_id, joining in sorted(want.items()):
            if self.node.local_group(group_id) is None:
                self.node.start_group(group_id, peers_of(view, group_id, self.node_id), joining)
        now = time.monotonic()
        for group in self.node.groups:
            group_id = group.group_id
            if group_id in want or not current:
                self._unwanted_since.pop(group_id, None)
                continue
            since = self._unwanted_since.setdefault(group_id, now)
            if now - since >= DROP_AFTER_S:
                log.info("replica_not_placed group=%d epoch=%d: dropping it", group_id, view["epoch"])
                self._unwanted_since.pop(group_id, None)
                self.node.drop_group(group_id)
