"""The metadata group on this node: a small Raft group whose state machine is
storage/meta.py (the node registry and the placement).

Its log holds registrations, state changes and placement changes: a few per node and per
move, so it is never compacted; a restart, and a member joining, replay it from the
first entry. The journal is fsynced like a data group's, with the same pysyncobj fixes."""
from __future__ import annotations

import asyncio
import copy
import logging
import os
import threading
import time
from typing import Any, Callable, Sequence

from pysyncobj import SyncObj, SyncObjConf, replicated

from schedulerd.raft import journal, membership, proposals, pysyncobj_patches, riders
from schedulerd.raft.conf import RaftConfig
from schedulerd.storage import codec, meta

log = logging.getLogger("schedulerd.raft")


class _MetaReplica(SyncObj):
    def __init__(self, owner: "MetaGroup", self_addr: str, peers: list[str], conf: SyncObjConf) -> None:
        self._owner = owner
        super().__init__(self_addr, peers, conf)

    @replicated
    def apply_command(self, blob: bytes) -> dict[str, Any]:
        return self._owner._apply(blob)


class HeardFrom:
    """A rider that keeps, on the leader, when each follower last answered (monotonic s)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    def answer_fields(self) -> dict[str, Any]:
        return {}

    def append_fields(self) -> dict[str, Any]:
        return {}

    def heard_answer(self, node: Any, message: dict[str, Any]) -> None:
        self.at[node.address] = time.monotonic()

    def heard_append(self, message: dict[str, Any]) -> None:
        """Followers learn nothing from this rider."""


class MetaGroup:
    """Thread model as a data group's: pysyncobj's tick thread applies, asyncio callers get
    results through futures and read the state through `view()`."""

    def __init__(self, self_addr: str, peers: Sequence[str], conf: RaftConfig,
                 on_fatal: Callable[[str], None]) -> None:
        self.self_addr = self_addr
        self.state = meta.empty()
        self._lock = threading.Lock()  # the tick thread applies while the API reads
        os.makedirs(conf.data_dir, exist_ok=True)
        journal_path = os.path.join(conf.data_dir, "meta.journal")
        log_journal = journal.DurableJournal(journal_path)
        journal.install(lambda path: log_journal)
        members = membership.members_in_log({self_addr, *peers}, 0, log_journal[:])
        self.peers = sorted(members - {self_addr})
        sconf = conf.sync_conf(journal_path)
        self.replica = _MetaReplica(self, self_addr, self.peers, sconf)
        self.journal = journal.journal_for(journal_path)
        self.journal.on_error = lambda error: on_fatal(f"group=meta journal: {error}")
        pysyncobj_patches.fix_log_replication(self.replica, self.journal)
        pysyncobj_patches.watch_membership(self.replica, self._members_changed)
        self._members_changed()
        self.heard = HeardFrom()
        riders.install(pysyncobj_patches.transport(self.replica), [self.heard])
        self._leader_since: float | None = None
        self.replica.addOnTickCallback(self._note_leadership)

    def _apply(self, blob: bytes) -> dict[str, Any]:
        """Never raises into pysyncobj: a command it cannot read is refused like a bad one."""
        try:
            command = codec.unpack(blob)
        except Exception as exc:
            return {"ok": False, "error": f"undecodable command: {exc}"}
        with self._lock:
            return meta.apply(self.state, command)

    def _members_changed(self) -> None:
        self.peers = sorted(node.address for node in self.replica.otherNodes)
        log.info("members_changed group=meta members=%s", ",".join(self.members()))

    def _note_leadership(self) -> None:
        if self.replica._isLeader():
            if self._leader_since is None:
                self._leader_since = time.monotonic()
        else:
            self._leader_since = None

    def silence_s(self) -> dict[str, float]:
        """On the leader: seconds since each other member last answered, counted from no
        earlier than when this node became leader; empty on a follower."""
        since = self._leader_since
        if since is None or not self.replica._isLeader():
            return {}
        now = time.monotonic()
        return {address: now - max(since, self.heard.at.get(address, since)) for address in self.peers}

    def members(self) -> list[str]:
        return sorted([self.self_addr, *self.peers])

    def view(self) -> dict[str, Any]:
        """A copy of the state as this replica has applied it."""
        with self._lock:
            return copy.deepcopy(self.state)

    def propose(self, command: dict[str, Any], loop: asyncio.AbstractEventLoop) -> "asyncio.Future[Any]":
        """Commit one command; the future resolves with its result on this replica."""
        fut, done = proposals.callback(loop, f"{command.get('op')}: ")
        self.replica.apply_command(codec.pack(command), callback=done)
        return fut

    def change_members(self, kind: str, address: str, loop: asyncio.AbstractEventLoop) -> "asyncio.Future[Any]":
        """Add ("add") or remove ("remove") a member of the metadata group itself, on its leader."""
        return proposals.change_members(self.replica, kind, address, loop)

    def is_leader(self) -> bool:
        return self.replica._isLeader()

    def leader(self) -> str | None:
        leader = self.replica._getLeader()
        return leader.address if leader is not None else None

    def destroy(self) -> None:
        self.replica.destroy_synchronous()
