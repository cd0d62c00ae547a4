"""Which entry version a node writes (raft/entry_versions.py), and the leader refusing an
entry newer than that as it appends it (raft/group.py)."""
from __future__ import annotations

import queue
from types import SimpleNamespace
from typing import Any

import pysyncobj.pickle
import pytest
from pysyncobj import FAIL_REASON
from pysyncobj.fast_queue import FastQueue

from schedulerd.raft import riders
from schedulerd.raft.entry_versions import READS, WRITES, EntryVersions
from schedulerd.raft.pysyncobj_patches import _REGULAR, vet_as_leader_appends
from schedulerd.storage import ops
from schedulerd.storage.ops import Op
from tests.unit.faketransport import Peer, Transport

NEWEST, FLOOR = 8, 6


def versions(leading: bool = True, newest: int = NEWEST) -> tuple[EntryVersions, Transport]:
    v = EntryVersions(newest, FLOOR, voters=3, is_leader=lambda: leading)
    transport = Transport()
    riders.install(transport, [v])
    return v, transport


def answer(transport: Transport, address: str, reads: int | None) -> None:
    message: dict[str, Any] = {"type": "next_node_idx", "success": True}
    if reads is not None:
        message[READS] = reads
    transport.deliver(Peer(address), message)


def test_a_leader_writes_the_newest_version_every_voter_reads() -> None:
    v, transport = versions()
    answer(transport, "b", 8)
    answer(transport, "c", 7)
    assert v.writes() == 7 and v.peers_read() == {"b": 8, "c": 7}
    answer(transport, "c", 8)  # c upgraded: the cluster moves on by itself
    assert v.writes() == 8


def test_never_above_what_the_leader_itself_reads() -> None:
    v, transport = versions(newest=7)
    answer(transport, "b", 8)
    answer(transport, "c", 8)
    assert v.writes() == 7


def test_until_every_voter_has_said_what_it_reads_a_leader_writes_the_floor() -> None:
    v, transport = versions()
    assert v.writes() == FLOOR
    answer(transport, "b", 8)
    answer(transport, "c", None)  # an older build: says nothing
    assert v.writes() == FLOOR


def test_a_voter_counts_at_what_it_last_said_though_it_stops_answering() -> None:
    v, transport = versions()
    answer(transport, "b", 8)
    answer(transport, "c", 7)
    answer(transport, "b", 8)  # c is down: it replays what is written meanwhile when it is back
    assert v.writes() == 7


def test_a_follower_writes_what_the_leader_told_it_never_above_what_it_reads() -> None:
    v, transport = versions(leading=False, newest=7)
    assert v.writes() == FLOOR  # told nothing yet
    transport.deliver(Peer("a"), {"type": "append_entries", WRITES: 7})
    assert v.writes() == 7
    transport.deliver(Peer("a"), {"type": "append_entries", WRITES: 9})
    assert v.writes() == 7
    transport.deliver(Peer("a"), {"type": "append_entries"})  # a leader of an older build
    assert v.writes() == 7


def test_a_new_leader_keeps_the_last_leaders_figure_until_it_has_heard_every_voter() -> None:
    leading = [False]
    v = EntryVersions(NEWEST, FLOOR, voters=3, is_leader=lambda: leading[0])
    transport = Transport()
    riders.install(transport, [v])
    transport.deliver(Peer("a"), {"type": "append_entries", WRITES: 8})
    leading[0] = True
    answer(transport, "b", 8)
    assert v.writes() == 8
    answer(transport, "c", 7)
    assert v.writes() == 7


def test_the_floor_is_written_whatever_a_voter_says() -> None:
    v, transport = versions()
    answer(transport, "b", 3)
    answer(transport, "c", "junk")  # type: ignore[arg-type]
    assert v.writes() == FLOOR


def test_answers_and_appends_carry_the_figures() -> None:
    v, transport = versions()
    answer(transport, "b", 7)
    answer(transport, "c", 8)
    transport.send(Peer("b"), {"type": "next_node_idx", "success": True})
    transport.send(Peer("b"), {"type": "append_entries", "entries": []})
    transport.send(Peer("b"), {"type": "request_vote"})
    (_, sent_answer), (_, sent_append), (_, vote) = transport.sent
    assert sent_answer[READS] == NEWEST and sent_append[WRITES] == 7
    assert READS not in vote and WRITES not in vote


class Leader:
    """What vet_as_leader_appends touches of a SyncObj: its command queue, its error
    callback and whether it leads."""

    def __init__(self, leading: bool = True) -> None:
        self.queue = FastQueue(0)
        self.refused: list[tuple[int, Any]] = []
        self.replica = SimpleNamespace(_SyncObj__commandsQueue=self.queue,
                                       _SyncObj__callErrCallback=lambda err, cb: self.refused.append((err, cb)),
                                       _isLeader=lambda: leading)

    def propose(self, blob: bytes, callback: Any) -> None:
        self.queue.put_nowait((_REGULAR + pysyncobj.pickle.dumps((0, (blob,))), callback))

    def appended(self) -> list[tuple[bytes, Any]]:
        out = []
        while True:
            try:
                command, callback = self.queue.get_nowait()
            except queue.Empty:
                return out
            out.append((pysyncobj.pickle.loads(command[1:])[1][0], callback))


def entry(version: int) -> bytes:
    return ops.encode(Op.CANCEL_JOB, {"now": 1, "job_id": "j"}, version)


def test_the_leader_refuses_an_entry_newer_than_the_cluster_writes_and_appends_the_rest() -> None:
    leader = Leader()
    vet_as_leader_appends(leader.replica, None, lambda: 0, lambda: 7)
    leader.propose(entry(8), "from-a-stale-follower")
    leader.propose(entry(7), "ok-1")
    leader.propose(entry(6), "ok-2")
    assert leader.appended() == [(entry(7), "ok-1"), (entry(6), "ok-2")]
    assert leader.refused == [(FAIL_REASON.REQUEST_DENIED, "from-a-stale-follower")]


def test_a_follower_forwards_whatever_version_it_is_given() -> None:
    follower = Leader(leading=False)
    vet_as_leader_appends(follower.replica, None, lambda: 0, lambda: 6)
    follower.propose(entry(8), "cb")
    assert follower.appended() == [(entry(8), "cb")] and follower.refused == []


def test_a_refused_entry_as_the_last_in_the_queue_leaves_it_empty() -> None:
    leader = Leader()
    vet_as_leader_appends(leader.replica, None, lambda: 0, lambda: 6)
    leader.propose(entry(7), "cb")
    with pytest.raises(queue.Empty):
        leader.queue.get_nowait()
    assert len(leader.refused) == 1


def test_header_reads_op_and_version_without_decoding() -> None:
    assert ops.header(entry(6)) == (Op.CANCEL_JOB, 6)
    for junk in (b"", b"\x93\x0e", b"\x92\x01\x06", b"\x93\xcc\x80\x06"):
        assert ops.header(junk) is None
