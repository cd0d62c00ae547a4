"""raft.Group against real pysyncobj nodes on loopback: restart replays without
double-applying, an apply failure never escapes into pysyncobj, compaction
writes LMDB snapshots, and a wiped node catches up from one."""
from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import shutil
import time
from typing import Any

import pysyncobj.pickle
import pytest
from pysyncobj.serializer import Serializer

from schedulerd.raft import journal as journal_mod
from schedulerd.raft import compaction
from schedulerd.raft import snapshot as snapshot_mod
from schedulerd.raft import bootmark
from schedulerd.raft import group as group_mod
from schedulerd.raft import pysyncobj_patches
from schedulerd.raft.conf import RaftConfig
from schedulerd.raft.group import DataDirDamaged, Group
from schedulerd.raft.proposals import ProposalFailed
from schedulerd.raft.pysyncobj_patches import PICKLE_PROTOCOL
from schedulerd.storage import ops, queries
from schedulerd.storage.ops import Op
from tests.integration.harness import free_ports, wait_until
from tests.unit.fsm_driver import S, T0

FAST = dict(election_timeout_s_min=0.3, election_timeout_s_max=0.6, leader_fallback_s=1.0,
            append_entries_period_s=0.05)


@pytest.fixture(autouse=True)
def short_snapshot_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Snapshot slots of 0.2 s instead of 10, so a test's copies come in time."""
    monkeypatch.setattr(group_mod, "SNAPSHOT_STAGGER_S", 0.2)


def create_blob(job_id: str) -> bytes:
    """At the floor: a leader that has not yet heard every voter writes no newer entry."""
    return ops.encode(Op.CREATE_JOBS, {"now": T0, "jobs": [{
        "job_id": job_id, "schedule": {"kind": "at", "at_us": T0 + 3600 * S}, "schedule_spec": {},
        "queue": "q", "payload_json": "{}", "max_attempts": 1, "priority": 0}]}, ops.VERSION_FLOOR)


class Recorder:
    def __init__(self) -> None:
        self.applied: list[tuple[int, Op]] = []
        self.fatal: list[str] = []

    def on_applied(self, group: int, index: int, op: Op, result: dict[str, Any]) -> None:
        self.applied.append((group, op))

    def on_fatal(self, message: str) -> None:
        self.fatal.append(message)


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def propose(group: Group, loop: asyncio.AbstractEventLoop, blob: bytes, timeout_s: float = 10) -> Any:
    return loop.run_until_complete(asyncio.wait_for(group.propose(blob, loop), timeout_s))


def wait_leader(group: Group) -> None:
    wait_until(lambda: group.status()["leader"] is not None and group.status()["ready"], 10, "a leader")


def job_count(group: Group) -> int:
    with group.store.read() as txn:
        return queries.counts(txn, group.store.tables)["jobs"]


def single(tmp_path: pathlib.Path, rec: Recorder, port: int, **conf: Any) -> Group:
    cfg = RaftConfig(self_addr=f"127.0.0.1:{port}", data_dir=str(tmp_path), **{**FAST, **conf})
    cfg.validate()
    group = Group(0, cfg, on_applied=rec.on_applied, on_fatal=rec.on_fatal)
    wait_leader(group)
    return group


def three_groups(tmp_path: pathlib.Path) -> list[Group]:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    return [Group(0, RaftConfig(self_addr=addrs[i], peers=tuple(a for j, a in enumerate(addrs) if j != i),
                                data_dir=str(tmp_path / f"n{i}"), **FAST), on_fatal=pytest.fail)
            for i in range(3)]


def test_restart_replays_the_journal_without_applying_twice(tmp_path: pathlib.Path, loop) -> None:
    (port,) = free_ports(1)
    rec = Recorder()
    group = single(tmp_path, rec, port)
    for i in range(20):
        assert propose(group, loop, create_blob(f"j{i}"))["results"][0]["ok"]
    applied_before = group.store.last_applied()
    group.destroy()

    rec2 = Recorder()
    group = single(tmp_path, rec2, port)
    try:
        wait_until(lambda: group.status()["last_applied"] >= applied_before, 10, "journal replay")
        assert rec2.applied == [], "replayed entries must not be applied again"
        assert job_count(group) == 20
        assert group.store.last_applied() == applied_before
        assert propose(group, loop, create_blob("after-restart"))["results"][0]["ok"]
        assert rec2.applied == [(0, Op.CREATE_JOBS)]
    finally:
        group.destroy()


def test_a_replica_stopped_and_started_again_leaves_no_file_descriptor_behind(tmp_path: pathlib.Path,
                                                                             loop) -> None:
    """As a placement that moves replicas away and back does, over a year of a node's life."""
    (port,) = free_ports(1)

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    group = single(tmp_path, Recorder(), port)
    assert propose(group, loop, create_blob("j"))["results"][0]["ok"]
    group.destroy()
    before = open_fds()
    for _ in range(5):
        group = single(tmp_path, Recorder(), port)
        wait_until(lambda: group.status()["last_applied"] >= 1, 10, "journal replay")
        group.destroy()
    assert open_fds() == before
    with pytest.raises(ProposalFailed, match="is stopped: its replica left this node"):
        propose(group, loop, create_blob("late"))


def test_a_failing_apply_never_escapes_into_pysyncobj(tmp_path: pathlib.Path, loop) -> None:
    (port,) = free_ports(1)
    rec = Recorder()
    group = single(tmp_path, rec, port)
    try:
        result = propose(group, loop, b"\xc1 not msgpack")
        assert "fatal" in result and len(rec.fatal) == 1 and "undecodable" in rec.fatal[0]
        # The tick thread is alive: the next entry still commits, but a stopped store applies
        # nothing more (it would diverge without the entry it could not apply).
        assert "fatal" in propose(group, loop, create_blob("still-alive"))
        assert job_count(group) == 0
    finally:
        group.destroy()


def test_compaction_writes_an_lmdb_snapshot_and_restart_uses_it(tmp_path: pathlib.Path, loop) -> None:
    (port,) = free_ports(1)
    rec = Recorder()
    group = single(tmp_path, rec, port, compaction_entries_min=10, compaction_journal_ratio=0)
    snapshot = tmp_path / "group-0.snapshot"
    try:
        for i in range(60):
            propose(group, loop, create_blob(f"j{i}"))
        wait_until(snapshot.exists, 10, "a snapshot file")
        wait_until(lambda: group.status()["journal_entries"] < 60, 10, "the journal to be compacted")
        assert snapshot.read_bytes().startswith(b"SCHEDSNAP2") and b"SNAPEND1" in snapshot.read_bytes()[-20:]
        first = snapshot.stat().st_ino
        for i in range(60, 120):  # the next one is written beside the tick thread
            propose(group, loop, create_blob(f"j{i}"))
        wait_until(lambda: snapshot.stat().st_ino != first, 10, "a second snapshot")
    finally:
        group.destroy()
    group = single(tmp_path, Recorder(), port, compaction_entries_min=10, compaction_journal_ratio=0)
    try:
        assert job_count(group) == 120
    finally:
        group.destroy()


def test_a_restart_between_a_snapshot_and_its_compaction_keeps_the_journal(tmp_path: pathlib.Path, loop,
                                                                          monkeypatch) -> None:
    """The node stops after a new snapshot is in place but before its journal dropped
    what the snapshot covers (kill -9 in between). pysyncobj clears a journal whose head
    does not match the snapshot: every entry after it, acknowledged, would be gone from
    this node's log. The journal loads from the entry the snapshot needs instead."""
    (port,) = free_ports(1)
    monkeypatch.setattr(journal_mod.DurableJournal, "deleteEntriesTo", lambda self, entry_to: None)
    group = single(tmp_path, Recorder(), port, compaction_entries_min=10, compaction_journal_ratio=0)
    snapshot_path = tmp_path / "group-0.snapshot"
    try:
        for i in range(15):
            propose(group, loop, create_blob(f"j{i}"))
        wait_until(snapshot_path.exists, 10, "a snapshot file")
        monkeypatch.setattr(compaction, "due", lambda *args: False)  # that snapshot stays the last
        for i in range(15, 40):
            propose(group, loop, create_blob(f"j{i}"))
        last = group.journal[-1][1]
    finally:
        group.destroy()
    monkeypatch.undo()
    needed = snapshot_mod.first_needed_index(str(snapshot_path))
    assert 1 < needed < last - 20, "the snapshot covers part of the journal, not all of it"
    group = single(tmp_path, Recorder(), port, compaction_entries_min=10_000, compaction_journal_ratio=0)
    try:
        assert group.journal[0][1] == needed and group.journal[-1][1] >= last
        assert job_count(group) == 40
    finally:
        group.destroy()


def test_after_a_machine_crash_the_store_is_rebuilt_from_snapshot_and_journal(
        tmp_path: pathlib.Path, loop, monkeypatch) -> None:
    monkeypatch.setattr(bootmark, "current_boot", lambda: "boot-a")
    (port,) = free_ports(1)
    group = single(tmp_path, Recorder(), port, compaction_entries_min=10, compaction_journal_ratio=0)
    for i in range(60):
        propose(group, loop, create_blob(f"j{i}"))
    wait_until((tmp_path / "group-0.snapshot").exists, 10, "a snapshot file")
    wait_until(lambda: group.status()["journal_entries"] < 60, 10, "the journal to be compacted")
    for i in range(60, 75):  # only in the journal
        propose(group, loop, create_blob(f"j{i}"))
    applied = group.store.last_applied()
    group.replica.destroy_synchronous()
    group.store.abort_applied()
    group.store.env.close()  # no sync, no clean mark: then the machine goes down
    (tmp_path / "group-0.lmdb" / "data.mdb").write_bytes(b"torn" * 4096)

    monkeypatch.setattr(bootmark, "current_boot", lambda: "boot-b")
    group = single(tmp_path, Recorder(), port, compaction_entries_min=10, compaction_journal_ratio=0)
    try:
        wait_until(lambda: group.store.last_applied() >= applied, 10, "the rebuild")
        assert job_count(group) == 75
    finally:
        group.destroy()


def test_a_replica_whose_snapshot_was_lost_refuses_to_start(tmp_path: pathlib.Path, loop, monkeypatch) -> None:
    """The store is gone (a machine crash) and so is the snapshot the compacted journal
    continues from: started, the replica would never apply again yet could lead."""
    monkeypatch.setattr(bootmark, "current_boot", lambda: "boot-a")
    (port,) = free_ports(1)
    group = single(tmp_path, Recorder(), port, compaction_entries_min=10, compaction_journal_ratio=0)
    for i in range(60):
        propose(group, loop, create_blob(f"j{i}"))
    wait_until(lambda: group.status()["journal_entries"] < 60, 10, "the journal to be compacted")
    first = group.journal[0][1]
    group.destroy()
    (tmp_path / "group-0.snapshot").unlink()
    monkeypatch.setattr(bootmark, "current_boot", lambda: "boot-b")
    (tmp_path / "group-0.lmdb" / bootmark.MARKER).write_text("boot-a dirty\n")  # torn by the reboot: discarded
    with pytest.raises(DataDirDamaged, match=f"journal starts at entry {first}, its store has applied 0"):
        single(tmp_path, Recorder(), port, compaction_entries_min=10, compaction_journal_ratio=0)


@pytest.mark.parametrize("piece_delay_s, chunk, pad", [(0.0, 16 << 10, 4000), (0.1, 1024, 0)])
def test_a_wiped_node_catches_up_from_a_snapshot(tmp_path: pathlib.Path, loop, monkeypatch,
                                                 piece_delay_s: float, chunk: int, pad: int) -> None:
    """With piece_delay_s the follower takes each piece slowly (a slow disk): the whole
    transfer outlasts pysyncobj's connectionTimeout, so it completes only if the
    follower's answers keep the leader from dropping the connection. Pieces (and socket
    buffers) of 1 KiB move about one per delayed ACK: the fast case takes bigger ones,
    and with them the slow case gives its proposals time (its one live follower may fall
    behind the log's compaction and need a snapshot at that pace itself)."""
    ports = free_ports(3)
    addrs = [f"127.0.0.1:{p}" for p in ports]

    def start(i: int) -> Group:
        # Small pieces: the snapshot goes over in many messages, as a large one does.
        cfg = RaftConfig(self_addr=addrs[i], peers=tuple(a for j, a in enumerate(addrs) if j != i),
                         data_dir=str(tmp_path / f"n{i}"), compaction_entries_min=10,
                         compaction_journal_ratio=0, snapshot_chunk_bytes=chunk, **FAST)
        return Group(0, cfg, on_fatal=pytest.fail)

    groups = [start(i) for i in range(3)]
    try:
        wait_until(lambda: any(g.is_leader() for g in groups), 15, "a leader")
        leader = next(g for g in groups if g.is_leader())
        propose_s = 10 if chunk > 1024 else 60
        for i in range(80):
            propose(leader, loop, big_create_blob(f"j{i}", pad), propose_s)
        # The follower furthest behind is wiped: the other, caught up, keeps the next
        # proposals committing. Were it the one left, a leader compacting every 10 entries
        # would send it a snapshot per proposal, in 1 KiB pieces: ~50 s each (seen in CI).
        victim_index = min((i for i, g in enumerate(groups) if g is not leader),
                           key=lambda i: groups[i].store.last_applied())
        groups[victim_index].destroy()
        shutil.rmtree(tmp_path / f"n{victim_index}")
        for i in range(80, 120):
            propose(leader, loop, big_create_blob(f"j{i}", pad), propose_s)
        wait_until(lambda: os.path.exists(tmp_path / f"n{victim_index}") is False and
                   leader.status()["journal_entries"] < 100, 15, "the leader to compact its log")
        take_piece = Serializer.setTransmissionData

        def slow_take(self: Serializer, data: Any) -> bool:
            time.sleep(piece_delay_s)
            return take_piece(self, data)

        monkeypatch.setattr(Serializer, "setTransmissionData", slow_take)
        started = time.monotonic()
        groups[victim_index] = start(victim_index)
        wiped = groups[victim_index]
        wait_until(lambda: job_count(wiped) == 120, 60, "the wiped node to catch up")
        assert wiped.store.last_applied() == leader.store.last_applied()
        received = tmp_path / f"n{victim_index}" / "group-0.snapshot"
        assert received.exists() and received.stat().st_size > 10 * chunk, "a many-piece transfer"
        if piece_delay_s:
            timeout_s = leader.replica._getConf().connectionTimeout
            assert time.monotonic() - started > timeout_s, "the transfer must outlast connectionTimeout"
    finally:
        for g in groups:
            g.destroy()


def big_create_blob(job_id: str, pad: int = 4000) -> bytes:
    return ops.encode(Op.CREATE_JOBS, {"now": T0, "jobs": [{
        "job_id": job_id, "schedule": {"kind": "at", "at_us": T0 + 3600 * S}, "schedule_spec": {},
        "queue": "q", "payload_json": '"' + "x" * pad + '"', "max_attempts": 1,
        "priority": 0}]}, ops.VERSION_FLOOR)


def test_entries_of_any_size_up_to_entry_bytes_max_reach_every_follower(tmp_path: pathlib.Path, loop,
                                                                        caplog) -> None:
    """Regression (scale bench: ~1,880 UnpicklingErrors per follower): pysyncobj 0.3.17
    sends an entry over appendEntriesBatchSizeBytes in pieces and marks the last piece
    by the command's length, not the pickled entry's. An entry just under a multiple of
    the piece size was unpickled cut short: an exception out of that follower's tick."""
    groups = three_groups(tmp_path)
    try:
        wait_until(lambda: any(g.is_leader() for g in groups), 15, "a leader")
        leader = next(g for g in groups if g.is_leader())
        sizes = [(4 << 16) - delta for delta in range(0, 400, 8)] + [1 << 20, leader.conf.entry_bytes_max]
        for n, size in enumerate(sizes):
            propose(leader, loop, sized_create_blob(f"big-{n}", size))
        for g in groups:
            wait_until(lambda: job_count(g) == len(sizes), 20, f"{g.self_addr} to apply every entry")
        assert not [r for r in caplog.records if r.name.startswith("pysyncobj") and r.levelno >= logging.ERROR]
        with pytest.raises(ProposalFailed, match="entry_bytes_max"):
            propose(leader, loop, sized_create_blob("too-big", leader.conf.entry_bytes_max + 1))
    finally:
        for g in groups:
            g.destroy()


def sized_create_blob(job_id: str, size: int) -> bytes:
    """A create entry of exactly `size` bytes."""
    pad = size - len(big_create_blob(job_id, 0))
    blob = big_create_blob(job_id, pad)
    blob = big_create_blob(job_id, pad - (len(blob) - size))  # the string header grew with it
    assert len(blob) == size
    return blob


def test_a_cut_off_leader_with_uncommitted_entries_catches_up_after_heal(tmp_path: pathlib.Path, loop) -> None:
    """Regression (found by jepsen-style, seeds 3 and 11): a former leader holding
    uncommitted entries, more than one append batch behind the new leader,
    must replace its stale suffix and converge instead of livelocking. The new
    leader has compacted meanwhile (its first snapshot, after 1 MiB of journal),
    so the former one is sent a snapshot: it must not commit its stale entries on
    the snapshot's messages (pysyncobj_patches.commit_only_what_matched)."""
    ports = free_ports(3)
    addrs = [f"127.0.0.1:{p}" for p in ports]
    cut: set[tuple[str, str]] = set()

    def start(i: int) -> Group:
        cfg = RaftConfig(self_addr=addrs[i], peers=tuple(a for j, a in enumerate(addrs) if j != i),
                         data_dir=str(tmp_path / f"n{i}"), **FAST)
        group = Group(0, cfg, on_fatal=pytest.fail)
        transport = pysyncobj_patches.transport(group.replica)
        send = transport.send

        def partitioned_send(node: Any, message: Any) -> Any:
            if (addrs[i], node.address) in cut:
                return None
            return send(node, message)
        transport.send = partitioned_send
        return group

    groups = [start(i) for i in range(3)]
    try:
        wait_until(lambda: any(g.is_leader() for g in groups), 15, "a leader")
        old = next(g for g in groups if g.is_leader())
        propose(old, loop, create_blob("before"))
        others = [g for g in groups if g is not old]
        for g in others:
            cut.update({(old.self_addr, g.self_addr), (g.self_addr, old.self_addr)})
        for i in range(10):  # appended by the cut-off leader, never committed
            old.replica.apply_entry(create_blob(f"stale-{i}"), callback=lambda result, error: None)
        wait_until(lambda: any(g.is_leader() for g in others), 15, "a new leader on the majority side")
        new = next(g for g in others if g.is_leader())
        for i in range(40):  # ~5 MiB: more than one append batch (entry_bytes_max) ahead
            propose(new, loop, big_create_blob(f"new-{i}", 128 << 10))
        # What the old leader lacks (from its commit index on) is no longer in the new one's log.
        assert new.journal[0][1] > old.replica.raftCommitIndex + 1, "the new leader has compacted"
        cut.clear()
        wait_until(lambda: old.store.last_applied() == new.store.last_applied(), 20,
                   "the former leader to converge")
        assert job_count(old) == job_count(new) == 41
    finally:
        for g in groups:
            g.destroy()


def test_each_replica_copies_its_snapshot_in_its_own_slot_followers_first(tmp_path: pathlib.Path) -> None:
    groups = three_groups(tmp_path)
    try:
        wait_until(lambda: all(g.status()["leader"] is not None for g in groups), 15, "a leader everyone knows")
        leader = next(g for g in groups if g.is_leader())
        followers = sorted((g for g in groups if g is not leader), key=lambda g: g.self_addr)
        stagger = group_mod.SNAPSHOT_STAGGER_S
        period_start = 1_000 * 3 * stagger
        assert [g._snapshot_delay_s(period_start) for g in (*followers, leader)] == \
            pytest.approx([0.0, stagger, 2 * stagger])
        # Compacting later changes nobody's slot: the slots stay where the clock puts them.
        later = period_start + 1.5 * stagger
        assert [g._snapshot_delay_s(later) for g in (*followers, leader)] == \
            pytest.approx([1.5 * stagger, 2.5 * stagger, 0.5 * stagger])
    finally:
        for g in groups:
            g.destroy()


def test_request_step_down_hands_leadership_to_a_follower(tmp_path: pathlib.Path, loop) -> None:
    groups = three_groups(tmp_path)
    try:
        wait_until(lambda: any(g.is_leader() for g in groups), 15, "a leader")
        old = next(g for g in groups if g.is_leader())
        propose(old, loop, create_blob("x"))
        old.request_step_down()
        wait_until(lambda: any(g.is_leader() for g in groups if g is not old) and not old.is_leader(), 10,
                   "another node to lead")
    finally:
        for g in groups:
            g.destroy()


def test_after_the_first_snapshot_a_few_entries_do_not_copy_the_store_again(tmp_path: pathlib.Path, loop) -> None:
    """compaction_entries_min alone would snapshot every 10 entries here; the journal must
    first weigh compaction_journal_ratio x the snapshot (raft/compaction.py)."""
    (port,) = free_ports(1)
    group = single(tmp_path, Recorder(), port, compaction_entries_min=10, compaction_journal_ratio=1.0)
    snapshot = tmp_path / "group-0.snapshot"
    try:
        for i in range(30):
            propose(group, loop, create_blob(f"j{i}"))
        wait_until(snapshot.exists, 10, "the first snapshot (no previous one to weigh against)")
        first = snapshot.stat()
        for i in range(30, 90):
            propose(group, loop, create_blob(f"j{i}"))
        status = group.status()
        assert status["journal_entries"] > 10 and group.journal.size_bytes() < first.st_size
        time.sleep(0.5)  # ticks that would compact under the entries rule alone
        assert snapshot.stat().st_ino == first.st_ino and group.status()["journal_entries"] >= status["journal_entries"]
    finally:
        group.destroy()


def test_followers_apply_an_entry_while_the_leader_still_applies_it(tmp_path: pathlib.Path, loop) -> None:
    """The leader tells its followers an entry is committed before applying it itself:
    pysyncobj sends the new commit index after the leader's apply, which put every
    follower's apply (and each answer a follower serves) behind the leader's."""
    groups = three_groups(tmp_path)
    try:
        wait_until(lambda: any(g.is_leader() for g in groups), 15, "a leader")
        leader = next(g for g in groups if g.is_leader())
        followers = [g for g in groups if g is not leader]
        applying = leader._apply
        leader_done: list[float] = []

        def slow_apply(index: int, blob: bytes) -> Any:
            time.sleep(0.25)  # under the election timeout: the leader stays the leader
            result = applying(index, blob)
            leader_done.append(time.monotonic())
            return result

        leader._apply = slow_apply  # type: ignore[method-assign]
        fut = leader.propose(create_blob("slow"), loop)
        wait_until(lambda: any(job_count(g) == 1 for g in followers), 5, "a follower to apply the entry")
        follower_done = time.monotonic()
        loop.run_until_complete(asyncio.wait_for(fut, 10))
        assert leader_done and follower_done < leader_done[0]
    finally:
        for g in groups:
            g.destroy()


def test_a_restarted_follower_is_reached_before_it_would_call_an_election(tmp_path: pathlib.Path, loop) -> None:
    """The node with the greater address opens a connection. With the leader above the
    restarted node and a third node below it, the restarted node reaches only the third
    node until the leader connects: at pysyncobj's 5 s retry it campaigned meanwhile,
    and the higher terms it spread unseated the leader."""
    addrs = sorted(f"127.0.0.1:{p}" for p in free_ports(3))

    def start(i: int) -> Group:
        return Group(0, RaftConfig(self_addr=addrs[i], peers=tuple(a for j, a in enumerate(addrs) if j != i),
                                   data_dir=str(tmp_path / f"n{i}"), **FAST), on_fatal=pytest.fail)

    groups = [start(i) for i in range(3)]
    try:
        for _ in range(10):  # the highest address should lead
            wait_until(lambda: any(g.is_leader() for g in groups), 15, "a leader")
            if groups[2].is_leader():
                break
            next(g for g in groups if g.is_leader()).request_step_down()
            wait_until(lambda: not any(g.is_leader() for g in groups) or groups[2].is_leader(), 5, "a step down")
        leader = groups[2]
        assert leader.is_leader()
        propose(leader, loop, create_blob("before"))
        term = leader.status()["term"]
        groups[1].destroy()
        groups[1] = start(1)
        propose(leader, loop, create_blob("after"))
        wait_until(lambda: groups[1].store.last_applied() == leader.store.last_applied(), 10,
                   "the restarted node to catch up")
        time.sleep(3 * FAST["election_timeout_s_max"])  # what an election would have taken by now
        assert leader.is_leader() and leader.status()["term"] == term
    finally:
        for g in groups:
            g.destroy()


def test_pipelined_appends_are_not_sent_twice(tmp_path: pathlib.Path, loop, caplog) -> None:
    """Many entries in flight at once: the leader sends each as it appends it, and the
    followers' acks arrive while later ones travel. An ack must not move the leader back
    to resend those (the followers then truncated and re-added entries they had applied)."""
    groups = three_groups(tmp_path)
    try:
        wait_until(lambda: any(g.is_leader() for g in groups), 15, "a leader")
        leader = next(g for g in groups if g.is_leader())
        futures = [leader.propose(create_blob(f"p{i}"), loop) for i in range(1000)]
        loop.run_until_complete(asyncio.wait_for(asyncio.gather(*futures), 30))
        for g in groups:
            wait_until(lambda: job_count(g) == 1000, 20, f"{g.self_addr} to apply every entry")
        assert not [r.getMessage() for r in caplog.records
                    if r.name.startswith("pysyncobj") and "truncating" in r.getMessage()]
    finally:
        for g in groups:
            g.destroy()


def test_raft_pickles_at_protocol_5_and_replays_a_journal_written_at_protocol_2(tmp_path: pathlib.Path, loop,
                                                                               monkeypatch) -> None:
    """Commands and messages are pickled at protocol 5 (raft/group.py). A journal an older
    build wrote, its commands pickled at pysyncobj's protocol 2, still replays."""
    assert pysyncobj.pickle.dumps((1, (b"entry",)))[:2] == b"\x80\x05"
    (port,) = free_ports(1)
    monkeypatch.setattr(pysyncobj.pickle, "__protocol", 2)
    assert pysyncobj.pickle.dumps((1, (b"entry",)))[:2] == b"\x80\x02", "the old build's commands"
    group = single(tmp_path, Recorder(), port)
    for i in range(5):
        assert propose(group, loop, create_blob(f"old{i}"))["results"][0]["ok"]
    group.destroy()
    monkeypatch.setattr(pysyncobj.pickle, "__protocol", PICKLE_PROTOCOL)
    shutil.rmtree(tmp_path / "group-0.lmdb")  # the store is rebuilt from the journal alone
    group = single(tmp_path, Recorder(), port)
    try:
        wait_until(lambda: job_count(group) == 5, 10, "the old journal to replay")
        assert propose(group, loop, create_blob("new"))["results"][0]["ok"]
        assert job_count(group) == 6
    finally:
        group.destroy()


def test_a_proposal_pending_when_the_replica_stops_fails_at_once(tmp_path: pathlib.Path, loop) -> None:
    """A node that drops its replica (the placement moved it) must not leave a caller waiting
    out the propose timeout: a poll waiting on a grant held its worker's slots for 5 s."""
    groups = three_groups(tmp_path)
    try:
        wait_until(lambda: any(g.is_leader() for g in groups), 15, "a leader")
        leader = next(g for g in groups if g.is_leader())
        for g in groups:
            if g is not leader:
                g.destroy()
        fut = leader.propose(create_blob("j-pending"), loop)  # appended, never committed: no quorum
        loop.run_until_complete(asyncio.sleep(0.3))
        assert not fut.done()
        leader.destroy()
        with pytest.raises(ProposalFailed, match="stopped before it applied") as failed:
            loop.run_until_complete(asyncio.wait_for(fut, 2))
        assert failed.value.maybe_applied
    finally:
        for g in groups:
            g.destroy()
