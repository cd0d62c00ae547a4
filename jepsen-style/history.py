"""The run's history: every client operation, fault and lifecycle event, in the
order they were recorded, kept in memory for the checkers and appended to
`history.jsonl` as it happens (so a crashed run still leaves its evidence).

Times are the harness host clock (`time.time()`); nodes and workers run on the
same machine, so the whole run has one clock (nodes may be *told* otherwise by
the clock-skew nemesis, which is itself in the history)."""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Iterator


class History:
    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._file = open(path, "a", buffering=1)

    def add(self, type_: str, **fields: Any) -> dict[str, Any]:
        event = {"type": type_, "t": time.time(), **fields}
        with self._lock:
            self._events.append(event)
            self._file.write(json.dumps(event, sort_keys=True) + "\n")
        return event

    def of(self, type_: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self._events if e["type"] == type_]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        with self._lock:
            return iter(list(self._events))

    def close(self) -> None:
        with self._lock:
            self._file.close()


def load(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
