"""DurableJournal: file format, crash recovery, and its wiring into pysyncobj."""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Callable

import pytest
from pysyncobj import SyncObj, SyncObjConf, replicated

from schedulerd.raft import journal as journal_mod
from schedulerd.raft.journal import MAGIC, DurableJournal, JournalError, install, journal_for
from schedulerd.raft.pysyncobj_patches import make_durable
from tests.waiting import wait_until

DEADLINE_S = 8.0


def entries(n: int, first_idx: int = 1, term: int = 1) -> list[tuple[bytes, int, int]]:
    return [(b"cmd-%d" % i, i, term) for i in range(first_idx, first_idx + n)]


def open_with(path: Path, added: list[tuple[bytes, int, int]]) -> DurableJournal:
    journal = DurableJournal(str(path))
    for entry in added:
        journal.add(*entry)
    return journal


def reopen(journal: DurableJournal) -> DurableJournal:
    journal._destroy()
    return DurableJournal(journal.path)



# -- file format and recovery ------------------------------------------------


def test_round_trip_returns_exactly_what_was_added(tmp_path: Path) -> None:
    added = entries(5) + [(b"", 6, 2), (bytes(range(256)) * 300, 7, 2)]
    journal = reopen(open_with(tmp_path / "j", added))
    assert journal[:] == added
    assert [journal[i] for i in range(len(added))] == added
    assert journal[-1] == added[-1] and isinstance(journal[0], tuple)
    assert journal[2:4] == added[2:4] and len(journal) == len(added)
    journal._destroy()


def test_add_rejects_non_bytes_and_index_gaps(tmp_path: Path) -> None:
    journal = open_with(tmp_path / "j", entries(2))
    with pytest.raises(TypeError):
        journal.add("text", 3, 1)  # type: ignore[arg-type]
    with pytest.raises(JournalError):
        journal.add(b"gap", 5, 1)
    journal._destroy()


@pytest.mark.parametrize("cut_bytes", [1, 5, 24, 29])  # records here are 29 bytes
def test_truncated_tail_record_is_dropped(tmp_path: Path, cut_bytes: int) -> None:
    added = entries(4)
    open_with(tmp_path / "j", added)._destroy()
    size = os.path.getsize(tmp_path / "j")
    os.truncate(tmp_path / "j", size - cut_bytes)
    journal = DurableJournal(str(tmp_path / "j"))
    assert journal[:] == added[:3]
    journal.add(*added[3])  # the file was truncated at the last whole record
    assert reopen(journal)[:] == added


def test_garbage_tail_is_dropped_and_truncated(tmp_path: Path) -> None:
    added = entries(3)
    open_with(tmp_path / "j", added)._destroy()
    size = os.path.getsize(tmp_path / "j")
    with open(tmp_path / "j", "ab") as f:
        f.write(b"\xff" * 40)
    journal = DurableJournal(str(tmp_path / "j"))
    assert journal[:] == added
    assert os.path.getsize(tmp_path / "j") == size
    journal._destroy()


def test_crc_mismatch_stops_loading_there(tmp_path: Path) -> None:
    added = entries(5)
    journal = open_with(tmp_path / "j", added)
    third_offset = journal._locs[2][1]
    journal._destroy()
    with open(tmp_path / "j", "r+b") as f:
        f.seek(third_offset + 24 + 2)  # inside the third record's command bytes
        f.write(b"X")
    journal = DurableJournal(str(tmp_path / "j"))
    assert journal[:] == added[:2]
    assert os.path.getsize(tmp_path / "j") == third_offset
    journal._destroy()


def test_foreign_file_is_refused_not_truncated(tmp_path: Path) -> None:
    (tmp_path / "j").write_bytes(b"PYSYNCOBJ" + b"\0" * 100)  # a FileJournal
    with pytest.raises(JournalError, match="bad magic"):
        DurableJournal(str(tmp_path / "j"))
    assert os.path.getsize(tmp_path / "j") == 109


def test_second_writer_is_refused(tmp_path: Path) -> None:
    journal = DurableJournal(str(tmp_path / "j"))
    with pytest.raises(JournalError, match="already open"):
        DurableJournal(str(tmp_path / "j"))
    journal._destroy()


def test_delete_entries_from_persists(tmp_path: Path) -> None:
    added = entries(6)
    journal = open_with(tmp_path / "j", added)
    journal.deleteEntriesFrom(4)
    assert journal[:] == added[:4]
    journal.add(b"replacement", 5, 2)
    assert reopen(journal)[:] == added[:4] + [(b"replacement", 5, 2)]


def crash(journal: DurableJournal, keep_from: int = 0) -> DurableJournal:
    """Reopen as after kill -9: the files as they are, nothing synced or cut on the way out."""
    journal._close_files()
    return DurableJournal(journal.path, keep_from)


def test_resent_identical_entries_are_taken_back_without_writing(tmp_path: Path) -> None:
    added = entries(6)
    journal = open_with(tmp_path / "j", added)
    journal.sync()
    before = (tmp_path / "j").read_bytes()
    journal.deleteEntriesFrom(2)  # pysyncobj's rewind: the same entries come again
    for entry in added[2:]:
        journal.add(*entry)
    assert journal[:] == added
    assert (tmp_path / "j").read_bytes() == before
    assert reopen(journal)[:] == added


def test_an_acknowledged_entry_survives_a_crash_between_rewind_and_sync(tmp_path: Path) -> None:
    added = entries(6)
    journal = open_with(tmp_path / "j", added)
    journal.sync()  # entries 1..6 acknowledged to the leader
    journal.deleteEntriesFrom(2)
    journal.add(*added[2])
    assert crash(journal)[:] == added


def test_a_conflicting_entry_cuts_the_dropped_suffix(tmp_path: Path) -> None:
    added = entries(6)
    journal = open_with(tmp_path / "j", added)
    journal.sync()
    journal.deleteEntriesFrom(2)
    journal.add(*added[2])
    journal.add(b"other", 4, 9)
    journal.sync()
    assert crash(journal)[:] == added[:3] + [(b"other", 4, 9)]


def test_clear_persists(tmp_path: Path) -> None:
    journal = open_with(tmp_path / "j", entries(3))
    journal.clear()
    journal.add(b"snapshot-first", 40, 3)
    assert reopen(journal)[:] == [(b"snapshot-first", 40, 3)]
    assert os.path.getsize(tmp_path / "j") == len(MAGIC) + 24 + len(b"snapshot-first")


def test_delete_entries_to_persists_and_keeps_appending(tmp_path: Path) -> None:
    added = entries(6)
    journal = open_with(tmp_path / "j", added)
    journal.deleteEntriesTo(4)
    assert journal[:] == added[4:]
    assert journal.durable_index == 6
    journal.add(b"after", 7, 1)
    assert reopen(journal)[:] == added[4:] + [(b"after", 7, 1)]
    assert not os.path.exists(tmp_path / "j.tmp")


def segment_files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name == "j" or p.name[2:].isdigit())


def test_compaction_rewrites_no_entry_and_deletes_what_it_dropped(tmp_path: Path, monkeypatch) -> None:
    added = entries(30)
    journal = open_with(tmp_path / "j", added)
    writes: list[int] = []
    real_pwrite_all = journal_mod.segments.pwrite_all
    monkeypatch.setattr(journal_mod.segments, "pwrite_all",
                        lambda fd, data, offset: (writes.append(len(data)), real_pwrite_all(fd, data, offset)))
    journal.deleteEntriesTo(10)
    assert writes == [len(MAGIC)] and journal[:] == added[10:], "only the new segment's header"
    journal.add(b"after", 31, 1)
    journal.deleteEntriesTo(20)  # entries 11..30 were in "j": it holds nothing kept now
    assert journal[:] == [(b"after", 31, 1)]
    wait_until(lambda: segment_files(tmp_path) == ["j.1", "j.2"], DEADLINE_S, "the dropped segment's removal")
    journal.add(b"later", 32, 1)
    assert reopen(journal)[:] == [(b"after", 31, 1), (b"later", 32, 1)]


def test_the_new_first_index_is_stored_with_the_next_meta_write(tmp_path: Path) -> None:
    """Until then a crash brings dropped entries back, which a node's loader skips
    (keep_from: its snapshot covers them); after it they stay dropped on their own."""
    added = entries(6)
    journal = open_with(tmp_path / "j", added)
    journal.deleteEntriesTo(3)
    journal.sync()
    assert crash(journal)[:] == added
    journal = open_with(tmp_path / "k", added)
    journal.deleteEntriesTo(3)
    journal.onOneSecondTimer()
    assert crash(journal)[:] == added[3:]


def test_a_segment_whose_header_never_reached_the_disk_is_an_empty_one(tmp_path: Path) -> None:
    journal = open_with(tmp_path / "j", entries(3))
    journal.deleteEntriesTo(1)
    journal._close_files()
    os.truncate(tmp_path / "j.1", 3)  # created, then a power loss before any sync
    journal = DurableJournal(str(tmp_path / "j"))
    assert journal[:] == entries(3)  # the meta with the new first index was not written either
    journal.add(b"cmd-4", 4, 1)
    assert reopen(journal)[-1] == (b"cmd-4", 4, 1) and (tmp_path / "j.1").read_bytes()[:len(MAGIC)] == MAGIC


def test_segments_end_at_their_size_and_only_the_active_one_is_open(tmp_path: Path) -> None:
    open_before = len(os.listdir("/proc/self/fd"))
    added = entries(40)
    journal = DurableJournal(str(tmp_path / "j"), segment_bytes=100)  # four ~30-byte records each
    for entry in added:
        journal.add(*entry)
    assert len(segment_files(tmp_path)) == 10
    assert len(os.listdir("/proc/self/fd")) == open_before + 1
    journal.deleteEntriesTo(20)  # entries 1..20 filled segments 0..4
    wait_until(lambda: len(segment_files(tmp_path)) == 10 - 5 + 1, DEADLINE_S, "the dropped segments' removal")
    journal._destroy()
    assert DurableJournal(str(tmp_path / "j"), segment_bytes=100)[:] == added[20:]


def test_the_size_is_of_the_entries_kept(tmp_path: Path) -> None:
    journal = open_with(tmp_path / "j", entries(10))
    record = 24 + len(b"cmd-1")
    assert journal.size_bytes() == 9 * record + 24 + len(b"cmd-10")
    journal.deleteEntriesTo(8)
    assert journal.size_bytes() == record + 24 + len(b"cmd-10")
    journal.deleteEntriesFrom(1)
    assert journal.size_bytes() == record
    journal._destroy()


def test_loading_skips_what_the_snapshot_covers(tmp_path: Path) -> None:
    """A crash after a snapshot was put in place but before the journal was compacted:
    the journal starts at the entry the snapshot needs, not at one pysyncobj would
    answer by clearing the journal."""
    added = entries(10)
    open_with(tmp_path / "j", added)._destroy()
    journal = DurableJournal(str(tmp_path / "j"), keep_from=6)
    assert journal[:] == added[5:]
    journal.add(b"next", 11, 1)
    journal._destroy()
    assert DurableJournal(str(tmp_path / "j"), keep_from=6)[:] == added[5:] + [(b"next", 11, 1)]


def test_segments_left_by_an_unfinished_removal_are_removed_at_load(tmp_path: Path, monkeypatch) -> None:
    journal = open_with(tmp_path / "j", entries(10))
    monkeypatch.setattr(journal_mod.segments, "remove_beside", lambda paths: None)  # a crash before it ran
    journal.deleteEntriesTo(5)
    journal.add(b"cmd-11", 11, 1)
    journal.add(b"cmd-12", 12, 1)
    journal.deleteEntriesTo(5)  # 11 and 12 kept, in "j.1": "j" holds only dropped entries
    assert segment_files(tmp_path) == ["j", "j.1", "j.2"]
    journal._destroy()
    assert DurableJournal(str(tmp_path / "j"))[:] == entries(2, 11)
    assert segment_files(tmp_path) == ["j.1", "j.2"]


def two_segments(tmp_path: Path) -> tuple[DurableJournal, list[tuple[bytes, int, int]]]:
    """Entries 2..5 in "j" (1 dropped) and 6..8 in "j.1", all synced."""
    added = entries(8)
    journal = open_with(tmp_path / "j", added[:5])
    journal.deleteEntriesTo(1)
    for entry in added[5:]:
        journal.add(*entry)
    journal.sync()
    return journal, added


def test_identical_entries_resent_across_a_segment_boundary_are_taken_back(tmp_path: Path) -> None:
    journal, added = two_segments(tmp_path)
    before = {name: (tmp_path / name).read_bytes() for name in segment_files(tmp_path)}
    journal.deleteEntriesFrom(1)  # from entry 3, in "j"; 6..8 are in "j.1"
    for entry in added[2:]:
        journal.add(*entry)
    assert {name: (tmp_path / name).read_bytes() for name in segment_files(tmp_path)} == before
    assert crash(journal, keep_from=2)[:] == added[1:]


def test_a_conflict_in_an_earlier_segment_cuts_it_and_deletes_the_later_ones(tmp_path: Path) -> None:
    journal, added = two_segments(tmp_path)
    journal.deleteEntriesFrom(1)  # from entry 3, in "j"
    journal.add(*added[2])
    journal.add(b"other", 4, 9)
    journal.sync()
    assert segment_files(tmp_path) == ["j"]
    assert crash(journal, keep_from=2)[:] == added[1:3] + [(b"other", 4, 9)]


def test_a_damaged_record_in_a_sealed_segment_is_an_error(tmp_path: Path) -> None:
    journal = open_with(tmp_path / "j", entries(5))
    journal.deleteEntriesTo(1)
    journal.add(b"cmd-6", 6, 1)
    journal._destroy()
    with open(tmp_path / "j", "r+b") as f:
        f.seek(-2, os.SEEK_END)
        f.write(b"XX")
    with pytest.raises(JournalError, match="sealed segment"):
        DurableJournal(str(tmp_path / "j"))


def test_a_meta_file_from_before_compaction_stored_the_first_index_loads(tmp_path: Path) -> None:
    journal_mod.segments.replace_durably(str(tmp_path / "j.meta"), journal_mod.codec.pack(
        {"term": 4, "voted_for": None, "commit_index": 9}))
    journal = DurableJournal(str(tmp_path / "j"))
    assert (journal.getCurrentTerm(), journal.getRaftCommitIndex()) == (4, 9)
    journal._destroy()


def test_meta_persists(tmp_path: Path) -> None:
    journal = DurableJournal(str(tmp_path / "j"))
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId(), journal.getRaftCommitIndex()) == (0, None, 1)
    journal.setCurrentTerm(7, "127.0.0.1:4321")
    journal.setRaftCommitIndex(12)
    assert journal.getRaftCommitIndex() == 12
    journal = reopen(journal)  # _destroy stores the lazily kept commit index
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId(), journal.getRaftCommitIndex()) == (
        7,
        "127.0.0.1:4321",
        12,
    )
    journal.setCurrentTerm(8, None)
    assert reopen(journal).getVotedForNodeId() is None


def test_term_and_vote_are_stored_synchronously(tmp_path: Path) -> None:
    journal = DurableJournal(str(tmp_path / "j"))
    journal.setCurrentTerm(3, "127.0.0.1:1")
    journal.setRaftCommitIndex(5)
    assert journal_mod._read_meta(journal.meta_path) == (3, "127.0.0.1:1", 1, 0)  # commit index: lazy
    journal.onOneSecondTimer()
    assert journal_mod._read_meta(journal.meta_path) == (3, "127.0.0.1:1", 5, 0)
    journal._destroy()


def test_sync_calls_fdatasync_only_when_dirty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = DurableJournal(str(tmp_path / "j"))
    calls: list[int] = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real_fdatasync(fd)))
    journal.sync()
    assert calls == []
    journal.add(b"a", 1, 1)
    journal.add(b"b", 2, 1)
    assert journal.durable_index == 0
    journal.flush()
    assert len(calls) == 1 and journal.durable_index == 2
    journal.sync()
    assert len(calls) == 1
    assert journal.stats.time_s_max >= journal.stats.time_s_last > 0
    journal._destroy()


def test_failed_fdatasync_is_never_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = DurableJournal(str(tmp_path / "j"))
    journal.add(b"a", 1, 1)

    def eio(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    with pytest.raises(JournalError):
        journal.sync()
    monkeypatch.undo()
    with pytest.raises(JournalError):  # must not report success now
        journal.sync()
    with pytest.raises(JournalError):
        journal.add(b"b", 2, 1)
    journal._destroy()


def test_make_durable_syncs_before_replies(tmp_path: Path) -> None:
    """Fake SyncObj: the follower's reply must leave after the fsync."""
    journal = DurableJournal(str(tmp_path / "j"))
    sent: list[tuple[str, int]] = []

    class Transport:
        def send(self, node: Any, message: dict[str, Any]) -> bool:
            sent.append((message["type"], journal.durable_index))
            return True

    class FakeSyncObj:
        _SyncObj__raftLog = journal
        _SyncObj__transport = Transport()
        tick_callbacks: list[Callable[[], None]] = []

        def addOnTickCallback(self, callback: Callable[[], None]) -> None:
            self.tick_callbacks.append(callback)

    fake = FakeSyncObj()
    make_durable(fake, journal)  # type: ignore[arg-type]
    transport = fake._SyncObj__transport
    journal.add(b"a", 1, 1)
    transport.send("peer", {"type": "append_entries"})  # leader traffic: no fsync needed
    transport.send("peer", {"type": "next_node_idx"})
    journal.add(b"b", 2, 1)
    fake.tick_callbacks[0]()
    assert sent == [("append_entries", 0), ("next_node_idx", 1)]
    assert journal.durable_index == 2
    with pytest.raises(ValueError):
        make_durable(fake, DurableJournal(str(tmp_path / "other")))  # type: ignore[arg-type]
    journal._destroy()


# -- real pysyncobj ---------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Log(SyncObj):
    """One replicated method; records entries applied or acked before they were durable."""

    def __init__(self, directory: Path, port: int, peers: list[int]) -> None:
        self.values: list[int] = []
        self.undurable_applies: list[int] = []
        self.undurable_acks: list[int] = []
        conf = SyncObjConf(
            journalFile=str(directory / "journal"),
            fullDumpFile=str(directory / "dump"),
            appendEntriesPeriod=0.02,
            raftMinTimeout=0.1,
            raftMaxTimeout=0.25,
            autoTickPeriod=0.01,
            leaderFallbackTimeout=2.0,
        )
        super().__init__(f"127.0.0.1:{port}", [f"127.0.0.1:{p}" for p in peers], conf)

    @replicated
    def append(self, value: int) -> int:
        index = self.raftLastApplied + 1
        if journal_for(self._SyncObj__conf.journalFile).durable_index < index:
            self.undurable_applies.append(index)
        self.values.append(value)
        return len(self.values)


def record_undurable_acks(node: Log, journal: DurableJournal) -> None:
    """Wrap the raw send before make_durable does, so this check runs after its sync."""
    transport = node._SyncObj__transport
    send = transport.send

    def checked_send(peer: Any, message: dict[str, Any]) -> bool:
        if message["type"] == "next_node_idx" and message["success"]:
            if journal.durable_index < message["next_node_idx"] - 1:
                node.undurable_acks.append(message["next_node_idx"] - 1)
        return send(peer, message)

    transport.send = checked_send


def test_single_node_uses_durable_journal_across_restart(tmp_path: Path) -> None:
    install()
    install()  # idempotent
    port = free_port()
    node = Log(tmp_path, port, [])
    try:
        journal = journal_for(str(tmp_path / "journal"))
        make_durable(node, journal)
        wait_until(lambda: node._getLeader() is not None, DEADLINE_S, "a leader")
        assert [node.append(i, sync=True, timeout=5) for i in range(3)] == [1, 2, 3]
        assert journal.stats.count >= 2  # one at open, then the tick callback
        assert node.undurable_applies == []
        written = journal[:]
    finally:
        node.destroy_synchronous()
    assert len(written) >= 5  # initial no-op, leader no-op, 3 commands

    node = Log(tmp_path, port, [])
    try:
        assert journal_for(str(tmp_path / "journal"))[:] == written
        wait_until(lambda: node.values == [0, 1, 2], DEADLINE_S, "the journal to be replayed")
    finally:
        node.destroy_synchronous()


def test_three_nodes_replicate_and_sync(tmp_path: Path) -> None:
    install()
    ports = [free_port() for _ in range(3)]
    nodes: list[Log] = []
    try:
        for port in ports:
            directory = tmp_path / str(port)
            directory.mkdir()
            node = Log(directory, port, [p for p in ports if p != port])
            nodes.append(node)
            record_undurable_acks(node, journal_for(str(directory / "journal")))
            make_durable(node, journal_for(str(directory / "journal")))
        wait_until(lambda: any(n._isLeader() for n in nodes), DEADLINE_S, "a leader")
        leader = next(n for n in nodes if n._isLeader())
        results: list[tuple[Any, int]] = []
        for i in range(50):
            leader.append(i, callback=lambda result, error: results.append((result, error)))
        wait_until(lambda: len(results) == 50, DEADLINE_S, "50 callbacks")
        assert all(error == 0 for _, error in results), results
        wait_until(lambda: all(n.values == list(range(50)) for n in nodes), DEADLINE_S, "all nodes to apply 50")
        for port, node in zip(ports, nodes):
            assert journal_for(str(tmp_path / str(port) / "journal")).stats.count >= 2
            assert node.undurable_applies == [] and node.undurable_acks == []
    finally:
        for node in nodes:
            node.destroy_synchronous()
