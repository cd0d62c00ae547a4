"""A Raft group's members as its own log has them.

Raft has each server use the latest configuration in its log, committed or not.
pysyncobj takes a restarted node's members from its constructor and changes them only
as it applies entries again, which it does only up to the commit index it stored (lazily,
so possibly behind): until the leader reaches it, a restarted node could count votes
among members that are no longer the group's. So a group's members are worked out from
its snapshot and journal before its SyncObj is built."""
from __future__ import annotations

from typing import Iterable

from schedulerd.raft import pysyncobj_patches

Entry = tuple[bytes, int, int]  # pysyncobj's (command, index, term)


def members_in_log(start: Iterable[str], after_index: int, entries: Iterable[Entry]) -> set[str]:
    """`start` (the members as of entry `after_index`: a snapshot's, or the group's first),
    changed by each membership entry after that index, in log order."""
    members = set(start)
    for command, index, _term in entries:
        if index <= after_index:
            continue
        change = pysyncobj_patches.membership_change(command)
        if change is None:
            continue
        kind, address = change
        if kind == "add":
            members.add(address)
        else:
            members.discard(address)
    return members
