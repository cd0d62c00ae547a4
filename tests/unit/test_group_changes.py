"""schedulerd/group_changes.py: a live member is taken out of a group only a grace period
after the change began (its in-flight lease grants must reach it first); a dead one at once."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from schedulerd import group_changes
from schedulerd.config import NodeConfig
from schedulerd.group_changes import GroupChanges
from schedulerd.raft.conf import RaftConfig

GRACE_S = 0.4


class FakeGroup:
    group_id = 3
    self_addr = "10.0.0.1:9083"

    def __init__(self) -> None:
        self.removed_at: float | None = None

    def members(self) -> list[str]:
        return [self.self_addr, "10.0.0.2:9083", "10.0.0.3:9083", "10.0.0.4:9083"]

    def change_members(self, kind: str, address: str, loop: asyncio.AbstractEventLoop) -> "asyncio.Future[Any]":
        assert (kind, address) == ("remove", "10.0.0.4:9083")
        self.removed_at = time.monotonic()
        fut = loop.create_future()
        fut.set_result(None)
        return fut


class FakeNode:
    def __init__(self) -> None:
        self.config = NodeConfig(raft=RaftConfig(self_addr="10.0.0.1:9080"))

    def now_us(self) -> int:
        return time.time_ns() // 1000


def _removal_delay_s(live: bool, began_s_ago: float) -> float:
    ended: list[dict[str, Any]] = []

    async def propose(command: dict[str, Any]) -> dict[str, Any]:
        ended.append(command)
        return {"ok": True}

    node, group = FakeNode(), FakeGroup()
    change = {"kind": "remove", "node_id": "n4", "reason": "balance",
              "started_us": node.now_us() - int(began_s_ago * 1e6)}
    t0 = time.monotonic()
    changes = GroupChanges(node, "n1", propose)  # type: ignore[arg-type]
    asyncio.run(changes._carry_out(group, "3", change, "10.0.0.4:9083", live))  # type: ignore[arg-type]
    assert ended and ended[0]["done"] and ended[0]["started_us"] == change["started_us"]
    assert group.removed_at is not None
    return group.removed_at - t0


def test_a_live_member_is_removed_a_grace_after_the_change_began_a_dead_one_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_changes, "REMOVE_GRACE_S", GRACE_S)
    assert GRACE_S - 0.15 <= _removal_delay_s(live=True, began_s_ago=0.1) < GRACE_S + 0.2
    assert _removal_delay_s(live=True, began_s_ago=GRACE_S + 1) < 0.1  # the grace has passed already
    assert _removal_delay_s(live=False, began_s_ago=0.0) < 0.1
