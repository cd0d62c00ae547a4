"""The last 15 minutes of each queue's dispatches, for the dashboard's charts: per group
(every replica applies the same lease entries, so any holder of a group can answer for it),
per queue, per 10-second slot, how many runs were leased and a histogram of the first
leases' lateness. Slots are cut from the entry's own clock reading, so every replica of a
group holds the same figures. Kept in memory: a node that starts or joins a group has no
history of it before then."""
from __future__ import annotations

import threading
from bisect import bisect_left
from typing import Any

from schedulerd.units import US_PER_S

SLOT_S = 10
WINDOW_S = 15 * 60
SLOTS = WINDOW_S // SLOT_S
# Slot start (s) -> [leased, lateness bucket counts...] (the last bucket is past the last bound).
Slots = dict[int, list[int]]


class QueueHistory:
    def __init__(self, bounds_s: tuple[float, ...]) -> None:
        self.bounds_s = bounds_s
        self._groups: dict[int, dict[str, Slots]] = {}
        self._lock = threading.Lock()  # recorded in Raft tick threads, read by HTTP handlers

    def record(self, group: int, queue: str, now_us: int, leased: int, lateness_s: list[float]) -> None:
        slot = now_us // US_PER_S // SLOT_S * SLOT_S
        with self._lock:
            slots = self._groups.setdefault(group, {}).setdefault(queue, {})
            counts = slots.get(slot)
            if counts is None:
                counts = slots[slot] = [0] * (len(self.bounds_s) + 2)
                for old in [s for s in slots if s <= slot - WINDOW_S]:
                    del slots[old]
            counts[0] += leased
            for value in lateness_s:
                counts[1 + bisect_left(self.bounds_s, value)] += 1

    def of_groups(self, groups: list[int], now_us: int) -> dict[str, Slots]:
        """Per queue, the slots of the last WINDOW_S of these groups, added together."""
        since = now_us // US_PER_S - WINDOW_S
        out: dict[str, Slots] = {}
        with self._lock:
            for group in groups:
                for queue, slots in self._groups.get(group, {}).items():
                    merge(out.setdefault(queue, {}), {s: c for s, c in slots.items() if s > since})
        return out


def merge(into: Slots, more: Slots) -> None:
    """Add `more`'s slots into `into` (several groups, several nodes' answers)."""
    for slot, counts in more.items():
        mine = into.get(slot)
        if mine is None:
            into[slot] = list(counts)
        else:
            for i, n in enumerate(counts):
                mine[i] += n


def points(slots: Slots, bounds_s: tuple[float, ...], now_us: int) -> list[dict[str, Any]]:
    """Every slot of the window, oldest first: dispatches per second and the lateness p50/p99
    (None in a slot without a first lease)."""
    last = now_us // US_PER_S // SLOT_S * SLOT_S
    out = []
    for slot in range(last - WINDOW_S + SLOT_S, last + SLOT_S, SLOT_S):
        counts = slots.get(slot)
        leased, buckets = (counts[0], counts[1:]) if counts else (0, [])
        out.append({"time": slot, "dispatched_per_s": leased / SLOT_S,
                    "lateness_p50_s": quantile(buckets, bounds_s, 0.5),
                    "lateness_p99_s": quantile(buckets, bounds_s, 0.99)})
    return out


def quantile(buckets: list[int], bounds_s: tuple[float, ...], q: float) -> float | None:
    """Prometheus' histogram_quantile over one slot's bucket counts (not cumulative): linear
    within the bucket that holds the q-th value; past the last bound, that bound."""
    total = sum(buckets)
    if total == 0:
        return None
    rank, seen, low = q * total, 0, 0.0
    for count, high in zip(buckets, (*bounds_s, bounds_s[-1])):
        if seen + count >= rank:
            return low + (high - low) * (rank - seen) / count if count else low
        seen, low = seen + count, high
    return bounds_s[-1]
