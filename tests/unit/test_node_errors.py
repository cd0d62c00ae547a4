"""What a caller reads when its command cannot be committed: the command in its words,
the group, and why, never an internal op name."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from pysyncobj import FAIL_REASON

from schedulerd.errors import OutcomeUnknown, Unavailable
from schedulerd.node import Node
from schedulerd.raft import proposals
from schedulerd.storage import ops
from schedulerd.storage.ops import Op


def _node_whose_group_fails_with(error: int) -> tuple[Node, Any]:
    node = object.__new__(Node)

    def propose(blob: bytes, loop: asyncio.AbstractEventLoop) -> "asyncio.Future[Any]":
        fut, done = proposals.callback(loop)
        done(None, error)
        return fut

    node.config = SimpleNamespace(propose_timeout_s=5.0)
    node.disk = SimpleNamespace(check=lambda: None)
    node.now_us = lambda: 0
    group = SimpleNamespace(group_id=2, propose=propose, versions=SimpleNamespace(writes=lambda: 12))
    return node, group


def _propose(error: int) -> Exception:
    node, group = _node_whose_group_fails_with(error)

    async def go() -> None:
        node.loop = asyncio.get_running_loop()
        await node.propose(group, Op.CREATE_JOBS, {"jobs": []})

    with pytest.raises(Exception) as caught:
        asyncio.run(go())
    return caught.value


def test_a_group_without_a_leader_says_the_create_was_not_saved_and_why() -> None:
    error = _propose(FAIL_REASON.MISSING_LEADER)
    assert isinstance(error, Unavailable)
    assert str(error) == ("the create was not saved: group 2 has no leader: fewer than a quorum of its nodes are "
                          "up and in reach of each other")


def test_a_leader_change_before_commit_says_the_create_may_have_been_saved() -> None:
    error = _propose(FAIL_REASON.LEADER_CHANGED)
    assert isinstance(error, OutcomeUnknown)
    assert str(error).startswith("the create may have been saved or not (changed leader before it was confirmed)")
    assert "CREATE_JOBS" not in str(error)


def test_every_command_has_words_for_its_errors() -> None:
    assert set(ops.WHAT) == set(Op)
