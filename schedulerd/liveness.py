"""Which nodes the metadata leader declares suspect, dead or alive again, from how long
it has not heard from each: a pure rule, so a test can walk it through any silence.

A node is suspect after `suspect_after_s` of silence (it keeps its replicas: it may be
back in a moment, and it is given no new ones) and dead after `dead_after_s` (its
replicas are then re-created elsewhere, and it never serves again). A suspect node heard
again is alive. A leader counts silence only from when it became leader: a new leader
has heard nobody yet, and must not declare the cluster suspect for it."""
from __future__ import annotations

from typing import Mapping


def transitions(states: Mapping[str, str], silent_s: Mapping[str, float], suspect_after_s: float,
                dead_after_s: float) -> list[tuple[str, str]]:
    """(node id, new state) for each node whose state should change; `silent_s` holds the
    seconds since each watched node was last heard (nodes not in it are not judged)."""
    changes = []
    for node_id, silent in sorted(silent_s.items()):
        state = states.get(node_id)
        if state in ("alive", "suspect") and silent >= dead_after_s:
            changes.append((node_id, "dead"))
        elif state == "alive" and silent >= suspect_after_s:
            changes.append((node_id, "suspect"))
        elif state == "suspect" and silent < suspect_after_s:
            changes.append((node_id, "alive"))
    return changes
