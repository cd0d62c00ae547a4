"""The group leader's loops: the due scan (occurrences -> runs), the lease
reaper (expired leases -> retry or dead letter), and the sweep of what expired
(schedulerd/sweeper.py, a loop of its own).

Being leader is only a belief here (an isolated leader keeps it until
leader_fallback_s): these loops merely *propose*. Claims and expiries are
compare-and-set in apply, so a stale leader's proposal is rejected or never
commits; nothing is dispatched on belief alone."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from schedulerd import tracing
from schedulerd.errors import SchedulerError
from schedulerd.node import Node
from schedulerd.raft.group import Group
from schedulerd.storage import calendars, queries, records
from schedulerd.storage.ops import Op
from schedulerd.sweeper import Sweeper
from schedulerd.units import US_PER_S

log = logging.getLogger("schedulerd.leader")

STEP_DOWN_RETRY_S = 2.0  # a transfer takes about an election; ask again after this


class LeaderLoops:
    def __init__(self, node: Node) -> None:
        self.node = node
        # Per group, the (job_id, fire_us) that apply deferred for the overlap rule: not
        # proposed again before they are due, or each scan would carry them until then.
        self._deferred: dict[int, set[tuple[str, int]]] = {}
        self._tasks: dict[int, list[asyncio.Task[None]]] = {}
        self.sweeper = Sweeper(node)

    def start(self) -> None:
        """Loops for each replica on this node now and for each one the placement starts later."""
        for group in self.node.groups:
            self._follow(group, True)
        self.node.group_listeners.append(self._follow)

    def _follow(self, group: Group, started: bool) -> None:
        if started:
            self._tasks[group.group_id] = [asyncio.get_running_loop().create_task(loop(group))
                                           for loop in (self._run, self.sweeper.run)]
        else:
            for task in self._tasks.pop(group.group_id, []):
                task.cancel()
            self._deferred.pop(group.group_id, None)

    async def stop(self) -> None:
        tasks = [task for group_tasks in self._tasks.values() for task in group_tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, group: Group) -> None:
        interval = self.node.config.scan_interval_s
        while True:
            try:
                if group.is_leader() and self.node.disk.low():
                    # This node cannot write: claims would stall here, so let a node
                    # with room lead (a full leader would hold up every dispatch).
                    group.request_step_down()
                    await asyncio.sleep(STEP_DOWN_RETRY_S)
                    continue
                if group.is_leader():
                    busy = await self.claim_due(group)
                    busy |= await self.expire_leases(group)
                    if busy:
                        continue
            except SchedulerError as exc:
                log.warning("leader_scan_failed group=%d error=%s", group.group_id, exc)
            await asyncio.sleep(interval)

    async def claim_due(self, group: Group) -> bool:
        """Claim what is due up to now + lookahead; True if a full batch was claimed (scan again now)."""
        cfg, limits = self.node.config, self.node.config.limits
        now = group.clocks.cluster_now_us()  # judged by one skewed clock, claims would misfire or wait
        until = now + int(cfg.lookahead_s * US_PER_S)
        with self.node.read(group) as (txn, tables):
            due = queries.due(txn, tables, self.node.shards_of(group), until, limits.scan_batch_max)
        deferred = self._deferred.setdefault(group.group_id, set())
        deferred -= {item for item in deferred if item[1] <= now}
        due = [item for item in due if item not in deferred]
        if not due:
            return False
        due.sort(key=lambda item: item[1])
        batch = due[: limits.claim_batch_max]
        result = await self.node.propose(group, Op.CLAIM_BATCH, {
            "now": now, "grace_us": int(cfg.misfire_grace_s * US_PER_S),
            "claims": [[job_id, fire] for job_id, fire in batch], **self._calendars(group, batch)})
        deferred.update((job_id, fire) for job_id, fire in result["deferred"])
        if tracing.on():
            self._trace_claimed(group, result["runs"])
        log.debug("claim_batch group=%d claimed=%d stale=%d deferred=%d", group.group_id, len(result["runs"]),
                  result["stale"], len(result["deferred"]))
        return len(due) > len(batch)

    def _trace_claimed(self, group: Group, run_ids: list[str]) -> None:
        """The claim's span, linked to each claimed run's job's trace context (read only when
        tracing is on: the claim entry names jobs, its result runs)."""
        with self.node.read(group) as (txn, tables):
            reader = records.Reader(txn, tables)
            runs = [run for run in (records.get_run(reader, run_id) for run_id in run_ids) if run is not None]
            parts = queries.task_parts(txn, tables, [run["job_id"] for run in runs])
        tracing.record("claim", "publish", "INTERNAL",
                       [(run["run_id"], run["queue"], parts[run["job_id"]]) for run in runs])

    def _calendars(self, group: Group, batch: list[tuple[str, int]]) -> dict[str, Any]:
        """The calendars the batch's jobs name, as this node's metadata replica has them, for
        the claim entry to carry (apply reads no metadata); nothing while there is no calendar."""
        stored = self.node.topology.meta.calendars() if self.node.topology is not None else {}
        if not stored:
            return {}
        with self.node.read(group) as (txn, tables):
            reader = records.Reader(txn, tables)
            jobs = [records.get_job(reader, job_id) for job_id, _ in batch]
        carried = calendars.carried(stored, {job["skip_calendar"] for job in jobs
                                             if job is not None and job.get("skip_calendar") is not None})
        return {"calendars": carried} if carried else {}

    async def expire_leases(self, group: Group) -> bool:
        limits = self.node.config.limits
        # By the cluster's clock, as the entry will be stamped (lease_time.py): by ours, a
        # clock ahead would propose, every tick, expiries that apply then declines, and a
        # clock behind would find them late.
        now = group.clocks.cluster_now_us()
        with self.node.read(group) as (txn, tables):
            expired = queries.expired_leases(txn, tables, now, limits.expire_batch_max)
        if not expired:
            return False
        result = await self.node.propose(group, Op.EXPIRE_LEASES,
                                         {"now": now, "runs": [list(item) for item in expired]})
        log.info("leases_expired group=%d count=%d dead_letter=%d", group.group_id, result["expired"],
                 result["dead_letter"])
        return len(expired) >= limits.expire_batch_max
