"""bench/timeline.py: one line per step, with the disk and page-cache figures, and each
node's stores' dirty bytes."""
from __future__ import annotations

import pathlib

import pytest

from bench import timeline


def test_each_step_prints_the_box_and_the_disk(capsys: pytest.CaptureFixture[str]) -> None:
    assert timeline.main(["0.2", "--step-s", "0.1", "--disk", "no-such-disk"]) == 0
    steps = capsys.readouterr().out.splitlines()[1:]
    assert len(steps) >= 2
    assert all(" box " in s and "disk 0 MB/s, dirty " in s for s in steps)


def test_a_nodes_store_dirty_bytes_are_the_sum_over_its_groups(tmp_path: pathlib.Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for group in (0, 1):
        (tmp_path / f"group-{group}.lmdb").mkdir()
        (tmp_path / f"group-{group}.lmdb" / "data.mdb").write_bytes(b"x")
    monkeypatch.setattr(timeline, "file_dirty_bytes", lambda path: 3 << 20)
    assert timeline._store_dirty(str(tmp_path)) == 6 << 20
    monkeypatch.setattr(timeline, "file_dirty_bytes", lambda path: None)
    assert timeline._store_dirty(str(tmp_path)) is None
    assert timeline._store_dirty(str(tmp_path / "no-such-dir")) is None
