"""The metadata group on this node: a small Raft group whose state machine is
storage/meta.py (the node registry and the placement).

Its log holds registrations, state changes and placement changes: a few per node and per
move, so it is never compacted; a restart, and a member joining, replay it from the
first entry. The journal is fsynced like a data group's, with the same pysyncobj fixes."""
from __future__ import annotations

import asyncio
import logging
import os
import pickle
import threading
import time
from typing import Any, Callable, Iterable, Sequence

from pysyncobj import SyncObj, SyncObjConf, replicated

from schedulerd.raft import journal, membership, proposals, pysyncobj_patches, riders
from schedulerd.raft.conf import RaftConfig
from schedulerd.storage import codec, meta

log = logging.getLogger("schedulerd.raft")


class _MetaReplica(SyncObj):
    def __init__(self, owner: "MetaGroup", self_addr: str | None, peers: list[str], conf: SyncObjConf) -> None:
        """`self_addr` None: an observer (pysyncobj's read-only node), which dials every
        voter, is sent the log like a follower, and never votes or stands for election."""
        self._owner = owner
        super().__init__(self_addr, peers, conf)

    @replicated
    def apply_command(self, blob: bytes) -> dict[str, Any]:
        return self._owner._apply(blob)


class HeardFrom:
    """A rider that keeps, on the leader, when each follower or observer last answered, and
    on a follower when the leader last sent (monotonic s). An answer names its sender's
    metadata address: pysyncobj knows an observer only by a connection number."""

    def __init__(self, self_addr: str) -> None:
        self.self_addr = self_addr
        self.at: dict[str, float] = {}
        self.leader_at = 0.0  # on a follower: when the leader was last heard

    def answer_fields(self) -> dict[str, Any]:
        return {"from_addr": self.self_addr}

    def append_fields(self) -> dict[str, Any]:
        return {}

    def heard_answer(self, node: Any, message: dict[str, Any]) -> None:
        address = message.get("from_addr") or getattr(node, "address", None)
        if isinstance(address, str):
            self.at[address] = time.monotonic()

    def heard_append(self, message: dict[str, Any]) -> None:
        self.leader_at = time.monotonic()


class MetaGroup:
    """Thread model as a data group's: pysyncobj's tick thread applies, asyncio callers get
    results through futures and read the state through `view()`.

    A node runs its replica as a voter or as an observer (storage/meta_voters.py says
    which); both keep the same journal, so a node switched from one to the other (a new
    MetaGroup on the same data dir) starts from the log it has."""

    def __init__(self, self_addr: str, first_members: Sequence[str], conf: RaftConfig,
                 on_fatal: Callable[[str], None], voter: bool | None = None) -> None:
        """`first_members`: the voters as of the log's first entry when this data dir holds
        none yet (the first nodes' addresses, or the voters a joining node was told of);
        `voter`: run as a voter or an observer, or (None) as the log says. A voter that its
        own log does not hold yet is being added to a running group: it votes only once its
        log holds the entry that adds it."""
        self.self_addr = self_addr
        # Called in the tick thread after each applied command (the topology wakes on it).
        self.on_applied: Callable[[], None] = lambda: None
        self.state = meta.empty()
        self._lock = threading.Lock()  # the tick thread applies while the API reads
        os.makedirs(conf.data_dir, exist_ok=True)
        journal_path = os.path.join(conf.data_dir, "meta.journal")
        first = membership.first_members(os.path.join(conf.data_dir, "meta.members"), first_members,
                                         not os.path.exists(journal_path))
        log_journal = journal.DurableJournal(journal_path)
        journal.install(lambda path: log_journal)
        members = membership.members_in_log(first, 0, log_journal[:])
        self.voter = self_addr in members if voter is None else voter
        self._member_since: dict[str, float] = {}  # when each member was added, as this replica saw it
        self._watched_since: dict[str, float] = {}  # on the leader: when it was first asked about each observer
        self.peers = sorted(members - {self_addr})
        sconf = conf.sync_conf(journal_path)
        self.replica = _MetaReplica(self, self_addr if self.voter else None, self.peers, sconf)
        self.journal = journal.journal_for(journal_path)
        self.journal.on_error = lambda error: on_fatal(f"group=meta journal: {error}")
        if self.voter and self_addr not in members:  # first, as a data group's (raft/group.py)
            pysyncobj_patches.no_votes_before_joining(self.replica)
        pysyncobj_patches.fix_log_replication(self.replica, self.journal)
        pysyncobj_patches.close_notifier_on_destroy(self.replica)
        pysyncobj_patches.watch_membership(self.replica, self._members_changed)
        self._members_changed()
        self.heard = HeardFrom(self_addr)
        # A follower that has not heard its leader for this long (a removed member is never
        # told; pysyncobj keeps the last leader it knew) does not take its view as current.
        self._heard_within_s = 2 * conf.election_timeout_s_max
        riders.install(pysyncobj_patches.transport(self.replica), [self.heard])
        self._leader_since: float | None = None
        self._step_down_requested = False
        self.replica.addOnTickCallback(self._note_leadership)
        self.replica.addOnTickCallback(self._step_down_if_requested)

    def _apply(self, blob: bytes) -> dict[str, Any]:
        """Never raises into pysyncobj: a command it cannot read is refused like a bad one."""
        try:
            command = codec.unpack(blob)
        except Exception as exc:
            return {"ok": False, "error": f"undecodable command: {exc}"}
        with self._lock:
            result = meta.apply(self.state, command)
        self.on_applied()
        return result

    def _members_changed(self) -> None:
        self.peers = sorted(node.address for node in self.replica.otherNodes)
        now = time.monotonic()
        self._member_since = {a: self._member_since.get(a, now) for a in self.peers}
        log.info("members_changed group=meta members=%s", ",".join(self.members()))

    def _note_leadership(self) -> None:
        if self.replica._isLeader():
            if self._leader_since is None:
                self._leader_since = time.monotonic()
        else:
            self._leader_since = None

    def request_step_down(self) -> None:
        """Hand leadership to the most caught-up member (done in the tick thread)."""
        self._step_down_requested = True

    def _step_down_if_requested(self) -> None:
        if self._step_down_requested:
            self._step_down_requested = False
            if self.replica._isLeader():
                self.replica.transferLeadership()

    def silence_s(self, observers: Iterable[str]) -> dict[str, float]:
        """On the leader: seconds since each other voter, and each of `observers` (metadata
        addresses), last answered, counted from no earlier than when this node became
        leader, the voter was added or the observer was first asked about; empty on a
        follower."""
        since = self._leader_since
        if since is None or not self.replica._isLeader():
            return {}
        now = time.monotonic()
        watched = set(observers) - set(self.peers) - {self.self_addr}
        self._watched_since = {a: self._watched_since.get(a, now) for a in watched}
        floors = {**self._watched_since, **self._member_since}
        return {address: now - max(since, floors.get(address, since), self.heard.at.get(address, since))
                for address in self.peers + sorted(watched)}

    def members(self) -> list[str]:
        """The voters' metadata addresses."""
        return sorted([self.self_addr, *self.peers] if self.voter else self.peers)

    def is_current(self) -> bool:
        """This replica heard its leader lately and has applied all the leader had committed:
        its view may be acted on to take something away (a stale one could drop a replica
        the placement gave this node since)."""
        s = self.replica.getStatus()
        leader_commit = s["leader_commit_idx"]
        heard = self.replica._isLeader() or time.monotonic() - self.heard.leader_at < self._heard_within_s
        return heard and s["leader"] is not None and leader_commit is not None and s["last_applied"] >= leader_commit

    def view(self) -> dict[str, Any]:
        """A copy of the state as this replica has applied it."""
        # A pickle round trip copies this plain data about 4x faster than deepcopy, and the
        # topology asks for a view several times a second on every node.
        with self._lock:
            blob = pickle.dumps(self.state, pickle.HIGHEST_PROTOCOL)
        return pickle.loads(blob)

    def calendars(self) -> dict[str, Any]:
        """The holiday calendars as this replica has applied them, uncopied (the data groups'
        leaders read them for every claim): each applied command replaces the dict whole
        (meta.apply works on a copy), so it never changes under a reader, who must not change it."""
        with self._lock:
            calendars: dict[str, Any] = self.state["calendars"]
        return calendars

    def queue_limits(self) -> dict[str, Any]:
        """The queues' limits (storage/meta.py), uncopied, as `calendars()`: every lease entry
        this node proposes reads them."""
        with self._lock:
            limits: dict[str, Any] = self.state["queue_limits"]
        return limits

    def propose(self, command: dict[str, Any], loop: asyncio.AbstractEventLoop) -> "asyncio.Future[Any]":
        """Commit one command; the future resolves with its result on this replica."""
        fut, done = proposals.callback(loop, f"{command.get('op')}: the metadata group ")
        self.replica.apply_command(codec.pack(command), callback=done)
        return fut

    def change_members(self, kind: str, address: str, loop: asyncio.AbstractEventLoop) -> "asyncio.Future[Any]":
        """Add ("add") or remove ("remove") a member of the metadata group itself, on its leader."""
        return proposals.change_members(self.replica, kind, address, loop)

    def is_leader(self) -> bool:
        return self.replica._isLeader()

    def listening(self) -> bool:
        """Whether pysyncobj bound this replica's port (it retries quietly while it cannot);
        an observer binds none."""
        return not self.voter or bool(pysyncobj_patches.transport(self.replica).ready)

    def leader(self) -> str | None:
        leader = self.replica._getLeader()
        return leader.address if leader is not None else None

    def destroy(self) -> None:
        self.replica.destroy_synchronous()
