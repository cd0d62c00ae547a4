"""Which data groups have a replica in a data dir, and taking one away.

A group's replica is its files `group-{g}.*` (journal segments, snapshot, LMDB store). Its
journal or its snapshot says it exists: pysyncobj creates the journal when the group
starts, and `schedulerd restore` writes a snapshot alone. A removal takes both away
first, so a removal cut short by a crash leaves only leftovers that the next removal (or
the next start, which sweeps them) deletes, never a half replica that starts."""
from __future__ import annotations

import os
import re
import shutil

from schedulerd.raft.fileio import fsync_dir

_MARKS = re.compile(r"group-([0-9]{1,4})\.(?:journal|snapshot)")


def _prefix(group: int) -> str:
    return f"group-{group}."


def held(data_dir: str) -> list[int]:
    """The groups with a replica in `data_dir`, in order."""
    try:
        names = os.listdir(data_dir)
    except FileNotFoundError:
        return []
    return sorted({int(m.group(1)) for m in map(_MARKS.fullmatch, names) if m is not None})


def remove(data_dir: str, group: int) -> None:
    """Delete group `group`'s replica (its journal and snapshot first, durably), then its other files."""
    for mark in ("journal", "snapshot"):
        path = os.path.join(data_dir, f"group-{group}.{mark}")
        if os.path.exists(path):
            os.remove(path)
            fsync_dir(path)
    sweep(data_dir, group)


def sweep(data_dir: str, group: int) -> None:
    """Delete what is left of a group whose journal and snapshot are gone."""
    if group in held(data_dir):
        raise ValueError(f"group {group} still has its journal or snapshot in {data_dir}: remove() it")
    for name in os.listdir(data_dir):
        if name.startswith(_prefix(group)):
            path = os.path.join(data_dir, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)


def leftovers(data_dir: str) -> list[int]:
    """Groups with files but neither journal nor snapshot: a removal cut short."""
    found = set()
    for name in os.listdir(data_dir) if os.path.isdir(data_dir) else []:
        m = re.fullmatch(r"group-([0-9]{1,4})\..*", name)
        if m is not None:
            found.add(int(m.group(1)))
    return sorted(found - set(held(data_dir)))
