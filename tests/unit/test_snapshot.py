"""A snapshot file is swapped in only whole: a truncated or damaged one is refused
and the store is left as it was (LMDB would read past a short file: SIGBUS)."""
from __future__ import annotations

import fcntl
import os
import pathlib
import threading
import time
from typing import Any

import lmdb
import pytest
from pysyncobj.node import TCPNode

from schedulerd.raft import snapshot
from schedulerd.storage.jobs import SPEC_DEFAULTS
from schedulerd.storage.ops import Op
from tests.unit.fsm_driver import S, T0, Driver

MEMBERS = {TCPNode("127.0.0.1:7001"), TCPNode("127.0.0.1:7002")}  # pysyncobj passes its nodes
ENTRIES = ((b"\x01", 5, 2), (b"\x01", 4, 2), MEMBERS)


def source_snapshot(tmp_path: pathlib.Path) -> pathlib.Path:
    d = Driver(str(tmp_path / "src"))
    specs = [dict(SPEC_DEFAULTS, job_id=f"j{i}", schedule={"kind": "every", "every_us": 60 * S}, schedule_spec={},
                  queue="q", payload_json="{}") for i in range(200)]
    d.apply(Op.CREATE_JOBS, now=T0, jobs=specs)
    path = tmp_path / "group-0.snapshot"
    snapshot.write(d.store, str(path), ENTRIES)
    d.store.close()
    return path


def test_a_whole_snapshot_replaces_an_older_store(tmp_path: pathlib.Path) -> None:
    path = source_snapshot(tmp_path)
    empty = Driver(str(tmp_path / "dst"))
    assert snapshot.restore(empty.store, str(path)) == ((b"\x01", 5, 2), (b"\x01", 4, 2),
                                                        ["127.0.0.1:7001", "127.0.0.1:7002"])
    assert snapshot.members_at(str(path)) == (["127.0.0.1:7001", "127.0.0.1:7002"], 5)
    assert snapshot.members_at(str(tmp_path / "none.snapshot")) == (None, 0)
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


def filled_store(tmp_path: pathlib.Path) -> Driver:
    """About 4 MB of store: several blocks of copy."""
    d = Driver(str(tmp_path / "src"))
    specs = [dict(SPEC_DEFAULTS, job_id=f"j{i}", schedule={"kind": "every", "every_us": 60 * S}, schedule_spec={},
                  queue="q", payload_json='"' + "x" * 2000 + '"') for i in range(2000)]
    for i in range(0, 2000, 100):
        d.apply(Op.CREATE_JOBS, now=T0, jobs=specs[i:i + 100])
    return d


def test_a_write_that_fails_midway_stops_the_copy_and_raises(tmp_path: pathlib.Path, monkeypatch) -> None:
    d = filled_store(tmp_path)
    real_pwrite = os.pwrite

    def full_disk(fd: int, data: memoryview, offset: int) -> int:
        if offset > 64 * 1024:
            raise OSError(28, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(snapshot.os, "pwrite", full_disk)
    threads_before = threading.active_count()
    with pytest.raises(OSError, match="No space"):
        snapshot.write(d.store, str(tmp_path / "group-0.snapshot"), ENTRIES)
    assert threading.active_count() == threads_before, "the copy thread ended"
    d.store.close()


def direct_io_works(directory: pathlib.Path) -> bool:
    path = directory / "probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        return snapshot._try_direct(fd, True)
    finally:
        os.close(fd)
        path.unlink()


def test_the_copy_starts_on_a_block_boundary_and_is_written_direct_where_it_can_be(
        tmp_path: pathlib.Path, monkeypatch) -> None:
    d = filled_store(tmp_path)
    writes: list[tuple[int, int, bool]] = []
    real_pwrite = os.pwrite

    def recorded(fd: int, data: memoryview, offset: int) -> int:
        writes.append((offset, len(data), bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(snapshot.os, "pwrite", recorded)
    path = tmp_path / "group-0.snapshot"
    snapshot.write(d.store, str(path), ENTRIES)
    header, offset = snapshot.read_header(str(path))
    assert offset % 4096 == 0 and header["last_applied"] == d.store.last_applied()
    assert len(writes) >= 4 and all(off % 4096 == 0 and size % 4096 == 0 for off, size, _ in writes)
    assert {direct for _, _, direct in writes} == {direct_io_works(tmp_path)}
    empty = Driver(str(tmp_path / "dst"))
    snapshot.restore(empty.store, str(path))
    assert empty.job("j1999") is not None
    d.store.close()


def test_without_direct_io_the_copy_is_synced_as_it_grows(tmp_path: pathlib.Path, monkeypatch) -> None:
    d = filled_store(tmp_path)
    syncs: list[int] = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(snapshot, "_try_direct", lambda fd, on: False)
    monkeypatch.setattr(snapshot, "_SYNC_EVERY", 1 << 20)
    monkeypatch.setattr(snapshot.os, "fdatasync", lambda fd: (syncs.append(os.fstat(fd).st_size), real_fdatasync(fd)))
    path = tmp_path / "group-0.snapshot"
    snapshot.write(d.store, str(path), ENTRIES)
    size = path.stat().st_size
    assert len(syncs) >= 2 and syncs == sorted(syncs) and syncs[-1] < size, \
        f"synced while the copy grew, not only at its end: {syncs} of {size} bytes"
    empty = Driver(str(tmp_path / "dst"))
    snapshot.restore(empty.store, str(path))
    assert empty.job("j1999") is not None
    d.store.close()


def test_a_paced_copy_takes_as_long_as_its_rate_says(tmp_path: pathlib.Path) -> None:
    d = filled_store(tmp_path)
    path = tmp_path / "group-0.snapshot"
    rate = 16 << 20
    started = time.monotonic()
    snapshot.write(d.store, str(path), ENTRIES, bytes_per_s=rate)
    took = time.monotonic() - started
    _, offset = snapshot.read_header(str(path))
    copied = path.stat().st_size - offset - snapshot._TRAILER.size
    assert copied > 2 << 20 and took >= copied / rate - 1 / 16, f"{copied} bytes in {took:.3f} s"
    d.store.close()


def test_a_paced_copy_is_written_in_small_pieces_and_reads_back_the_same(tmp_path: pathlib.Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A journal fdatasync waits for the copy's write in the disk's queue: a paced copy
    keeps each write to _WRITE_PIECE bytes, and still writes the bytes an unpaced one does."""
    d = filled_store(tmp_path)
    unpaced, paced = tmp_path / "unpaced.snapshot", tmp_path / "paced.snapshot"
    snapshot.write(d.store, str(unpaced), ENTRIES)
    writes: list[int] = []
    real_pwrite_all = snapshot.pwrite_all
    monkeypatch.setattr(snapshot, "pwrite_all", lambda fd, data, at: (writes.append(len(data)),
                                                                       real_pwrite_all(fd, data, at)))
    snapshot.write(d.store, str(paced), ENTRIES, bytes_per_s=1 << 40)
    assert len(writes) > 2 and max(writes) == snapshot._WRITE_PIECE, writes
    assert paced.read_bytes() == unpaced.read_bytes()
    d.store.close()


def test_the_header_pads_to_a_block_whatever_its_size() -> None:
    for size in range(0, 9000, 7):
        prefix = snapshot._aligned_prefix({"last": [b"x" * size, 5, 2], "prev": [b"\x01", 4, 2], "last_applied": 5})
        assert len(prefix) % 4096 == 0


def test_a_snapshot_written_over_a_bigger_file_is_cut_to_its_own_length(tmp_path: pathlib.Path) -> None:
    d = filled_store(tmp_path)
    fresh, reused = tmp_path / "fresh.snapshot", tmp_path / "reused.snapshot"
    snapshot.write(d.store, str(fresh), ENTRIES)
    reused.write_bytes(b"\xee" * (fresh.stat().st_size * 3))  # an older, bigger snapshot's file
    inode = reused.stat().st_ino
    snapshot.write(d.store, str(reused), ENTRIES)
    assert reused.stat().st_ino == inode and reused.read_bytes() == fresh.read_bytes()
    d.store.close()


def readers_while_writing(store_env: lmdb.Environment, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """[whether an LMDB read txn was open once the copy's first block was read], per copy
    (the store is several times the pipe's size, so a copy through it is still running then)."""
    seen: list[bool] = []
    real_write_from, real_fill = snapshot._write_from, snapshot._fill
    first: list[bool] = []

    def fill(read_fd: int, block: memoryview) -> int:
        got = real_fill(read_fd, block)
        if not first:
            first.append(True)
            seen.append("no active readers" not in store_env.readers())
        return got

    def write_from(read_fd: int, fd: int, offset: int, bytes_per_s: int) -> tuple[int, int]:
        first.clear()
        return real_write_from(read_fd, fd, offset, bytes_per_s)

    monkeypatch.setattr(snapshot, "_fill", fill)
    monkeypatch.setattr(snapshot, "_write_from", write_from)
    return seen


def test_a_staged_copy_holds_no_read_txn_while_it_is_written(tmp_path: pathlib.Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages freed while a read txn is open join LMDB's free list for good: the copy is
    staged first, and the paced write reads the staged file, not the store."""
    d = filled_store(tmp_path)
    stage = tmp_path / "stage"
    stage.mkdir()
    piped, staged = tmp_path / "piped.snapshot", tmp_path / "staged.snapshot"
    seen = readers_while_writing(d.store.env, monkeypatch)
    snapshot.write(d.store, str(piped), ENTRIES, bytes_per_s=1 << 40)
    snapshot.write(d.store, str(staged), ENTRIES, bytes_per_s=1 << 40, stage_dir=str(stage))
    assert seen == [True, False]
    assert staged.read_bytes() == piped.read_bytes()
    assert list(stage.iterdir()) == [], "the staged copy is an unlinked file"
    d.store.close()


def test_without_room_to_stage_the_copy_goes_through_the_pipe(tmp_path: pathlib.Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    d = filled_store(tmp_path)
    seen = readers_while_writing(d.store.env, monkeypatch)
    snapshot.write(d.store, str(tmp_path / "missing.snapshot"), ENTRIES, stage_dir=str(tmp_path / "missing"))
    full = os.statvfs_result((4096, 4096, 1000, 10, 10, 1000, 10, 10, 0, 255))
    monkeypatch.setattr(snapshot.os, "statvfs", lambda path: full)
    snapshot.write(d.store, str(tmp_path / "full.snapshot"), ENTRIES, stage_dir=str(tmp_path))
    assert seen == [True, True]
    assert (tmp_path / "missing.snapshot").read_bytes() == (tmp_path / "full.snapshot").read_bytes()
    d.store.close()


def test_a_staging_that_fails_midway_falls_back_to_the_pipe(tmp_path: pathlib.Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    d = filled_store(tmp_path)
    reference, fallen_back = tmp_path / "reference.snapshot", tmp_path / "fallen-back.snapshot"
    snapshot.write(d.store, str(reference), ENTRIES)
    copies: list[int] = []
    env = d.store.env

    class FullStageEnv:
        """The store's env, but its first copy (into the stage dir) runs out of room."""

        def __getattr__(self, name: str) -> Any:
            return getattr(env, name)

        def copyfd(self, fd: int, compact: bool) -> None:
            copies.append(fd)
            if len(copies) == 1:
                raise OSError(28, "No space left on device")
            env.copyfd(fd, compact=compact)

    monkeypatch.setattr(d.store, "env", FullStageEnv())
    stage = tmp_path / "stage"
    stage.mkdir()
    snapshot.write(d.store, str(fallen_back), ENTRIES, stage_dir=str(stage))
    assert len(copies) == 2 and fallen_back.read_bytes() == reference.read_bytes()
    assert list(stage.iterdir()) == []
    monkeypatch.undo()
    d.store.close()
