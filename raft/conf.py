"""Raft settings for one node, with units in the names and their relations checked."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from pysyncobj import SyncObjConf

SECRET_CHARS_MIN = 16


@dataclass(frozen=True)
class RaftConfig:
    # This node's Raft address (host:port) for group 0; group g listens on port + g.
    self_addr: str
    # The other nodes' Raft addresses for group 0, same port convention.
    peers: tuple[str, ...] = ()
    # Where journals, snapshots and LMDB environments live.
    data_dir: str = "./schedulerd-data"
    # Raft groups on this node; shards are spread over them (shard % groups).
    groups: int = 1
    # Election timeout is drawn from [min, max] seconds. Lower = faster failover,
    # but too low on a loaded 2-core box causes needless elections.
    election_timeout_s_min: float = 0.5
    election_timeout_s_max: float = 1.0
    # Leader heartbeat period; commands are sent at once (no batching delay).
    append_entries_period_s: float = 0.05
    # How often a node tries again to reach a peer it has no connection to; below
    # election_timeout_s_min, so a restarted node hears the leader before it would
    # campaign. At pysyncobj's 5 s it went unheard for up to that long, calling elections
    # all the while, each with a higher term that unseated the leader.
    reconnect_s: float = 0.2
    # A leader that has not heard from a majority for this long steps down
    # (pysyncobj's default of 30 s lets an isolated leader believe for too long).
    leader_fallback_s: float = 1.5
    # A follower's clock, heard in its answers to appends, counts toward the leader's
    # figure of the cluster's time for this long, and a follower keeps the figure the
    # leader last sent as long (raft/clocks.py); after, as if never heard.
    clock_fresh_s: float = 1.0
    # Compact the log into an LMDB snapshot once it holds more than this many entries
    # and its journal weighs compaction_journal_ratio x the last snapshot's size, or
    # whenever the journal reaches compaction_journal_bytes_max (raft/compaction.py).
    compaction_entries_min: int = 20_000
    compaction_journal_ratio: float = 0.25
    compaction_journal_bytes_max: int = 128 << 20
    # Snapshot bytes per Raft message when a lagging node is sent the leader's snapshot
    # (pysyncobj's default is 64 KiB); also the socket buffer sizes. The leader queues
    # at most two pieces per follower (raft/pysyncobj_patches.py).
    snapshot_chunk_bytes: int = 1 << 20
    # A background compaction copy writes at most this many bytes per second (0: as fast as
    # the disk goes). Each journal fdatasync waits for the copy's bytes queued before it:
    # paced, a 1M-job store's 760 MB copy takes ~7 s and leaves commits their latency.
    snapshot_write_bytes_per_s: int = 100 << 20
    # Largest Raft entry, and the size of one append message. pysyncobj 0.3.17 sends a
    # bigger entry in pieces and marks its last piece wrongly (by the command's length,
    # not the pickled entry's): an entry just under a multiple of the piece size reached
    # followers cut short. So no entry is ever split: proposals above this are refused,
    # and the API's limits keep every entry it builds below it (schedulerd/config.py).
    entry_bytes_max: int = 4 << 20
    # Virtual size of each LMDB map (a sparse file; grows as data does).
    lmdb_map_bytes: int = 32 << 30
    # Start the kernel writing back the store's dirty pages this often (0: leave them to
    # the kernel, which writes them ~30 s after they were dirtied, hundreds of MB at once,
    # and stalls every journal fsync behind them; raft/writeback.py). Shorter writes
    # more: LMDB rewrites its hot pages every commit, and each call writes them again.
    # At 10,000 jobs/s, 5 s wrote 1.34x the bytes of the kernel's 30 s.
    lmdb_writeback_s: float = 5.0
    # Shared cluster secret: pysyncobj derives a Fernet key (AES + HMAC) from it and
    # every Raft message is encrypted and authenticated. None: plain pickle (loopback only).
    secret: str | None = field(default=None, repr=False)

    def validate(self) -> None:
        if not 0 < self.election_timeout_s_min < self.election_timeout_s_max:
            raise ValueError("need 0 < election_timeout_s_min < election_timeout_s_max")
        if self.append_entries_period_s * 3 > self.election_timeout_s_min:
            raise ValueError("append_entries_period_s must be at most a third of election_timeout_s_min, "
                             "or followers time out between heartbeats")
        if not 0 < self.reconnect_s < self.election_timeout_s_min:
            raise ValueError("reconnect_s must be above 0 and below election_timeout_s_min, or a restarted "
                             "node calls elections before the leader reaches it")
        if self.leader_fallback_s <= self.election_timeout_s_max:
            raise ValueError("leader_fallback_s must exceed election_timeout_s_max so a healthy "
                             "leader is not demoted before its followers would elect another")
        if self.entry_bytes_max < 64 << 10:
            raise ValueError("entry_bytes_max must be at least 64 KiB")
        if self.snapshot_write_bytes_per_s != 0 and self.snapshot_write_bytes_per_s < 1 << 20:
            raise ValueError("snapshot_write_bytes_per_s must be 0 (unpaced) or at least 1 MiB/s")
        if self.lmdb_writeback_s != 0 and not 1 <= self.lmdb_writeback_s <= 60:
            raise ValueError("lmdb_writeback_s must be 0 (the kernel's own writeback) or within 1..60 seconds")
        if self.compaction_entries_min < 10:
            raise ValueError("compaction_entries_min must be at least 10")
        if not 0 <= self.compaction_journal_ratio <= 10:
            raise ValueError("compaction_journal_ratio must be within 0..10")
        if self.compaction_journal_bytes_max < 1 << 20:
            raise ValueError("compaction_journal_bytes_max must be at least 1 MiB")
        if not 1 <= self.groups <= 64:
            raise ValueError("groups must be 1..64")
        for addr in (self.self_addr, *self.peers):
            group_addr(addr, self.groups)  # the metadata group's port, the highest, must exist
        if self.secret is not None and len(self.secret) < SECRET_CHARS_MIN:
            raise ValueError(f"the cluster secret must be at least {SECRET_CHARS_MIN} characters")

    def sync_conf(self, journal_path: str, **extra: Any) -> SyncObjConf:
        """pysyncobj's settings for a group of this node (`extra` adds or overrides): a
        durable journal, one append per proposal, our timings, compaction left to the
        caller, members that change one at a time."""
        settings: dict[str, Any] = dict(
            journalFile=journal_path,
            appendEntriesUseBatch=False,
            appendEntriesPeriod=self.append_entries_period_s,
            raftMinTimeout=self.election_timeout_s_min,
            raftMaxTimeout=self.election_timeout_s_max,
            connectionRetryTime=self.reconnect_s,
            leaderFallbackTimeout=self.leader_fallback_s,
            # pysyncobj's own rule (entries or seconds) is off: the caller decides.
            logCompactionMinEntries=sys.maxsize,
            logCompactionMinTime=float("inf"),
            dynamicMembershipChange=True,
            commandsWaitLeader=False,
            password=self.secret,
        )
        settings.update(extra)
        return SyncObjConf(**settings)

    def meta_addrs(self) -> tuple[str, list[str]]:
        """The metadata group listens on the port after the data groups' (Raft port + groups)."""
        return self.node_addrs(self.groups)

    def node_addrs(self, group: int) -> tuple[str, list[str]]:
        return group_addr(self.self_addr, group), [group_addr(p, group) for p in self.peers]


def group_addr(addr: str, group: int) -> str:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) + group < 65536:
        raise ValueError(f"bad Raft address {addr!r}; expected HOST:PORT")
    return f"{host}:{int(port) + group}"
