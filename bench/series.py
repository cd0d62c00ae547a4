"""A steady run window by window: whether it kept up all along, or fell behind and when.

A whole run's p99 does not say whether a system held its rate and then fell behind, or
why: a backlog that grows in the last third of a 60 s run reads the same as one that
was there from the start. Per WINDOW_S of the run this gives the jobs started per
second, the lateness of the jobs due in the window, the whole box's busy CPU per job
started (from /proc/stat, sampled every second) and the box's own speed over the window
(bench/speed.py)."""
from __future__ import annotations

import threading
import time
from typing import Any

from bench.common import Record, machine_busy_s, percentile
from bench.speed import PROBE

WINDOW_S = 10.0
SAMPLE_S = 1.0


class BusySampler(threading.Thread):
    """(epoch s, machine busy CPU s) every SAMPLE_S until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="busy-sampler")
        self.samples: list[tuple[float, float]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while True:
            self.samples.append((time.time(), machine_busy_s()))
            if self._halt.wait(SAMPLE_S):
                return

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.samples.append((time.time(), machine_busy_s()))


def _busy_cores(samples: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def windows(records: list[Record], t_first_due: float, samples: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """One row per WINDOW_S from the first due time until the last start."""
    if not records:
        return []
    count = int(max(0.0, max(r.start for r in records) - t_first_due) // WINDOW_S) + 1
    started = [0] * count
    late: list[list[float]] = [[] for _ in range(count)]
    for r in records:
        k = int((r.start - t_first_due) // WINDOW_S)
        if 0 <= k < count:
            started[k] += 1
        k = int((r.due - t_first_due) // WINDOW_S)
        if 0 <= k < count:
            late[k].append(r.start - r.due)
    rows = []
    for k in range(count):
        a, b = t_first_due + k * WINDOW_S, t_first_due + (k + 1) * WINDOW_S
        per_s = started[k] / WINDOW_S
        cores = _busy_cores(samples, a, b)
        rows.append({
            "from_s": k * WINDOW_S, "started_per_s": per_s, "due": len(late[k]),
            "due_p99_s": percentile(sorted(late[k]), 99) if late[k] else None,
            "box_cores": cores,
            # Under one start a second (a drain's last stragglers) the ratio says nothing.
            "us_per_start": cores / per_s * 1e6 if cores is not None and per_s >= 1 else None,
            "box_slowdown": PROBE.slowdown(a, b),
        })
    return rows


def render(name: str, rows: list[dict[str, Any]]) -> str:
    def num(value: Any, pattern: str) -> str:
        return "n/a" if value is None else pattern.format(value)

    return f"{name}, per {WINDOW_S:g} s from the first due time: " + "; ".join(
        f"{r['from_s']:g} s: {r['started_per_s']:,.0f} started/s, due p99 {num(r['due_p99_s'], '{:.2f} s')}, "
        f"box {num(r['box_cores'], '{:.2f}')} cores ({num(r['us_per_start'], '{:,.0f}')} µs per start), "
        f"speed {num(r['box_slowdown'], '{:g}')}" for r in rows)
