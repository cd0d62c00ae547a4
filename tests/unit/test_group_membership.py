"""A raft.Group changes its members online, on real pysyncobj nodes over loopback: a new
member catches up through a snapshot, a follower is removed and cannot disturb the group
afterwards, a leader refuses to remove itself, and a member restarted with stale
arguments takes its members from its log."""
from __future__ import annotations

import asyncio
import pathlib
import time

import pytest

from schedulerd.raft import group as group_mod
from schedulerd.raft.conf import RaftConfig
from schedulerd.raft.group import Group
from schedulerd.raft.proposals import ProposalFailed
from schedulerd.storage import queries
from tests.integration.harness import free_ports, wait_until
from tests.unit.test_group import FAST, create_blob, job_count, propose


@pytest.fixture(autouse=True)
def short_snapshot_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_mod, "SNAPSHOT_STAGGER_S", 0.2)


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def digest(group: Group) -> str:
    with group.store.read() as txn:
        return queries.state_digest(txn, group.store.tables)


def test_a_group_grows_loses_a_follower_and_restarts_with_the_members_its_log_has(
        tmp_path: pathlib.Path, loop: asyncio.AbstractEventLoop) -> None:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(4)]
    first = addrs[:3]

    def start(i: int) -> Group:
        # Every member starts from the first three (the fourth as a node joining them does);
        # compaction every 10 entries makes the newcomer catch up through a snapshot.
        cfg = RaftConfig(self_addr=addrs[i], peers=tuple(a for a in first if a != addrs[i]),
                         data_dir=str(tmp_path / f"n{i}"), compaction_entries_min=10,
                         compaction_journal_ratio=0, **FAST)
        return Group(0, cfg, on_fatal=pytest.fail, joining=addrs[i] not in first)

    groups = {i: start(i) for i in range(3)}
    try:
        wait_until(lambda: any(g.is_leader() for g in groups.values()), 15, "a leader")
        leader = next(g for g in groups.values() if g.is_leader())
        for i in range(30):
            propose(leader, loop, create_blob(f"j{i}"))
        wait_until(lambda: leader.status()["journal_entries"] < 30, 15, "the leader to compact its log")

        groups[3] = start(3)
        loop.run_until_complete(asyncio.wait_for(leader.change_members("add", addrs[3], loop), 10))
        assert leader.members() == sorted(addrs)
        wait_until(lambda: job_count(groups[3]) == 30, 20, "the new member to catch up")
        assert groups[3].members() == sorted(addrs)  # from the snapshot's members and the log after it

        with pytest.raises(ProposalFailed, match="a leader cannot remove itself"):
            loop.run_until_complete(asyncio.wait_for(leader.change_members("remove", leader.self_addr, loop), 10))
        gone = next(i for i in range(3) if groups[i] is not leader)
        loop.run_until_complete(asyncio.wait_for(leader.change_members("remove", addrs[gone], loop), 10))
        members = sorted(a for a in addrs if a != addrs[gone])
        assert leader.members() == members

        # The removed replica, still running, calls elections nobody answers: the leader holds.
        term = leader.status()["term"]
        time.sleep(3 * FAST["election_timeout_s_max"])  # what its elections take
        assert leader.is_leader() and leader.status()["term"] == term
        for i in range(30, 40):
            propose(leader, loop, create_blob(f"j{i}"))
        assert job_count(groups[gone]) == 30

        groups[3].destroy()
        groups[3] = start(3)  # its arguments still name the first three
        assert groups[3].members() == members
        live = [g for i, g in groups.items() if i != gone]
        wait_until(lambda: len({digest(g) for g in live}) == 1 and job_count(groups[3]) == 40, 20,
                   "the members to converge")
    finally:
        for g in groups.values():
            g.destroy()


def test_a_member_added_through_the_log_restarts_with_the_groups_members_not_alone(
        tmp_path: pathlib.Path, loop: asyncio.AbstractEventLoop) -> None:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(4)]
    first = addrs[:3]

    def start(i: int, peers: list[str] | None) -> Group:
        # A node that joined with --join names no peers: the placement gives a new replica its
        # members, and a restart starts it from its data dir alone (peers None), as node.py does.
        named = tuple(a for a in first if a != addrs[i]) if i < 3 else ()
        cfg = RaftConfig(self_addr=addrs[i], peers=named, data_dir=str(tmp_path / f"n{i}"), **FAST)
        return Group(0, cfg, on_fatal=pytest.fail, peers=peers, joining=i == 3)

    groups = {i: start(i, None) for i in range(3)}
    try:
        wait_until(lambda: any(g.is_leader() for g in groups.values()), 15, "a leader")
        leader = next(g for g in groups.values() if g.is_leader())
        for i in range(5):
            propose(leader, loop, create_blob(f"j{i}"))
        groups[3] = start(3, first)
        loop.run_until_complete(asyncio.wait_for(leader.change_members("add", addrs[3], loop), 10))
        wait_until(lambda: job_count(groups[3]) == 5, 20, "the new member to catch up through the log")
        assert groups[3].status()["journal_entries"] > 5  # the log, not a snapshot

        groups[3].destroy()
        groups[3] = start(3, None)
        assert groups[3].members() == sorted(addrs)
        time.sleep(3 * FAST["election_timeout_s_max"])  # a group of one would have elected itself by now
        assert not groups[3].is_leader() and leader.is_leader()
        propose(leader, loop, create_blob("j5"))
        wait_until(lambda: job_count(groups[3]) == 6, 20, "the restarted member to follow the leader")
    finally:
        for g in groups.values():
            g.destroy()
