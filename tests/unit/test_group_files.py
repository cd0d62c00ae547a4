"""raft/group_files.py: which groups a data dir holds, and taking one away so that a crash
midway never leaves a half replica that would start."""
from __future__ import annotations

import os
import pathlib

from schedulerd.raft import group_files


def _touch(path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")


def test_a_group_is_held_by_its_journal_or_its_snapshot(tmp_path: pathlib.Path) -> None:
    _touch(tmp_path / "group-0.journal")
    _touch(tmp_path / "group-1.snapshot")  # as `schedulerd restore` leaves it
    _touch(tmp_path / "group-10.lmdb" / "data.mdb")
    _touch(tmp_path / "meta.journal")
    assert group_files.held(str(tmp_path)) == [0, 1]
    assert group_files.leftovers(str(tmp_path)) == [10]
    assert group_files.held(str(tmp_path / "missing")) == []


def test_removing_a_group_takes_all_its_files_and_none_of_another(tmp_path: pathlib.Path) -> None:
    for name in ("group-1.journal", "group-1.journal.1", "group-1.journal.meta", "group-1.snapshot",
                 "group-1.lmdb/data.mdb", "group-11.journal", "group-11.lmdb/data.mdb"):
        _touch(tmp_path / name)
    group_files.remove(str(tmp_path), 1)
    assert sorted(os.listdir(tmp_path)) == ["group-11.journal", "group-11.lmdb"]


def test_a_removal_cut_short_leaves_leftovers_that_a_sweep_deletes(tmp_path: pathlib.Path) -> None:
    _touch(tmp_path / "group-2.lmdb" / "data.mdb")  # journal and snapshot already gone
    assert group_files.held(str(tmp_path)) == [] and group_files.leftovers(str(tmp_path)) == [2]
    group_files.sweep(str(tmp_path), 2)
    assert os.listdir(tmp_path) == []
    _touch(tmp_path / "group-3.journal")
    try:
        group_files.sweep(str(tmp_path), 3)
    except ValueError as exc:
        assert "remove() it" in str(exc)
    else:
        raise AssertionError("a sweep must not delete a group that is still held")
