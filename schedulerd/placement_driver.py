"""The placement driver, on the metadata group's leader: it turns storage/placement.py's plan
into changes under way (`begin_change`, carried out by each group's leader, see
group_changes.py), moves the metadata group's own members, and retires drained nodes.

Guard rails, as Consul's autopilot keeps them: a change begins only against the placement
epoch it was planned at; one change per group at a time and at most
`placement_changes_max` at once; nothing changes a group whose live members are not a
quorum; the metadata group's voters follow storage/meta_voters.py, one change at a time."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from schedulerd.config import NodeConfig
from schedulerd.raft.conf import group_addr
from schedulerd.raft.meta_group import MetaGroup
from schedulerd.storage import meta, meta_voters, placement

log = logging.getLogger("schedulerd.topology")

Propose = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class PlacementDriver:
    def __init__(self, config: NodeConfig, meta_group: MetaGroup, propose: Propose) -> None:
        self.config = config
        self.meta = meta_group
        self._propose = propose

    async def step(self, view: dict[str, Any]) -> None:
        """One pass on the metadata leader; the topology loop calls it on every change it hears."""
        await self._move_meta_members(view)
        await self._begin_data_changes(view)
        await self._retire_drained(view)

    def _meta_addr(self, view: dict[str, Any], node_id: str) -> str:
        return group_addr(view["nodes"][node_id]["raft"], self.config.raft.groups)

    async def _move_meta_members(self, view: dict[str, Any]) -> None:
        """Keep the metadata group's voters to storage/meta_voters.py: carried out here, by
        the group's own leader. The node being added or taken out switches its own replica
        to a voter or an observer as soon as it sees the change begun (topology.py)."""
        change = view["changes"].get(meta.META)
        if change is None:
            change = await self._begin_meta_change(view)
            if change is None:
                return
        address = self._meta_addr(view, change["node_id"])
        if change["kind"] == "remove" and address == self.meta.self_addr:
            log.info("meta_leadership_handover reason='this node leaves the metadata group'")
            self.meta.request_step_down()
            return
        if (address in self.meta.members()) != (change["kind"] == "add"):
            await asyncio.wait_for(self.meta.change_members(change["kind"], address, asyncio.get_running_loop()),
                                   self.config.propose_timeout_s)
        result = await self._propose({"op": "end_change", "group": meta.META, "done": True,
                                      "started_us": change["started_us"]})
        log.info("meta_membership_change kind=%s node_id=%s %s", change["kind"], change["node_id"],
                 "done" if result["ok"] else result["error"])

    async def _begin_meta_change(self, view: dict[str, Any]) -> dict[str, Any] | None:
        by_meta_addr = {self._meta_addr(view, n): n for n in view["nodes"]}
        leader = by_meta_addr.get(self.meta.self_addr)
        change = meta_voters.next_change(meta.node_states(view), view["placement"][meta.META],
                                         view["cluster"]["meta_replicas"], leader)
        if change is None:
            return None
        kind, node_id, reason = change
        command = {"op": "begin_change", "group": meta.META, "kind": kind, "node_id": node_id,
                   "epoch": view["epoch"], "reason": reason}
        result = await self._propose(command)
        if not result["ok"]:
            log.info("meta_change_not_begun %s: %s", command, result["error"])
            return None
        return self.meta.view()["changes"].get(meta.META)

    async def _begin_data_changes(self, view: dict[str, Any]) -> None:
        busy = frozenset(int(g) for g in view["changes"] if g != meta.META)
        room = self.config.placement_changes_max - len(busy)
        if room <= 0:
            return
        rf = view["cluster"]["replication_factor"]
        for change in placement.plan(meta.node_states(view), meta.planned_placement(view), rf, busy, room):
            command = {"op": "begin_change", "group": change.group, "kind": change.kind, "node_id": change.node_id,
                       "epoch": view["epoch"], "reason": change.reason}
            result = await self._propose(command)
            log.info("membership_change_begun group=%d kind=%s node_id=%s reason=%r %s", change.group, change.kind,
                     change.node_id, change.reason, "" if result["ok"] else result["error"])

    async def _retire_drained(self, view: dict[str, Any]) -> None:
        """A draining node that holds no data replica any more is removed. It still follows
        the metadata log (as a voter or an observer), so it hears so itself; a voter then
        loses its vote (storage/meta_voters.py)."""
        held = {m for members in meta.data_placement(view).values() for m in members}
        for node_id, node in sorted(view["nodes"].items()):
            if node["state"] == "draining" and node_id not in held:
                result = await self._propose({"op": "set_state", "node_id": node_id, "state": "removed"})
                log.info("node_removed node_id=%s %s", node_id, "" if result["ok"] else result["error"])
