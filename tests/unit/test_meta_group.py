"""raft.MetaGroup on real pysyncobj nodes over loopback: commands commit on every
replica, a refused one changes nothing, an observer follows the log, proposes and is heard
from without a vote, is switched to a voter and added to the metadata group itself, and a
restarted replica rebuilds the registry from its journal."""
from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import pytest

from schedulerd.raft.conf import RaftConfig
from schedulerd.raft.meta_group import MetaGroup
from tests.integration.harness import free_ports, wait_until
from tests.unit.test_group import FAST
from tests.unit.test_meta import T0, bootstrap, nodes


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def run(loop: asyncio.AbstractEventLoop, fut: "asyncio.Future[Any]") -> Any:
    return loop.run_until_complete(asyncio.wait_for(fut, 10))


def test_the_registry_commits_everywhere_grows_a_member_and_survives_a_restart(
        tmp_path: pathlib.Path, loop: asyncio.AbstractEventLoop) -> None:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(4)]

    def start(i: int, voter: bool | None = None) -> MetaGroup:
        cfg = RaftConfig(self_addr=addrs[i], data_dir=str(tmp_path / f"n{i}"), **FAST)
        return MetaGroup(addrs[i], addrs[:3], cfg, on_fatal=pytest.fail, voter=voter)

    replicas = {i: start(i) for i in range(3)}
    try:
        assert all(r.voter for r in replicas.values())
        wait_until(lambda: any(r.is_leader() for r in replicas.values()), 15, "a leader")
        leader = next(r for r in replicas.values() if r.is_leader())
        for node in nodes(3):
            assert run(loop, leader.propose({"op": "register", **node, "now": T0}, loop))["ok"]
        result = run(loop, leader.propose(bootstrap(3), loop))
        assert result == {"ok": True, "epoch": 1}
        refused = run(loop, leader.propose({"op": "set_state", "node_id": "n0", "state": "bogus", "now": T0}, loop))
        assert refused["ok"] is False
        # An observer started once the log has entries catches up, proposes through the
        # leader, and the leader hears its answers.
        replicas[3] = start(3)
        assert not replicas[3].voter and replicas[3].members() == sorted(addrs[:3]) and replicas[3].listening()
        wait_until(lambda: replicas[3].view() == leader.view(), 10, "the observer to catch up")
        joined = {"op": "register", "node_id": "n3", "http": "h:1", "raft": addrs[3], "now": T0 + 1}
        assert run(loop, replicas[3].propose(joined, loop)) == {"ok": True, "joined": True}
        wait_until(lambda: all(r.view() == leader.view() for r in replicas.values()), 10, "replicas to agree")
        # Agreeing views can come a tick before the observer applies the leader's last commit.
        wait_until(replicas[3].is_current, 5, "the observer to count itself current")
        assert not replicas[3].is_leader()
        assert leader.silence_s([addrs[3]])[addrs[3]] < 1.0
        assert leader.members() == sorted(addrs[:3])

        replicas[3].destroy()
        wait_until(lambda: leader.silence_s([addrs[3]])[addrs[3]] > 0.5, 5, "the stopped observer to count as silent")
        replicas[3] = start(3, voter=True)
        run(loop, leader.change_members("add", addrs[3], loop))
        assert leader.members() == sorted(addrs)
        wait_until(lambda: replicas[3].view() == leader.view(), 10, "the new voter to replay the log")
        assert replicas[3].members() == sorted(addrs)

        follower = next(i for i, r in replicas.items() if r is not leader and i < 3)
        replicas[follower].destroy()
        replicas[follower] = start(follower)
        assert replicas[follower].members() == sorted(addrs) and replicas[follower].voter
        wait_until(lambda: replicas[follower].view() == leader.view(), 10, "the restarted member to replay")
        assert leader.view()["nodes"]["n3"]["raft"] == addrs[3]
    finally:
        for r in replicas.values():
            r.destroy()
