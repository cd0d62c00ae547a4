"""bench/sd.py WorkerFleet: counting acked runs per plan from the workers' files."""
from __future__ import annotations

from pathlib import Path

from bench.sd import WorkerFleet


def _append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line)


def test_an_ack_read_before_its_start_counts_once_the_start_is_read(tmp_path: Path) -> None:
    fleet = WorkerFleet([], str(tmp_path), processes=1, concurrency=1)
    starts, acks = tmp_path / "w0.starts.tsv", tmp_path / "w0.acks.tsv"
    _append(starts, "r1\tst-1\t100.000000\t100.010000\n")
    _append(acks, "r1\t100.020000\nr2\t100.030000\n")  # r2's start is not written yet
    assert fleet.acked_count("st") == 1
    _append(starts, "r2\tst-2\t100.000000\t100.020000\n")
    assert fleet.acked_count("st") == 2
    _append(acks, "r2\t100.500000\n")  # a repeated ack line counts once
    assert fleet.acked_count("st") == 2
    assert fleet.acks["r2"] == 100.03


def test_a_half_written_line_waits_for_its_end(tmp_path: Path) -> None:
    fleet = WorkerFleet([], str(tmp_path), processes=1, concurrency=1)
    starts, acks = tmp_path / "w0.starts.tsv", tmp_path / "w0.acks.tsv"
    _append(starts, "r1\tst-1\t100.000000\t100.010000\n")
    _append(acks, "r1\t100.02")
    assert fleet.acked_count("st") == 0
    _append(acks, "0000\n")
    assert fleet.acked_count("st") == 1 and fleet.acks["r1"] == 100.02


def test_ack_lines_are_counted_as_written_without_reading_the_starts(tmp_path: Path) -> None:
    fleet = WorkerFleet([], str(tmp_path), processes=2, concurrency=1)
    assert fleet.ack_lines() == 0  # no worker has written yet
    _append(tmp_path / "w0.acks.tsv", "r1\t100.020000\nr2\t100.0")
    _append(tmp_path / "w1.acks.tsv", "r3\t100.030000\n")
    assert fleet.ack_lines() == 2
    _append(tmp_path / "w0.acks.tsv", "30000\nr1\t100.500000\n")  # a repeated ack counts again
    assert fleet.ack_lines() == 4
    assert fleet.acks == {}  # nothing was parsed
