"""This node's id: made at its first start and kept in its data dir, so a restart on the
same data dir is the same node and a wiped disk is a new one, whatever its address. And
the other nodes' HTTP addresses as last seen, kept beside it: a node the cluster took out
while it was away hears nothing from the metadata group, and asks them instead."""
from __future__ import annotations

import json
import os
import re
import secrets

from schedulerd.raft.fileio import fsync_dir

FILE = "node-id"
KNOWN_FILE = "known-nodes.json"
NODE_ID_RE = re.compile(r"n-[0-9a-f]{12}")


def node_id(data_dir: str) -> str:
    path = os.path.join(data_dir, FILE)
    try:
        with open(path, encoding="ascii") as f:
            found = f.read().strip()
    except FileNotFoundError:
        os.makedirs(data_dir, exist_ok=True)
        found = f"n-{secrets.token_hex(6)}"
        _write_atomically(path, found + "\n")
        return found
    if not NODE_ID_RE.fullmatch(found):
        raise ValueError(f"{path} holds {found!r}, not a node id (n- and 12 hex digits): restore it or wipe the data dir")
    return found


def _write_atomically(path: str, text: str) -> None:
    tmp = path + ".partial"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path)


def remember_nodes(data_dir: str, https: list[str]) -> None:
    """Keep the other nodes' HTTP addresses (written only when they changed)."""
    if sorted(https) != known_nodes(data_dir):
        _write_atomically(os.path.join(data_dir, KNOWN_FILE), json.dumps(sorted(https)))


def known_nodes(data_dir: str) -> list[str]:
    try:
        with open(os.path.join(data_dir, KNOWN_FILE), encoding="utf-8") as f:
            found = json.load(f)
    except (FileNotFoundError, ValueError):
        return []
    return [h for h in found if isinstance(h, str)] if isinstance(found, list) else []
