"""What a proposal to a Raft group resolves to: pysyncobj's callback (tick thread) turned
into an asyncio future on the caller's loop, and its failure codes into ProposalFailed."""
from __future__ import annotations

import asyncio
from typing import Any, Callable

from pysyncobj import FAIL_REASON, SyncObj


class ProposalFailed(Exception):
    """The entry was not committed; `maybe_applied` says whether it could still have been."""

    def __init__(self, reason: str, maybe_applied: bool) -> None:
        super().__init__(reason)
        self.maybe_applied = maybe_applied


FAILURES = {
    FAIL_REASON.QUEUE_FULL: ("is overloaded: its queue of proposals is full", False),
    FAIL_REASON.MISSING_LEADER: ("has no leader: fewer than a quorum of its nodes are up and in reach of each "
                                 "other", False),
    FAIL_REASON.NOT_LEADER: ("changed leader", False),
    # A proposal only pysyncobj_patches.vet_as_leader_appends refuses.
    FAIL_REASON.REQUEST_DENIED: ("refused it: its entry version is newer than a voter reads (a rolling "
                                 "upgrade is under way)", False),
    FAIL_REASON.DISCARDED: ("dropped it when a new leader took over", False),
    FAIL_REASON.LEADER_CHANGED: ("changed leader before it was confirmed", True),
}
# A membership change or a leadership transfer pysyncobj refuses.
CHANGE_REFUSED = ("refused it: another change of this group is not committed yet, the node is already (or not) "
                  "a member, a leader cannot remove itself, or a leadership target is not caught up")


def callback(loop: asyncio.AbstractEventLoop, what: str = "", change: bool = False,
             defer: Callable[[Callable[[], None]], None] | None = None
             ) -> tuple["asyncio.Future[Any]", Callable[[Any, int], None]]:
    """A future, and the pysyncobj callback that settles it from the tick thread. `defer`
    holds a success back (the group reports it only once its store committed the entry);
    `change` reads REQUEST_DENIED as a refused membership change; `what` prefixes reasons."""
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: int) -> None:
        if fut.done():
            return
        if error == FAIL_REASON.SUCCESS:
            fut.set_result(result)
            return
        if change and error == FAIL_REASON.REQUEST_DENIED:
            reason, maybe = CHANGE_REFUSED, False
        else:
            reason, maybe = FAILURES.get(error, (f"gave no outcome (pysyncobj reason {error})", True))
        fut.set_exception(ProposalFailed(f"{what}{reason}", maybe))

    def post(result: Any, error: int) -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, result, error)

    def done(result: Any, error: int) -> None:
        if error == FAIL_REASON.SUCCESS and defer is not None:
            defer(lambda: post(result, error))
        else:
            post(result, error)

    return fut, done


def change_members(replica: SyncObj, kind: str, address: str, loop: asyncio.AbstractEventLoop) -> "asyncio.Future[Any]":
    """Add a member to the replica's group or remove one ("add" | "remove"), on its leader:
    one change at a time, and never the leader itself (leadership is transferred first).
    The future resolves once the change is committed; it fails with ProposalFailed."""
    change = {"add": replica.addNodeToCluster, "remove": replica.removeNodeFromCluster}.get(kind)
    if change is None:
        raise ValueError(f"kind must be add or remove, not {kind!r}")
    fut, done = callback(loop, f"{kind} {address}: the group ", change=True)
    change(address, callback=done)
    return fut
