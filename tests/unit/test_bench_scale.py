"""bench scale --side-by-side and bench.micro.scale_cost: the order their two systems take turns in,
and how a system's windows combine."""
from __future__ import annotations

from bench.common import alternation
from bench.sd_scenarios import copy_split, mean_stats


def test_alternation_runs_each_system_once_per_pair_in_abba_order() -> None:
    assert alternation(1) == [0, 1]
    assert alternation(2) == [0, 1, 1, 0]
    assert alternation(3) == [0, 1, 1, 0, 0, 1]
    for pairs in range(1, 8):
        order = alternation(pairs)
        assert order.count(0) == order.count(1) == pairs


def test_alternation_balances_a_linear_drift_over_whole_abba_blocks() -> None:
    """A box slowing by the same amount each window weighs both systems alike."""
    for pairs in (2, 4, 6):
        order = alternation(pairs)
        assert sum(k for k, w in enumerate(order) if w == 0) == sum(k for k, w in enumerate(order) if w == 1)


def test_mean_stats_averages_percentiles_sums_counts_and_keeps_the_largest_max() -> None:
    a = {"expected": 10, "ran": 10, "missing": 0, "duplicates": 0, "early": 0, "lateness_p50_s": 0.010,
         "lateness_p99_s": 0.030, "lateness_max_s": 0.050, "done_per_s": 300.0}
    b = {**a, "ran": 9, "missing": 1, "lateness_p50_s": 0.020, "lateness_p99_s": 0.050, "lateness_max_s": 0.040,
         "done_per_s": 290.0}
    m = mean_stats([a, b])
    assert m["expected"] == 20 and m["ran"] == 19 and m["missing"] == 1
    assert abs(m["lateness_p50_s"] - 0.015) < 1e-12 and abs(m["lateness_p99_s"] - 0.040) < 1e-12
    assert m["lateness_max_s"] == 0.050 and m["done_per_s"] == 295.0


def test_copy_split_compares_the_big_systems_windows_with_and_without_a_snapshot() -> None:
    def window(system: str, p99: float, copies: int) -> dict:
        return {"system": system, "stats": {"lateness_p99_s": p99}, "big_copies": copies}

    names = ["small", "big"]
    windows = [window("small", 0.020, 0), window("big", 0.020, 0), window("big", 0.030, 2), window("small", 0.020, 1)]
    line = copy_split(windows, names)
    assert "(mean p99 20.0 ms)" in line
    assert "1 without a snapshot of it: p99 20.0 ms (1.00x)" in line
    assert "1 with a snapshot of it: p99 30.0 ms (1.50x)" in line
    assert "none with a snapshot of it" in copy_split(windows[:2], names)
