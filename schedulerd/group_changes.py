"""Carrying out the placement's changes in the data groups' own Raft logs, and handing
leadership to each group's preferred member.

The metadata records a change (`begin_change`); the leader of that group, whichever node it
is, carries it out and records how it ended (`end_change`). Every step is safe to repeat, so
a leader that fails over mid-change leaves it to the next one, which looks at its own log
first: an add its log already holds is only waited on, not proposed again.

An add ends only once the new member has caught up (holds what the leader had committed when
it started waiting), so the planner's next step, taking a replica off another node, never
leaves the group leaning on a member that has nothing yet. One that does not catch up within
`replica_catchup_timeout_s` is taken out again and the change ends as failed."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from schedulerd.raft import pysyncobj_patches
from schedulerd.raft.conf import group_addr
from schedulerd.raft.group import Group
from schedulerd.raft.proposals import ProposalFailed
from schedulerd.storage import meta, placement

if TYPE_CHECKING:
    from schedulerd.node import Node

log = logging.getLogger("schedulerd.topology")

WAIT_STEP_S = 0.2
# A live member being taken out stops asking its group for leases once it sees the change
# begun; the grants it asked for just before must still commit and reach it, or their runs
# wait out a whole lease with no worker told of them. The removal waits this long after
# the change began.
REMOVE_GRACE_S = 1.5
# A leader hands its group to the preferred member only after leading it this long (an
# election just happened; let the group settle), and asks again no sooner than this.
LEADER_SETTLE_S = 5.0

Propose = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class NotLeader(Exception):
    """This node stopped leading the group mid-change: the next leader carries it on."""


class GroupChanges:
    def __init__(self, node: "Node", node_id: str, propose: Propose) -> None:
        self.node = node
        self.node_id = node_id
        self._propose = propose
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._led_since: dict[int, float] = {}
        self._handed_at: dict[int, float] = {}

    def step(self, view: dict[str, Any]) -> None:
        for key, change in view["changes"].items():
            if key == meta.META:
                continue
            group = self.node.local_group(int(key))
            task = self._tasks.get(int(key))
            if group is None or not group.is_leader() or (task is not None and not task.done()):
                continue
            node = view["nodes"][change["node_id"]]
            address = group_addr(node["raft"], group.group_id)
            live = node["state"] in placement.SERVES
            self._tasks[int(key)] = asyncio.get_running_loop().create_task(
                self._carry_out(group, key, change, address, live))
        self._balance_leaders(view)

    def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()

    async def _carry_out(self, group: Group, key: str, change: dict[str, Any], address: str, live: bool) -> None:
        kind = change["kind"]
        try:
            if kind == "remove" and address == group.self_addr:
                self._hand_over(group, [a for a in group.members() if a != address], "it is being removed")
                return
            if (address in group.members()) == (kind == "add"):
                await self._settled(group)  # carried out already: only its commit is waited on
            else:
                if kind == "remove" and live:
                    await asyncio.sleep(max(0.0, (change["started_us"] - self.node.now_us()) / 1e6 + REMOVE_GRACE_S))
                await asyncio.wait_for(group.change_members(kind, address, asyncio.get_running_loop()),
                                       self.node.config.propose_timeout_s)
            done = kind == "remove" or await self._caught_up(group, address)
            if not done:
                log.warning("replica_catchup_timed_out group=%d address=%s: taking the add back", group.group_id, address)
                await asyncio.wait_for(group.change_members("remove", address, asyncio.get_running_loop()),
                                       self.node.config.propose_timeout_s)
            result = await self._propose({"op": "end_change", "group": key, "done": done,
                                          "started_us": change["started_us"]})
            log.info("membership_change_%s group=%d kind=%s node_id=%s reason=%r %s", "done" if done else "failed",
                     group.group_id, kind, change["node_id"], change["reason"], "" if result["ok"] else result["error"])
        except NotLeader:
            log.info("membership_change_handed_on group=%d: no longer its leader", group.group_id)
        except (ProposalFailed, asyncio.TimeoutError) as exc:
            log.warning("membership_change_retry group=%d kind=%s address=%s: %s", group.group_id, kind, address,
                        exc or "timed out")

    async def _settled(self, group: Group) -> None:
        """Wait until everything in the leader's log when called is committed."""
        last = pysyncobj_patches.last_log_index(group.replica)
        deadline = time.monotonic() + self.node.config.propose_timeout_s
        while group.replica.raftCommitIndex < last:
            if not group.is_leader():
                raise NotLeader()
            if time.monotonic() > deadline:
                raise asyncio.TimeoutError()
            await asyncio.sleep(WAIT_STEP_S)

    async def _caught_up(self, group: Group, address: str) -> bool:
        target = group.replica.raftCommitIndex
        deadline = time.monotonic() + self.node.config.replica_catchup_timeout_s
        while pysyncobj_patches.match_index(group.replica, address) < target:
            if not group.is_leader():
                raise NotLeader()
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(WAIT_STEP_S)
        return True

    def _hand_over(self, group: Group, candidates: list[str], why: str) -> None:
        """Transfer this group's leadership to the most caught-up of `candidates`."""
        best = max(candidates, key=lambda a: pysyncobj_patches.match_index(group.replica, a), default=None)
        if best is None:
            return
        self._handed_at[group.group_id] = time.monotonic()
        log.info("leadership_handover group=%d to=%s reason=%r", group.group_id, best, why)
        group.request_step_down(best)

    def _balance_leaders(self, view: dict[str, Any]) -> None:
        """Once the replicas are balanced and no change is under way, hand a group led here to
        its preferred member while this node leads more groups than it may: its preferred
        count when there are at least as many groups as nodes (then every node ends with
        exactly its count, within one of the others), one when there are fewer (any spread
        of at most one each is within one)."""
        states = meta.node_states(view)
        data = meta.data_placement(view)
        if any(key != meta.META for key in view["changes"]) \
                or not placement.is_balanced(states, data, view["cluster"]["replication_factor"]):
            return  # leaders are evened once the replicas are: each move would undo a handover
        preferred = placement.preferred_leaders(data, states)
        takers = sum(1 for state in states.values() if state == "alive")
        allowed = sum(1 for n in preferred.values() if n == self.node_id) if len(preferred) >= takers else 1
        now = time.monotonic()
        led = [g for g in self.node.groups if g.is_leader()]
        for group in self.node.groups:
            if not group.is_leader():
                self._led_since.pop(group.group_id, None)
        excess = len(led) - allowed
        for group in led:
            group_id = group.group_id
            since = self._led_since.setdefault(group_id, now)
            want = preferred.get(group_id)
            if excess <= 0 or want is None or want == self.node_id or str(group_id) in view["changes"] \
                    or now - since < LEADER_SETTLE_S or now - self._handed_at.get(group_id, 0.0) < LEADER_SETTLE_S:
                continue
            address = group_addr(view["nodes"][want]["raft"], group_id)
            if address in group.members() \
                    and pysyncobj_patches.match_index(group.replica, address) >= group.replica.raftCommitIndex:
                self._hand_over(group, [address], f"balance: {want} is its preferred leader")
                excess -= 1
