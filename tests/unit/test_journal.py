"""DurableJournal: file format, crash recovery, and its wiring into pysyncobj."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from pysyncobj import SyncObj, SyncObjConf, replicated

from raft import journal as journal_mod
from raft.journal import MAGIC, DurableJournal, JournalError, install, journal_for, make_durable

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


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


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
    third_offset = journal._offsets[2]
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


def crash(journal: DurableJournal) -> DurableJournal:
    """Reopen as after kill -9: the file as it is, nothing synced or cut on the way out."""
    os.close(journal._fd)
    journal._fd = -1
    return DurableJournal(journal.path)


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
    assert journal_mod._read_meta(journal.meta_path) == (3, "127.0.0.1:1", 1)  # commit index: lazy
    journal.onOneSecondTimer()
    assert journal_mod._read_meta(journal.meta_path) == (3, "127.0.0.1:1", 5)
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
        wait_until(lambda: node._getLeader() is not None, "a leader")
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
        wait_until(lambda: node.values == [0, 1, 2], "the journal to be replayed")
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
        wait_until(lambda: any(n._isLeader() for n in nodes), "a leader")
        leader = next(n for n in nodes if n._isLeader())
        results: list[tuple[Any, int]] = []
        for i in range(50):
            leader.append(i, callback=lambda result, error: results.append((result, error)))
        wait_until(lambda: len(results) == 50, "50 callbacks")
        assert all(error == 0 for _, error in results), results
        wait_until(lambda: all(n.values == list(range(50)) for n in nodes), "all nodes to apply 50")
        for port, node in zip(ports, nodes):
            assert journal_for(str(tmp_path / str(port) / "journal")).stats.count >= 2
            assert node.undurable_applies == [] and node.undurable_acks == []
    finally:
        for node in nodes:
            node.destroy_synchronous()
