"""One Raft group: a pysyncobj SyncObj whose state machine is one LMDB store.

pysyncobj sees exactly one replicated method, `apply_entry(blob)`; the blob's
own op code says what it is (renaming or adding @replicated methods would
renumber them and change what old log entries mean)."""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, Callable, Sequence

from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.node import TCPNode

from schedulerd.raft import compaction, group_files, journal, membership, proposals, pysyncobj_patches, riders, snapshot
from schedulerd.raft.clocks import PeerClocks
from schedulerd.raft.conf import RaftConfig
from schedulerd.raft.entry_versions import EntryVersions
from schedulerd.raft.proposals import ProposalFailed
from schedulerd.raft.pysyncobj_patches import Stamp
from schedulerd.raft.snapshot_writer import SnapshotWriter
from schedulerd.raft.store import Store
from schedulerd.storage import fsm, ops
from schedulerd.storage.ops import Op

log = logging.getLogger("schedulerd.raft")

pysyncobj_patches.use_pickle_protocol()

# Replicas compact at the same log index; each copies its store in a slot of its own
# this long, followers first and the leader last, so at most one node at a time pays
# for a copy (a 1M-job store's paced copy takes ~7 s).
SNAPSHOT_STAGGER_S = 10.0

Applied = Callable[[int, int, Op, dict[str, Any]], None]  # (group, raft index, op, result)


class _Replica(SyncObj):
    def __init__(self, group: "Group", self_addr: str, peers: list[str], conf: SyncObjConf) -> None:
        self._group = group
        self._commit_announced = 0
        super().__init__(self_addr, peers, conf)

    @replicated
    def apply_entry(self, blob: bytes) -> Any:
        self._announce_commit()
        # raftLastApplied + 1 is the index of the entry being applied, the same on every node.
        return self._group._apply(self.raftLastApplied + 1, blob)

    def _announce_commit(self) -> None:
        """A leader about to apply newly committed entries first tells its followers they are
        committed, so they apply them alongside it instead of after it: pysyncobj 0.3.17 sends
        the new commit index only once the leader's own apply is done."""
        commit = self.raftCommitIndex
        if commit > self._commit_announced and self._isLeader():
            self._commit_announced = commit
            pysyncobj_patches.send_append_entries(self)

    def _onTick(self, timeToWait: float = 0.0) -> None:
        # The tick callback commits before the tick waits for the network; this
        # also covers the early return pysyncobj takes while its transport is not ready.
        try:
            super()._onTick(timeToWait)
        finally:
            self._group._commit_applied()


class DataDirDamaged(Exception):
    """A replica's files cannot rebuild its store: it must not start."""


def stop_node(message: str) -> None:
    log.critical("fatal_apply_error %s; stopping the node (it replays the entry on restart)", message)
    logging.shutdown()
    os._exit(70)


class Group:
    """A Raft group on this node. Thread model: pysyncobj's tick thread applies
    entries and fires callbacks; asyncio callers get results through futures.

    All entries a tick applies share one LMDB txn, committed at the end of the
    tick (one fsync for all of them). Results and on_applied notices wait for
    that commit, so whoever learns of an entry can read it on this node."""

    def __init__(self, group_id: int, conf: RaftConfig, on_applied: Applied | None = None,
                 on_fatal: Callable[[str], None] = stop_node, clock_us: Callable[[], int] | None = None,
                 leader_stamp: Stamp | None = None, peers: Sequence[str] | None = None,
                 joining: bool = False) -> None:
        """`peers`: the other members this replica starts with when its data dir holds none
        of the group yet; by default the configured peers'. Once the group has a journal or
        snapshot here, the members are the ones its log says. `joining`: this replica is
        being added to a running group (not one of its first members), so it votes only once
        its log holds the entry that adds it (pysyncobj_patches.no_votes_before_joining)."""
        self.group_id = group_id
        self.conf = conf
        self._on_applied = on_applied
        self._on_fatal = on_fatal
        self._after_commit: list[Callable[[], None]] = []
        self._pending: set[asyncio.Future[Any]] = set()  # proposals not answered yet
        self._failed: str | None = None
        self._destroyed = False
        os.makedirs(conf.data_dir, exist_ok=True)
        base = os.path.join(conf.data_dir, f"group-{group_id}")
        self.store = Store(base + ".lmdb", group_id, conf.lmdb_map_bytes, conf.lmdb_writeback_s)
        self.self_addr, configured = conf.node_addrs(group_id)
        journal_path = base + ".journal"
        # Entries the snapshot covers are skipped as the journal loads (raft/journal.py).
        keep_from = snapshot.first_needed_index(base + ".snapshot")
        fresh = group_id not in group_files.held(conf.data_dir)
        first = membership.first_members(base + ".members", {self.self_addr, *(configured if peers is None else peers)},
                                         fresh)
        log_journal = journal.DurableJournal(journal_path, keep_from)
        self._refuse_a_gap(log_journal, keep_from)
        journal.install(lambda path: log_journal)
        in_snapshot, snapshot_index = snapshot.members_at(base + ".snapshot")
        members = membership.members_in_log(in_snapshot or first, snapshot_index, log_journal[:])
        self.peers = sorted(members - {self.self_addr})
        self._snapshots = SnapshotWriter(self.store, base + ".snapshot", self._snapshot_delay_s,
                                         conf.snapshot_write_bytes_per_s)
        sconf = conf.sync_conf(
            journal_path,
            fullDumpFile=base + ".snapshot",
            serializer=self._write_snapshot,
            serializeChecker=self._snapshots.state,
            deserializer=self._restore_snapshot,
            # pysyncobj wraps each blob in its own call encoding: room for that on top.
            appendEntriesBatchSizeBytes=conf.entry_bytes_max + (64 << 10),
            logCompactionBatchSize=conf.snapshot_chunk_bytes,
            sendBufferSize=conf.snapshot_chunk_bytes,
            recvBufferSize=conf.snapshot_chunk_bytes,
        )
        self.replica = _Replica(self, self.self_addr, self.peers, sconf)
        self.journal = journal.journal_for(journal_path)
        # A journal that failed to write or sync cannot be trusted again: stop the
        # node (it replays on restart) instead of leaving pysyncobj half-alive.
        self.journal.on_error = lambda error: self._on_fatal(f"group={group_id} journal: {error}")
        if joining:  # first: fix_log_replication hides from it the take-backs it does not carry out
            pysyncobj_patches.no_votes_before_joining(self.replica)
        pysyncobj_patches.fix_log_replication(self.replica, self.journal)
        pysyncobj_patches.close_notifier_on_destroy(self.replica)
        pysyncobj_patches.pace_snapshot_sends(self.replica, 2 * conf.snapshot_chunk_bytes, conf.append_entries_period_s)
        pysyncobj_patches.answer_snapshot_pieces(self.replica)
        self.clocks = PeerClocks(clock_us or (lambda: time.time_ns() // 1000), 1 + len(self.peers),
                                 conf.clock_fresh_s, self.replica._isLeader)
        self.versions = EntryVersions(ops.VERSION, ops.VERSION_FLOOR, 1 + len(self.peers), self.replica._isLeader)
        riders.install(pysyncobj_patches.transport(self.replica), [self.clocks, self.versions])
        pysyncobj_patches.watch_membership(self.replica, self._members_changed)
        self._members_changed()  # the tick thread may have replayed changes before the watch
        pysyncobj_patches.vet_as_leader_appends(self.replica, leader_stamp, self.clocks.cluster_now_us, self.versions.writes)
        self._step_down_requested = False
        self._step_down_to: str | None = None
        self.leader_changes = 0
        self._leader_seen: Any = None
        self.replica.addOnTickCallback(self._commit_applied)
        self.replica.addOnTickCallback(self._watch_leader)
        self.replica.addOnTickCallback(self._step_down_if_requested)
        self.replica.addOnTickCallback(self._compact_when_due)

    def _refuse_a_gap(self, log_journal: journal.DurableJournal, keep_from: int) -> None:
        """A journal that starts past the store's last applied entry, with no snapshot to
        bridge them, cannot rebuild the store: pysyncobj would never apply again here, yet
        the replica could still be elected (its log is complete) and lead a group that
        claims nothing (a snapshot file lost, say). Refuse to start instead."""
        applied = self.store.last_applied()
        if keep_from or not len(log_journal) or log_journal[0][1] <= applied + 1:
            return
        first = log_journal[0][1]
        log_journal._close_files()
        self.store.close()
        raise DataDirDamaged(f"group {self.group_id}: its journal starts at entry {first}, its store has applied "
                             f"{applied} and there is no snapshot to bridge them (the snapshot file was lost): "
                             "wipe the data dir and join this machine again as a new node")

    def _apply(self, index: int, blob: bytes) -> Any:
        """Never lets an exception escape into pysyncobj: one that did would freeze the tick.

        After a fatal error nothing more is applied or committed: this tick's txn
        holds a half-applied entry, and applying later entries without it would
        make this replica diverge. The node stops and replays from its journal."""
        if self._failed is not None:
            return {"fatal": self._failed}
        try:
            op, result = fsm.apply(self.store, index, blob)
        except fsm.FatalApplyError as exc:
            self._failed = str(exc)
            self.store.abort_applied()
            self._after_commit.clear()
            self._on_fatal(f"group={self.group_id} {exc}")
            return {"fatal": str(exc)}
        if op is not None:
            log.debug("applied group=%d op=%s raft_index=%d", self.group_id, op.name, index)
        if self._on_applied is not None and op is not None:
            self._after_commit.append(lambda: self._notify_applied(index, op, result))
        return result

    def _notify_applied(self, index: int, op: Op, result: dict[str, Any]) -> None:
        assert self._on_applied is not None
        try:
            self._on_applied(self.group_id, index, op, result)
        except Exception:
            log.exception("on_applied callback failed group=%d raft_index=%d", self.group_id, index)

    def _commit_applied(self) -> None:
        """Tick thread: make this tick's entries durable in LMDB, then tell whoever waits on them."""
        if self._failed is None:
            try:
                self.store.commit_applied()
            except Exception as exc:
                self._failed = f"LMDB commit failed: {exc}"
                self._after_commit.clear()
                self._on_fatal(f"group={self.group_id} {self._failed}")
        waiting, self._after_commit = self._after_commit, []
        for notify in waiting:
            notify()

    def _watch_leader(self) -> None:
        leader = self.replica._getLeader()
        if leader != self._leader_seen:
            pysyncobj_patches.forget_snapshot_transfers(self.replica)
            if leader is not None:
                self.leader_changes += 1
                log.info("leader_changed group=%d leader=%s term=%d", self.group_id, leader.address,
                         self.replica.raftCurrentTerm)
            self._leader_seen = leader

    def _compact_when_due(self) -> None:
        """Tick thread: ask pysyncobj to compact when raft/compaction.py says so, never
        while a snapshot is under way (the request would outlive it and start the next
        one at once)."""
        if not self._snapshots.busy() and compaction.due(len(self.journal), self.journal.size_bytes(),
                                                          self._snapshots.size_bytes, self.conf):
            self.replica.forceLogCompaction()

    def _snapshot_delay_s(self, now_s: float | None = None) -> float:
        """Seconds until this replica's slot to start a copy (tick thread).

        Slots are SNAPSHOT_STAGGER_S long and repeat every (nodes x stagger) on the wall
        clock: the followers' in address order, then the leader's. Counted from the
        moment each replica compacts, as before, two followers that compacted a few
        hundred entries apart (their journals weigh differently) copied at once, and the
        leader lost the one follower that kept its commits fast for seconds."""
        stagger = SNAPSHOT_STAGGER_S
        leader = self.replica._getLeader()
        leader_addr = leader.address if leader is not None else None
        order = sorted(a for a in [self.self_addr, *self.peers] if a != leader_addr)
        place = order.index(self.self_addr) if self.self_addr in order else len(order)
        period = stagger * (len(self.peers) + 1)
        if period == 0:
            return 0.0
        now_s = time.time() if now_s is None else now_s
        return (place * stagger - now_s) % period

    def _members_changed(self) -> None:
        others = self.replica.otherNodes
        self.peers = sorted(node.address for node in others)
        self.clocks.members_changed(others)
        self.versions.members_changed(others)
        log.info("members_changed group=%d members=%s", self.group_id, ",".join(self.members()))

    def members(self) -> list[str]:
        """Every member's Raft address, this node's included, as this replica knows them."""
        return sorted([self.self_addr, *self.peers])

    def change_members(self, kind: str, address: str, loop: asyncio.AbstractEventLoop) -> "asyncio.Future[Any]":
        """Add ("add") or remove ("remove") a member of this group, on its leader (proposals.change_members)."""
        return proposals.change_members(self.replica, kind, address, loop)

    def _write_snapshot(self, path: str, data: tuple[Any, ...]) -> None:
        self._commit_applied()
        self._snapshots.write(path, data)

    def _restore_snapshot(self, path: str) -> tuple[Any, ...]:
        self._commit_applied()
        self._snapshots.abandon()
        last, prev, cluster = snapshot.restore(self.store, path)
        # pysyncobj sets the members from what this returns, and tells itself apart by node.
        addresses = cluster if cluster is not None else self.members()
        return last, prev, [TCPNode(address) for address in addresses]

    def propose(self, blob: bytes, loop: asyncio.AbstractEventLoop) -> "asyncio.Future[Any]":
        """Append blob to the log; the future resolves with the apply result once this
        node has applied it and committed its store (so a read on this node right after
        sees it)."""
        refused = None
        if self._destroyed:
            refused = "is stopped: its replica left this node"
        elif len(blob) > self.conf.entry_bytes_max:
            refused = f"refused an entry of {len(blob)} bytes, over entry_bytes_max ({self.conf.entry_bytes_max})"
        if refused is not None:
            fut: asyncio.Future[Any] = loop.create_future()
            fut.set_exception(ProposalFailed(refused, maybe_applied=False))
            return fut
        # Success is only ever reported by the tick thread, right after the apply; the list
        # is looked up then, as each tick's commit takes it and starts a new one.
        fut, done = proposals.callback(loop, defer=lambda post: self._after_commit.append(post))
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        self.replica.apply_entry(blob, callback=done)
        return fut

    def request_step_down(self, to: str | None = None) -> None:
        """Hand leadership to the member at address `to` (which must be caught up), or to the
        most caught-up follower (thread-safe: done in the tick thread, the only thread
        pysyncobj's state may be touched from)."""
        self._step_down_to = to
        self._step_down_requested = True

    def _step_down_if_requested(self) -> None:
        if self._step_down_requested:
            self._step_down_requested = False
            if self.replica._isLeader():
                log.warning("leadership_transfer group=%d to=%s", self.group_id, self._step_down_to or "any")
                self.replica.transferLeadership(self._step_down_to)

    def is_leader(self) -> bool:
        return self.replica._isLeader()

    def status(self) -> dict[str, Any]:
        s = self.replica.getStatus()
        leader = s["leader"]
        return {
            "group": self.group_id,
            "self": self.self_addr,
            "leader": leader.address if leader is not None else None,
            "is_leader": self.is_leader(),
            "term": s["raft_term"],
            "commit_index": s["commit_idx"],
            "last_applied": s["last_applied"],
            "leader_commit_index": s["leader_commit_idx"],
            "has_quorum": s["has_quorum"],
            "ready": self.replica.isReady(),
            "peers": self.peers,
            "members": self.members(),
            # On the leader: the last entry each other member is known to hold.
            "match_index": {a: pysyncobj_patches.match_index(self.replica, a) for a in self.peers}
            if self.is_leader() else {},
            "journal_entries": s["log_len"],
            "journal_bytes": self.journal.size_bytes(),
            "snapshotting": self._snapshots.busy(),
            "journal_fsync": self.journal.stats.summary(),
            "peer_clock_offsets_ms": {a: round(us / 1000, 1) for a, us in self.clocks.offsets_us().items()},
            "entry_version": self.versions.writes(),
            "entry_version_newest": self.versions.newest,
            "peer_entry_versions": self.versions.peers_read(),
        }

    def destroy(self) -> None:
        """Stop the group and close its store; a second call does nothing."""
        if self._destroyed:
            return
        self._destroyed = True
        # Wait for the tick thread: it may be mid-apply on the store we close next.
        self.replica.destroy_synchronous()
        self._snapshots.abandon()
        self.store.close()
        # pysyncobj drops the callbacks of what it had not applied: their callers would wait
        # out the propose timeout for an answer that cannot come from here any more.
        for fut in list(self._pending):
            if not fut.get_loop().is_closed():
                fut.get_loop().call_soon_threadsafe(_fail_stopped, fut)


def _fail_stopped(fut: "asyncio.Future[Any]") -> None:
    if not fut.done():
        fut.set_exception(ProposalFailed("this node's replica of the group stopped before it applied the entry",
                                         maybe_applied=True))
