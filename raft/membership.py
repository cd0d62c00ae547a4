"""A Raft group's members as its own log has them.

Raft has each server use the latest configuration in its log, committed or not.
pysyncobj takes a restarted node's members from its constructor and changes them only
as it applies entries again, which it does only up to the commit index it stored (lazily,
so possibly behind): until the leader reaches it, a restarted node could count votes
among members that are no longer the group's. So a group's members are worked out from
its snapshot and journal before its SyncObj is built, starting from the members its log
started from (kept in a file beside the journal)."""
from __future__ import annotations

import json
import os
from typing import Iterable

from schedulerd.raft import pysyncobj_patches
from schedulerd.raft.fileio import fsync_dir

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


def first_members(path: str, new: Iterable[str], fresh: bool) -> set[str]:
    """The members a replica's log starts from, kept at `path` beside its journal.

    A replica's log holds only changes to its members, never the members it started with:
    a replica added to a running group (given the members of that moment, the changes
    after it still to come in its log) that got the log rather than a snapshot rebuilt,
    on a restart, its members from its own address alone, and then elected itself as a
    group of one (the membership nemesis, kill -9 after a join). So a replica created
    `fresh` writes `new` here before its journal exists, and every later start reads it;
    a data dir without the file (its replica older than it) starts from `new`. Replaying
    the log's changes over a set that was the members at any point of the log gives the
    members at its end (each address ends as its last change says)."""
    try:
        with open(path) as fh:
            return set(json.load(fh))
    except FileNotFoundError:
        pass
    members = set(new)
    if fresh:
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(sorted(members), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path)
    return members
