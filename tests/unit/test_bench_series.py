"""bench/series.py: a steady run cut into windows from its first due time."""
from bench.common import Record
from bench.series import windows


def test_windows_count_starts_lateness_by_due_time_and_cpu_per_start() -> None:
    t0 = 1000.0
    # 20 jobs due in each of two 10 s windows; the second window's start 3 s late.
    records = [Record(f"a{i}", t0 + i * 0.5, t0 + i * 0.5 + 0.1, t0 + i * 0.5 + 0.2) for i in range(20)]
    records += [Record(f"b{i}", t0 + 10 + i * 0.5, t0 + 13 + i * 0.5, t0 + 13.1 + i * 0.5) for i in range(20)]
    # The box busy 1 core in the first window, 2 in the rest.
    samples = [(t0 + s, float(s) if s <= 10 else 10.0 + 2 * (s - 10)) for s in range(0, 31)]
    rows = windows(records, t0, samples)
    assert [r["from_s"] for r in rows] == [0.0, 10.0, 20.0]
    first, second, third = rows
    assert first["started_per_s"] == 2.0 and first["due"] == 20
    assert abs(first["due_p99_s"] - 0.1) < 1e-9
    assert first["box_cores"] == 1.0 and first["us_per_start"] == 500_000
    assert second["due"] == 20 and abs(second["due_p99_s"] - 3.0) < 1e-9
    assert second["started_per_s"] == 1.4  # b0..b13 start before t0 + 20
    assert third["due"] == 0 and third["due_p99_s"] is None
    assert third["started_per_s"] == 0.6 and third["us_per_start"] is None  # under one start a second


def test_no_records_no_windows() -> None:
    assert windows([], 0.0, []) == []
