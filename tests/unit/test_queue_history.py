"""The dashboard's per-queue history (schedulerd/queue_history.py)."""
from __future__ import annotations

from schedulerd import queue_history
from schedulerd.queue_history import SLOT_S, SLOTS, WINDOW_S, QueueHistory
from schedulerd.units import US_PER_S

BOUNDS = (0.1, 1.0, 10.0)
T = 1_800_000_000  # seconds, on a slot boundary


def test_leases_and_lateness_land_in_ten_second_slots_per_group_and_add_up() -> None:
    history = QueueHistory(BOUNDS)
    history.record(0, "q", T * US_PER_S, 3, [0.05, 0.5, 0.5])
    history.record(1, "q", (T + 5) * US_PER_S, 1, [5.0])
    history.record(1, "q", (T + SLOT_S) * US_PER_S, 2, [])
    merged = history.of_groups([0, 1], (T + SLOT_S) * US_PER_S)
    assert merged == {"q": {T: [4, 1, 2, 1, 0], T + SLOT_S: [2, 0, 0, 0, 0]}}
    assert history.of_groups([0], (T + SLOT_S) * US_PER_S) == {"q": {T: [3, 1, 2, 0, 0]}}
    points = queue_history.points(merged["q"], BOUNDS, (T + SLOT_S) * US_PER_S)
    assert len(points) == SLOTS and points[-1]["time"] == T + SLOT_S
    first = points[-2]
    assert first["dispatched_per_s"] == 0.4
    assert first["lateness_p50_s"] == 0.1 + 0.9 * (2 - 1) / 2  # within (0.1, 1.0], linear
    assert points[-1]["lateness_p50_s"] is None and points[0]["dispatched_per_s"] == 0


def test_slots_older_than_the_window_are_dropped() -> None:
    history = QueueHistory(BOUNDS)
    history.record(0, "q", T * US_PER_S, 1, [])
    history.record(0, "q", (T + WINDOW_S) * US_PER_S, 1, [])  # a new slot drops those past the window
    assert list(history.of_groups([0], (T + WINDOW_S) * US_PER_S)["q"]) == [T + WINDOW_S]


def test_quantile_past_the_last_bound_is_that_bound() -> None:
    assert queue_history.quantile([0, 0, 0, 4], BOUNDS, 0.99) == 10.0
    assert queue_history.quantile([], BOUNDS, 0.5) is None
