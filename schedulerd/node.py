"""This node's Raft groups and the one way the daemon changes state: propose
a command, await its apply result, map failures to typed errors."""
from __future__ import annotations

import asyncio
import logging
import re
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import lmdb

from schedulerd import lease_time
from schedulerd.clock import Clock
from schedulerd.config import NodeConfig
from schedulerd.diskguard import DiskGuard
from schedulerd.errors import Conflict, Elsewhere, OutcomeUnknown, Unavailable
from schedulerd.raft import group_files
from schedulerd.raft.group import Group, stop_node
from schedulerd.raft.proposals import ProposalFailed
from schedulerd.storage import keys, ops
from schedulerd.storage.ops import Op
from schedulerd.storage.tables import Tables
from schedulerd.topology import Topology

log = logging.getLogger("schedulerd.node")

# What a run id looks like: `{group}-{raft index}-{n}` (storage/records.Ctx.new_run_id).
RUN_ID_RE = re.compile(r"[0-9]{1,4}-[0-9]{1,19}-[0-9]{1,9}")
# Ops after which a ready run may have appeared (or a lease ended): wake long-polls.
# A create wakes them only when it claimed something (claims.claim_created).
READY_CHANGING = frozenset({Op.CLAIM_BATCH, Op.NACK, Op.EXPIRE_LEASES, Op.TRIGGER_JOB, Op.REDRIVE_RUN})
# Entries that may end a running run: with queue limits set, a poll waiting on a queue at its
# max_running may lease again (storage/queue_limits.py).
RUNNING_ENDING = frozenset({Op.ACK, Op.CANCEL_RUN, Op.CANCEL_JOB, Op.JOBS_ACTION})


class Node:
    def __init__(self, config: NodeConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.loop: asyncio.AbstractEventLoop | None = None
        # The data groups with a replica on this node, in group order: replaced whole (never
        # changed in place) when the placement gives or takes one, so a reader's list holds.
        self.groups: list[Group] = []
        self._by_id: dict[int, Group] = {}
        # Groups this node is about to leave (a change under way removes it): no more leases
        # are asked from them here, so no poll is cut off mid-grant when the replica goes.
        self.leaving: frozenset[int] = frozenset()
        # Called on the event loop with (group, True) once a replica starts here, and with
        # (group, False) just before one stops (the leader loops follow these).
        self.group_listeners: list[Callable[[Group, bool], None]] = []
        self.topology: Topology | None = None
        self._ready_event = asyncio.Event()
        # Called in the Raft tick thread after each applied entry's commit (metrics).
        self.applied_listeners: list[Callable[[Op, dict[str, Any]], None]] = []
        self.disk = DiskGuard(config.raft.data_dir, config.limits.disk_free_bytes_min)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the replicas this data dir holds (their logs say who the other members are);
        the topology starts and stops the others as the placement says."""
        self.loop = loop
        data_dir = self.config.raft.data_dir
        for group_id in group_files.leftovers(data_dir):
            group_files.sweep(data_dir, group_id)
        for group_id in group_files.held(data_dir):
            if group_id < self.config.raft.groups:
                self.start_group(group_id, peers=None, joining=False)
        self.topology = Topology(self, stop_node)
        self.topology.start(loop)

    def start_group(self, group_id: int, peers: list[str] | None, joining: bool) -> Group:
        """Start this node's replica of a data group; `peers` (the other members' addresses in
        this group) and `joining` matter only when the data dir holds nothing of it yet."""
        group = Group(group_id, self.config.raft, on_applied=self._on_applied, clock_us=self.clock.now_us,
                      leader_stamp=lease_time.stamp, peers=peers, joining=joining)
        self._by_id = {**self._by_id, group_id: group}
        self.groups = [self._by_id[g] for g in sorted(self._by_id)]
        log.info("replica_started group=%d joining=%s members=%s", group_id, joining, ",".join(group.members()))
        for listener in self.group_listeners:
            listener(group, True)
        return group

    def drop_group(self, group_id: int, keep_files: bool = False) -> None:
        """Stop this node's replica of a group it is no longer a member of and delete its files
        (or keep them, on a node the cluster declared dead: the operator wipes it)."""
        group = self._by_id.get(group_id)
        if group is None:
            return
        for listener in self.group_listeners:
            listener(group, False)
        self._by_id = {g: grp for g, grp in self._by_id.items() if g != group_id}
        self.groups = [self._by_id[g] for g in sorted(self._by_id)]
        group.destroy()
        if keep_files:
            log.info("replica_stopped group=%d", group_id)
            return
        group_files.remove(self.config.raft.data_dir, group_id)
        log.info("replica_removed group=%d", group_id)

    def local_group(self, group_id: int) -> Group | None:
        return self._by_id.get(group_id)

    def now_us(self) -> int:
        """The cluster's time as this node knows it (raft/clocks.py): the time it stamps
        into what it proposes and judges what is due by. Its own clock (`self.clock`)
        may run ahead or behind; the leader re-stamps lease entries either way
        (lease_time.py), the rest carry this. With several groups, group 0's figure:
        their voters are the same machines."""
        groups = self.groups
        return groups[0].clocks.cluster_now_us() if groups else self.clock.now_us()

    def stop(self) -> None:
        if self.topology is not None:
            self.topology.stop()
        for group in self.groups:
            group.destroy()
        self._by_id, self.groups = {}, []

    def _on_applied(self, group_id: int, index: int, op: Op, result: dict[str, Any]) -> None:
        """Runs in a Raft tick thread, after the entry's commit."""
        for listener in self.applied_listeners:
            listener(op, result)
        if log.isEnabledFor(logging.DEBUG):
            log_applied(group_id, index, op, result)
        if (op in READY_CHANGING or op == Op.CREATE_JOBS and result["runs"]
                or op in RUNNING_ENDING and self.queue_limits()) and self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._pulse_ready)

    def _pulse_ready(self) -> None:
        event, self._ready_event = self._ready_event, asyncio.Event()
        event.set()

    def queue_limits(self) -> dict[str, Any]:
        """The queues' limits as this node's metadata replica has them (storage/meta.py)."""
        return self.topology.meta.queue_limits() if self.topology is not None else {}

    def ready_signal(self) -> asyncio.Event:
        """The event the next ready-changing apply sets. Take it *before* looking for
        work, then wait on it: a pulse in between is not lost."""
        return self._ready_event

    def group_id_of_job(self, job_id: str) -> int:
        return keys.shard_of(job_id) % self.config.raft.groups

    def group_of_job(self, job_id: str) -> Group:
        """The job's group on this node; Elsewhere when its replicas are on other nodes."""
        return self._here(self.group_id_of_job(job_id))

    def group_id_of_run(self, run_id: str) -> int | None:
        """None for an id no run can have (run ids are `{group}-{index}-{n}`)."""
        if not RUN_ID_RE.fullmatch(run_id):
            return None
        group = int(run_id.partition("-")[0])
        return group if group < self.config.raft.groups else None

    def group_of_run(self, run_id: str) -> Group | None:
        """None for an id no run can have; Elsewhere when its group's replicas are on other nodes."""
        group_id = self.group_id_of_run(run_id)
        return None if group_id is None else self._here(group_id)

    def _here(self, group_id: int) -> Group:
        group = self._by_id.get(group_id)
        if group is None:
            raise Elsewhere(group_id)
        return group

    def shards_of(self, group: Group) -> list[int]:
        return [s for s in range(keys.SHARDS) if s % self.config.raft.groups == group.group_id]

    @contextmanager
    def read(self, group: Group) -> Iterator[tuple[lmdb.Transaction, Tables]]:
        with group.store.read() as txn:
            yield txn, group.store.tables

    def require_entry_version(self, group: Group, since: int, what: str) -> None:
        """Refuse a command the cluster cannot write yet: some voter still runs a build
        that reads only older entries (a rolling upgrade not finished)."""
        writes = group.versions.writes()
        if writes < since:
            raise Conflict(f"{what} needs every node to read entry version {since}; group {group.group_id} "
                           f"writes {writes}: finish upgrading the other nodes first")

    async def propose(self, group: Group, op: Op, payload: dict[str, Any]) -> dict[str, Any]:
        """Commit one command through Raft and return its apply result on this node."""
        assert self.loop is not None
        self.disk.check()
        payload.setdefault("now", self.now_us())
        # At the version every voter reads: in a rolling upgrade, the old one until the last node is upgraded.
        fut = group.propose(ops.encode(op, payload, group.versions.writes()), self.loop)
        try:
            return await asyncio.wait_for(fut, self.config.propose_timeout_s)
        except ProposalFailed as exc:
            what = ops.WHAT[op]
            if exc.maybe_applied:
                raise OutcomeUnknown(f"{what} may have been saved or not ({exc}): retry it with the same id or "
                                     "idempotency key") from None
            raise Unavailable(f"{what} was not saved: group {group.group_id} {exc}") from None
        except asyncio.TimeoutError:
            raise OutcomeUnknown(f"{ops.WHAT[op]} was not confirmed within {self.config.propose_timeout_s:g}s (is "
                                 "a quorum of the nodes up?); it may still be saved: retry it with the same id or "
                                 "idempotency key") from None


_RUN_EVENTS = {Op.NACK: "run_nacked", Op.REDRIVE_RUN: "run_redriven", Op.TRIGGER_JOB: "run_triggered"}


def log_applied(group_id: int, index: int, op: Op, result: dict[str, Any]) -> None:
    """Per job and per run events, for --log-level DEBUG only: at INFO the hot path logs nothing."""
    if op == Op.CREATE_JOBS:
        for r in result["results"]:
            if r["ok"] and not r.get("existing"):
                log.debug("job_created job_id=%s group=%d raft_index=%d", r["job_id"], group_id, index)
    if op in (Op.CREATE_JOBS, Op.CLAIM_BATCH):
        for run_id in result["runs"]:
            log.debug("run_claimed run_id=%s group=%d raft_index=%d", run_id, group_id, index)
    elif op in (Op.LEASE_READY, Op.LEASE_BATCH):
        for worker_id, tasks in result["grants"]:
            for t in tasks:
                log.debug("run_leased run_id=%s job_id=%s worker_id=%s fence=%d raft_index=%d",
                          t["run_id"], t["job_id"], worker_id, t["fence"], index)
    elif op == Op.ACK:
        for r in result["results"]:
            if r["ok"]:
                log.debug("run_acked run_id=%s raft_index=%d", r["run_id"], index)
    elif op in _RUN_EVENTS and result.get("ok"):
        run = result["run"]
        log.debug("%s run_id=%s job_id=%s state=%s raft_index=%d", _RUN_EVENTS[op], run["run_id"],
                  run["job_id"], run["state"], index)
