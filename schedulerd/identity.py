"""This node's id: made at its first start and kept in its data dir, so a restart on the
same data dir is the same node and a wiped disk is a new one, whatever its address."""
from __future__ import annotations

import os
import re
import secrets

from schedulerd.raft.fileio import fsync_dir

FILE = "node-id"
NODE_ID_RE = re.compile(r"n-[0-9a-f]{12}")


def node_id(data_dir: str) -> str:
    path = os.path.join(data_dir, FILE)
    try:
        with open(path, encoding="ascii") as f:
            found = f.read().strip()
    except FileNotFoundError:
        os.makedirs(data_dir, exist_ok=True)
        found = f"n-{secrets.token_hex(6)}"
        tmp = path + ".partial"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(found + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path)
        return found
    if not NODE_ID_RE.fullmatch(found):
        raise ValueError(f"{path} holds {found!r}, not a node id (n- and 12 hex digits): restore it or wipe the data dir")
    return found
