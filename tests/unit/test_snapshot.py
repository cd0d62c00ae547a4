"""A snapshot file is swapped in only whole: a truncated or damaged one is refused
and the store is left as it was (LMDB would read past a short file: SIGBUS)."""
from __future__ import annotations

import io
import pathlib
import threading

import pytest

from raft import snapshot
from schedulerd.jobspec import JOB_DEFAULTS
from storage.ops import Op
from tests.unit.fsm_driver import S, T0, Driver

ENTRIES = ((b"\x01", 5, 2), (b"\x01", 4, 2), None)


def source_snapshot(tmp_path: pathlib.Path) -> pathlib.Path:
    d = Driver(str(tmp_path / "src"))
    specs = [dict(JOB_DEFAULTS, job_id=f"j{i}", schedule={"kind": "every", "every_us": 60 * S}, schedule_spec={},
                  queue="q", payload_json="{}") for i in range(200)]
    d.apply(Op.CREATE_JOBS, now=T0, jobs=specs)
    path = tmp_path / "group-0.snapshot"
    snapshot.write(d.store, str(path), ENTRIES)
    d.store.close()
    return path


def test_a_whole_snapshot_replaces_an_older_store(tmp_path: pathlib.Path) -> None:
    path = source_snapshot(tmp_path)
    empty = Driver(str(tmp_path / "dst"))
    assert snapshot.restore(empty.store, str(path))[:2] == ((b"\x01", 5, 2), (b"\x01", 4, 2))
    assert empty.job("j199") is not None


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_truncated_or_damaged_snapshot_is_refused_and_changes_nothing(tmp_path: pathlib.Path, damage: str) -> None:
    path = source_snapshot(tmp_path)
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        del raw[len(raw) // 2:]
    else:
        raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    empty = Driver(str(tmp_path / "dst"))
    with pytest.raises(snapshot.BadSnapshot):
        snapshot.restore(empty.store, str(path))
    assert empty.job("j0") is None and empty.store.last_applied() == 0
    assert not list((tmp_path / "dst").glob("*.restore"))


def test_a_write_that_fails_midway_stops_the_copy_and_raises(tmp_path: pathlib.Path, monkeypatch) -> None:
    d = Driver(str(tmp_path / "src"))
    specs = [dict(JOB_DEFAULTS, job_id=f"j{i}", schedule={"kind": "every", "every_us": 60 * S}, schedule_spec={},
                  queue="q", payload_json='"' + "x" * 2000 + '"') for i in range(2000)]
    for i in range(0, 2000, 100):
        d.apply(Op.CREATE_JOBS, now=T0, jobs=specs[i:i + 100])
    monkeypatch.setattr(snapshot, "_BLOCK", 4096)
    threads_before = threading.active_count()

    class FullDisk(io.BytesIO):
        def write(self, data: bytes) -> int:
            if self.tell() > 64 * 1024:
                raise OSError(28, "No space left on device")
            return super().write(data)

    with pytest.raises(OSError, match="No space"):
        snapshot._copy_through_pipe(d.store.env, FullDisk())
    assert threading.active_count() == threads_before, "the copy thread ended"
    d.store.close()
