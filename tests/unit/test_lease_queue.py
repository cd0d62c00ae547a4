"""schedulerd/lease_queue.py: which polls ask to lease a ready run, and when. A poll
on a follower leaves a newly ready run to the leader's polls for FOLLOWER_DEFER_US; a poll
asks nothing of a queue at its limit, and carries the limits in its entry."""
from __future__ import annotations

import asyncio
import contextlib
import pathlib
from typing import Any, Iterator

import pytest

from schedulerd.config import NodeConfig
from schedulerd.errors import Unavailable
from schedulerd.lease_queue import FOLLOWER_DEFER_US, LeaseQueue
from schedulerd.raft.conf import RaftConfig
from schedulerd.storage import ops, queue_limits
from schedulerd.storage.ops import Op
from tests.unit.fsm_driver import S, T0, Driver

DEFER_S = FOLLOWER_DEFER_US / 1e6


class FakeClocks:
    def __init__(self) -> None:
        self.now_us = T0

    def cluster_now_us(self) -> int:
        return self.now_us


class FakeVersions:
    def __init__(self) -> None:
        self.version = ops.VERSION

    def writes(self) -> int:
        return self.version


class FakeGroup:
    group_id = 0

    def __init__(self, driver: Driver, leader: bool) -> None:
        self.store = driver.store
        self.clocks = FakeClocks()
        self.leader = leader
        self.versions = FakeVersions()

    def is_leader(self) -> bool:
        return self.leader


class FakeNode:
    """What LeaseQueue uses of a node: its config, clock, groups, reads and proposals (recorded)."""

    def __init__(self, group: FakeGroup) -> None:
        self.config = NodeConfig(raft=RaftConfig(self_addr="127.0.0.1:7000"))
        self.groups = [group]
        self.leaving: frozenset[int] = frozenset()
        self.proposed: list[dict[str, Any]] = []
        self.limits: dict[str, Any] = {}  # the metadata's queue limits

    def queue_limits(self) -> dict[str, Any]:
        return self.limits

    def now_us(self) -> int:
        return self.groups[0].clocks.now_us

    def local_group(self, group_id: int) -> FakeGroup | None:
        return next((g for g in self.groups if g.group_id == group_id), None)

    @contextlib.contextmanager
    def read(self, group: FakeGroup) -> Iterator[tuple[Any, Any]]:
        with group.store.read() as txn:
            yield txn, group.store.tables

    async def propose(self, group: FakeGroup, op: Op, payload: dict[str, Any]) -> dict[str, Any]:
        assert op == Op.LEASE_READY
        self.proposed.append(payload)
        return {"grants": [[worker, []] for worker, _, _ in payload["grants"]]}


@pytest.fixture
def ready_run(tmp_path: pathlib.Path) -> Driver:
    """A store holding one run of queue q, available at T0."""
    d = Driver(str(tmp_path / "store"))
    d.create("j1", {"kind": "at", "at_us": T0}, now=T0 - 5 * S)
    assert d.claim_due(T0) and d.ready(T0) and not d.ready(T0 - 1)
    return d


def _asks(driver: Driver, leader: bool, now_us: int, leaving: frozenset[int] = frozenset()) -> bool:
    group = FakeGroup(driver, leader)
    group.clocks.now_us = now_us
    node = FakeNode(group)
    node.leaving = leaving
    asyncio.run(LeaseQueue(node)._lease_once("w1", ["q"], 10))  # type: ignore[arg-type]
    return bool(node.proposed)


def test_no_lease_is_asked_from_a_group_the_node_is_about_to_leave(ready_run: Driver) -> None:
    # A grant committed as the replica goes would reach no worker: its runs would wait out the lease.
    assert _asks(ready_run, leader=True, now_us=T0)
    assert not _asks(ready_run, leader=True, now_us=T0, leaving=frozenset({FakeGroup.group_id}))


def test_the_leader_asks_for_a_run_as_soon_as_it_is_ready(ready_run: Driver) -> None:
    assert not _asks(ready_run, leader=True, now_us=T0 - 1)
    assert _asks(ready_run, leader=True, now_us=T0)


def test_a_follower_asks_for_a_run_once_it_has_been_ready_the_defer(ready_run: Driver) -> None:
    defer_us = int(DEFER_S * S)
    assert not _asks(ready_run, leader=False, now_us=T0)
    assert not _asks(ready_run, leader=False, now_us=T0 + defer_us - 1)
    assert _asks(ready_run, leader=False, now_us=T0 + defer_us)


def test_a_follower_poll_wakes_when_its_defer_ends(ready_run: Driver) -> None:
    for leader, wakes_in_s in ((True, 0.0), (False, DEFER_S)):
        group = FakeGroup(ready_run, leader)
        queue = LeaseQueue(FakeNode(group))  # type: ignore[arg-type]
        assert queue._until_next_ready(["q"]) == pytest.approx(wakes_in_s + 0.001)


class TwoGroupNode(FakeNode):
    """Group 0 grants through its store; group 1 has no leader to commit anything."""

    def __init__(self, granting: FakeGroup, failing: FakeGroup, driver: Driver) -> None:
        super().__init__(granting)
        self.groups = [granting, failing]
        self.driver = driver

    async def propose(self, group: FakeGroup, op: Op, payload: dict[str, Any]) -> dict[str, Any]:
        if group.group_id == 1:
            raise Unavailable("LEASE_READY not committed: no leader")
        return self.driver.apply(op, **payload)


def test_runs_granted_by_one_group_are_delivered_when_another_group_fails(ready_run: Driver,
                                                                          tmp_path: pathlib.Path) -> None:
    """A grant committed and then lost with the poll's 503 would keep its runs from every
    worker until the lease ran out (a 30 s tail of lateness while leaders moved)."""
    other = Driver(str(tmp_path / "other"), group=1)
    other.create("j2", {"kind": "at", "at_us": T0}, now=T0 - 5 * S)
    assert other.claim_due(T0)
    granting, failing = FakeGroup(ready_run, leader=True), FakeGroup(other, leader=True)
    failing.group_id = 1
    node = TwoGroupNode(granting, failing, ready_run)
    tasks = asyncio.run(LeaseQueue(node)._lease_once("w1", ["q"], 10))  # type: ignore[arg-type]
    assert [view["job_id"] for view, _payload in tasks] == ["j1"]

    node.groups = [failing]
    with pytest.raises(Unavailable, match="no leader"):
        asyncio.run(LeaseQueue(node)._lease_once("w1", ["q"], 10))  # type: ignore[arg-type]


def _limit(max_running: int | None, max_starts_per_s: float | None, revision: int = 1) -> dict[str, Any]:
    return {"max_running": max_running, "max_starts_per_s": max_starts_per_s, "revision": revision, "updated_us": T0}


def test_a_lease_entry_carries_the_limits_of_the_queues_its_polls_name(ready_run: Driver) -> None:
    group = FakeGroup(ready_run, leader=True)
    node = FakeNode(group)
    node.limits = {"q": _limit(4, 2.0), "unasked": _limit(1, None)}
    asyncio.run(LeaseQueue(node)._lease_once("w1", ["q"], 10))  # type: ignore[arg-type]
    assert node.proposed[0]["limits"] == {"q": [1, 4, 2 * queue_limits.TOKEN]}  # one group: the whole limit

    group.versions.version = ops.QUEUE_LIMITS_SINCE - 1  # a voter of an older build: it would not heed them
    asyncio.run(LeaseQueue(node)._lease_once("w1", ["q"], 10))  # type: ignore[arg-type]
    assert "limits" not in node.proposed[1]


def test_a_queue_at_its_limit_is_not_asked_for_and_its_poll_waits_for_the_next_token(ready_run: Driver) -> None:
    """Asking would commit entries that lease nothing, as fast as they commit."""
    for job_id in ("j2", "j3"):
        ready_run.create(job_id, {"kind": "at", "at_us": T0}, now=T0 - 5 * S)
    ready_run.claim_due(T0)
    leased = ready_run.apply(Op.LEASE_READY, now=T0, lease_until=T0 + 30 * S, grants=[["w", ["q"], 3]],
                             limits={"q": [1, None, 2 * queue_limits.TOKEN]})  # a 2-token bucket, both spent
    assert len(leased["grants"][0][1]) == 2 and ready_run.ready(T0)
    group = FakeGroup(ready_run, leader=True)
    node = FakeNode(group)
    node.limits = {"q": _limit(None, 2.0)}
    asyncio.run(LeaseQueue(node)._lease_once("w1", ["q"], 10))  # type: ignore[arg-type]
    assert node.proposed == []
    assert LeaseQueue(node)._until_next_ready(["q"]) == pytest.approx(0.501)  # type: ignore[arg-type]
    group.clocks.now_us = T0 + S // 2
    asyncio.run(LeaseQueue(node)._lease_once("w1", ["q"], 10))  # type: ignore[arg-type]
    assert len(node.proposed) == 1
