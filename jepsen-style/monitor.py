"""Samples every node's `GET /v1/cluster` once a second into the history, so the
report can show how far each replica lagged and for how long (a node that
rejoins but never catches up is invisible to clients until another fails)."""
from __future__ import annotations

import threading
from typing import Any

from cluster import Cluster
from history import History

INTERVAL_S = 1.0
LAG_ENTRIES = 100  # a replica this many entries behind the most advanced one counts as lagging
FIELDS = ("term", "leader", "is_leader", "commit_index", "last_applied", "leader_commit_index", "journal_entries")


class Monitor:
    def __init__(self, cluster: Cluster, history: History) -> None:
        self.cluster, self.history = cluster, history
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="monitor", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(10)

    def _loop(self) -> None:
        while not self.stop_event.wait(INTERVAL_S):
            for node in self.cluster.nodes:
                status = self.cluster.status(node.idx, timeout_s=1.0)
                if status is not None:
                    self.history.add("status", node=node.idx, **{k: status.get(k) for k in FIELDS})


def lag_figures(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Per node: the most entries it was behind the most advanced node in the same
    sampling second, and the longest stretch it stayed more than LAG_ENTRIES behind."""
    rounds: dict[int, dict[int, int]] = {}
    times: dict[int, float] = {}
    for e in history:
        if e["type"] == "status" and e.get("commit_index") is not None:
            second = int(e["t"])
            rounds.setdefault(second, {})[e["node"]] = e["commit_index"]
            times[second] = e["t"]
    out: dict[str, Any] = {}
    stretch_start: dict[int, float | None] = {}
    for second in sorted(rounds):
        top = max(rounds[second].values())
        for node, commit in rounds[second].items():
            fig = out.setdefault(str(node), {"max_lag_entries": 0, "longest_lag_s": 0.0})
            lag = top - commit
            fig["max_lag_entries"] = max(fig["max_lag_entries"], lag)
            if lag > LAG_ENTRIES:
                began = stretch_start.get(node) or times[second]
                stretch_start[node] = began
                fig["longest_lag_s"] = round(max(fig["longest_lag_s"], times[second] - began), 1)
            else:
                stretch_start[node] = None
    return out
