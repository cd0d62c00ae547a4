"""Long-poll leasing: a worker's poll waits until runs of its queues are
ready, then leases them through one committed LEASE_READY entry.

Any node can serve a poll. The entry names the worker, its queues and how many
runs it wants; apply picks the runs from the ready index (storage/leases.py), so
entries from several nodes never name the same run and a follower's replica,
a moment behind, only decides whether to ask, never what to take. A follower asks
only for runs ready FOLLOWER_DEFER_US or longer: a run that just became ready is the
leader's polls' to take, and an entry racing them would lease nothing."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from schedulerd import tracing, views
from schedulerd.coalescer import Coalescer
from schedulerd.errors import TooManyRequests, Unavailable
from schedulerd.node import Node
from schedulerd.raft.group import Group
from schedulerd.storage import ops, queries, queue_limits
from schedulerd.storage.ops import Op
from schedulerd.units import US_PER_S

# A newly ready run is leased first by the leader's own polls, a commit closer; a
# follower asking at once raced them, and at 300 jobs/s 39% of LEASE_READY entries,
# each fsynced by every node, leased nothing. Runs that wait longer (no poll free on
# the leader, a backlog) are asked for by any node.
FOLLOWER_DEFER_US = 20_000

log = logging.getLogger("schedulerd.leases")

class LeaseQueue:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.waiters = 0
        self.leased = 0
        self._closing = False

        def lease_term(group: Group, grants: list[Any]) -> dict[str, Any]:
            now = node.now_us()
            term: dict[str, Any] = {"now": now, "lease_until": now + int(node.config.lease_s * US_PER_S)}
            limits = self._carried(group, [q for _, queues, _ in grants for q in queues])
            if limits:
                term["limits"] = limits
            return term

        # Polls waiting at once on this node share LEASE_READY entries.
        self._grants = Coalescer(node.propose, Op.LEASE_READY, "grants", "grants",
                                 node.config.limits.lease_entry_runs_max, lease_term, weight=lambda g: g[2])

    async def poll(self, worker_id: str, queues: list[str], max_tasks: int, wait_s: float) -> list[views.TaskView]:
        limits = self.node.config.limits
        if self.waiters >= limits.poll_waiters_max:
            raise TooManyRequests(f"poll_waiters_max ({limits.poll_waiters_max}) long-polls already wait on this node")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        self.waiters += 1
        try:
            while True:
                signal = self.node.ready_signal()
                tasks = await self._lease_once(worker_id, queues, max_tasks)
                remaining = deadline - loop.time()
                if tasks or remaining <= 0 or self._closing:
                    return tasks
                try:
                    await asyncio.wait_for(signal.wait(), min(remaining, self._until_next_ready(queues)))
                except asyncio.TimeoutError:
                    pass
        finally:
            self.waiters -= 1

    def close(self) -> None:
        """Answer every waiting poll now with what it has, and each later one at once: the
        node is stopping, and the HTTP server's shutdown waits for every request in flight,
        a long-poll for up to its wait_s (its worker polls another node meanwhile)."""
        self._closing = True
        self.node.ready_signal().set()

    def _until_next_ready(self, queues: list[str]) -> float:
        """Seconds until this node would ask for the earliest run of these queues (a retry
        backoff ending, a run claimed ahead of its time, a follower's defer ending, a queue's
        rate limit granting its next start); no apply signals that."""
        best = float("inf")
        for group in self._leasable():
            asks_before = self._asks_before_us(group)
            with self.node.read(group) as (txn, tables):
                budget = self._budget(group, queues, txn, tables, asks_before)
                open_queues = budget.open(queues) if budget is not None else queues
                at = queries.next_ready_us(txn, tables, open_queues) if open_queues else None
                refill = budget.next_token_us(queues) if budget is not None else None
            for when in (at, refill):
                if when is not None:
                    best = min(best, max(0.0, (when - asks_before) / US_PER_S))
        return best + 0.001 if best != float("inf") else 3600.0

    def _carried(self, group: Group, queues: list[str]) -> queue_limits.Carried:
        """The limits a lease entry for `group` carries for these queues (storage/queue_limits.py):
        none while no queue has limits, or while the group writes entries an older build reads."""
        stored = self.node.queue_limits()
        if not stored or group.versions.writes() < ops.QUEUE_LIMITS_SINCE:
            return {}
        return queue_limits.carried(stored, queues, self.node.config.raft.groups, group.group_id)

    def _budget(self, group: Group, queues: list[str], txn: Any, tables: Any,
                now_us: int) -> queue_limits.Budget | None:
        """What this replica says the group may still grant of the queues (None: no queue has
        limits): a queue at its limit is not asked for, so a poll waits instead of proposing
        entries that lease nothing."""
        if not self.node.queue_limits():
            return None
        return queue_limits.Budget(txn, tables, self._carried(group, queues), {}, now_us)

    def _leasable(self) -> list[Group]:
        return [g for g in self.node.groups if self._may_lease(g)]

    def _may_lease(self, group: Group) -> bool:
        """Whether this node may lease from its replica `group`: still held, and not about to
        be left (asked again after each wait: a replica goes while a poll waits on another)."""
        return group.group_id not in self.node.leaving and self.node.local_group(group.group_id) is group

    def _asks_before_us(self, group: Group) -> int:
        """This node asks to lease runs available before this time: now, as the leader
        will stamp the lease entry (lease_time.py), less a follower's defer."""
        now = group.clocks.cluster_now_us()
        return now if group.is_leader() else now - FOLLOWER_DEFER_US

    async def _lease_once(self, worker_id: str, queues: list[str], max_tasks: int) -> list[views.TaskView]:
        """Lease from each group this node may lease from in turn. A group that commits no
        grant (no leader, a timeout) does not fail the poll once another group granted
        runs: failing it would strand those, leased to a worker that never hears of them,
        until their lease ran out. With nothing granted, the first failure is the answer."""
        tasks: list[views.TaskView] = []
        failed: Unavailable | None = None
        for group in self._leasable():
            want = max_tasks - len(tasks)
            if want <= 0:
                break
            if not self._may_lease(group):
                continue
            try:
                tasks.extend(await self._lease_from(group, worker_id, queues, want))
            except Unavailable as exc:  # OutcomeUnknown too: a grant that may have committed is lost either way
                # Debug: while a group has no leader every poll here fails on it, hundreds a second.
                log.debug("lease_failed group=%d error=%s", group.group_id, exc)
                failed = failed or exc
        if failed is not None and not tasks:
            raise failed
        return tasks

    async def _lease_from(self, group: Group, worker_id: str, queues: list[str], want: int) -> list[views.TaskView]:
        asks_before = self._asks_before_us(group)
        with self.node.read(group) as (txn, tables):
            budget = self._budget(group, queues, txn, tables, asks_before)
            open_queues = budget.open(queues) if budget is not None else queues
            if not open_queues or not queries.ready(txn, tables, open_queues, asks_before, 1):
                return []  # nothing to ask for as far as this replica knows
        ((_, granted),) = await self._grants.submit(group, [[worker_id, queues, want]])
        self.leased += len(granted)
        # Apply grants run records only; the payload is read here, once, from this
        # node's replica (it has applied the grant), not in apply on every replica.
        with self.node.read(group) as (txn, tables):
            parts = queries.task_parts(txn, tables, [t["job_id"] for t in granted])
        if tracing.on():
            tracing.record("lease", "receive", "SERVER",
                           [(t["run_id"], t["queue"], parts[t["job_id"]]) for t in granted])
        return [views.task(t, parts[t["job_id"]]) for t in granted]
