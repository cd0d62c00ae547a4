"""Compaction snapshots written beside the tick thread (raft/snapshot_writer.py):
the previous snapshot stays in place until the new one is whole, a failed or
abandoned copy changes nothing, and each outcome is reported to pysyncobj once."""
from __future__ import annotations

import os
import pathlib
import threading
import time
from typing import Any

import pytest
from pysyncobj import SERIALIZER_STATE
from pysyncobj.node import TCPNode

from schedulerd.raft import snapshot
from schedulerd.raft.snapshot_writer import SnapshotWriter
from schedulerd.storage.jobs import SPEC_DEFAULTS
from schedulerd.storage.ops import Op
from tests.integration.harness import wait_until
from tests.unit.fsm_driver import S, T0, Driver

MEMBERS = {TCPNode("127.0.0.1:7001"), TCPNode("127.0.0.1:7002")}  # pysyncobj passes its nodes
FIRST = ((b"\x01", 5, 2), (b"\x01", 4, 2), MEMBERS)
SECOND = ((b"\x01", 9, 2), (b"\x01", 8, 2), MEMBERS)
THIRD = ((b"\x01", 13, 2), (b"\x01", 12, 2), MEMBERS)
FOURTH = ((b"\x01", 17, 2), (b"\x01", 16, 2), MEMBERS)


@pytest.fixture
def setup(tmp_path: pathlib.Path):
    d = Driver(str(tmp_path / "lmdb"))
    d.apply(Op.CREATE_JOBS, now=T0, jobs=[dict(SPEC_DEFAULTS, job_id="j", schedule={"kind": "every", "every_us": S},
                                               schedule_spec={}, queue="q", payload_json="{}")])
    final = tmp_path / "group-0.snapshot"
    yield d, SnapshotWriter(d.store, str(final)), final
    d.store.close()


def pysyncobj_serialize(writer: SnapshotWriter, final: pathlib.Path, data: tuple[Any, ...]) -> None:
    """What pysyncobj's Serializer.serialize does around the serializer."""
    tmp = str(final) + ".tmp"
    writer.write(tmp, data)
    os.replace(tmp, final)


def finished(writer: SnapshotWriter) -> int:
    states: list[int] = []
    wait_until(lambda: states.append(writer.state()) or states[-1] != SERIALIZER_STATE.SERIALIZING, 10, "the copy")
    return states[-1]


def snapshot_files(final: pathlib.Path) -> list[str]:
    return sorted(p.name for p in final.parent.iterdir() if p.name.startswith(final.name))


def last_index(path: pathlib.Path) -> int:
    return snapshot.read_header(str(path))[0]["last"][1]


def test_the_first_snapshot_is_written_in_the_call(setup) -> None:
    _, writer, final = setup
    pysyncobj_serialize(writer, final, FIRST)
    assert last_index(final) == 5
    assert writer.state() == SERIALIZER_STATE.SUCCESS
    assert writer.state() == SERIALIZER_STATE.NOT_SERIALIZING


def first_snapshot(writer: SnapshotWriter, final: pathlib.Path) -> None:
    pysyncobj_serialize(writer, final, FIRST)
    assert writer.state() == SERIALIZER_STATE.SUCCESS


def gated_copies(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Copies wait for the returned event before writing."""
    release = threading.Event()
    real_write = snapshot.write

    def gated(store: Any, path: str, data: tuple[Any, ...], bytes_per_s: int = 0,
              stage_dir: str | None = None) -> None:
        release.wait(10)
        real_write(store, path, data, bytes_per_s, stage_dir)

    monkeypatch.setattr(snapshot, "write", gated)
    return release


def test_the_previous_snapshot_stays_until_the_new_one_is_whole(setup, monkeypatch) -> None:
    _, writer, final = setup
    first_snapshot(writer, final)
    release = gated_copies(monkeypatch)
    pysyncobj_serialize(writer, final, SECOND)  # returns at once; pysyncobj's rename changes nothing
    assert writer.state() == SERIALIZER_STATE.SERIALIZING
    assert last_index(final) == 5
    release.set()
    assert finished(writer) == SERIALIZER_STATE.SUCCESS
    assert last_index(final) == 9
    assert snapshot_files(final) == [final.name, final.name + ".retired"], "kept for the next copy"
    assert writer.state() == SERIALIZER_STATE.NOT_SERIALIZING


def test_each_copy_writes_over_the_file_of_the_snapshot_before_the_last(setup) -> None:
    """No copy frees a file (a big unlink stalls fdatasync on a disk mounted with discard)."""
    _, writer, final = setup
    first_snapshot(writer, final)
    inodes = [final.stat().st_ino]
    for entries in (SECOND, THIRD, FOURTH):
        pysyncobj_serialize(writer, final, entries)
        assert finished(writer) == SERIALIZER_STATE.SUCCESS
        inodes.append(final.stat().st_ino)
        assert last_index(final) == entries[0][1]
    assert inodes[2] == inodes[0] and inodes[3] == inodes[1] and inodes[0] != inodes[1]
    assert snapshot_files(final) == [final.name, final.name + ".retired"]


def test_a_failed_copy_keeps_the_previous_snapshot(setup, monkeypatch) -> None:
    _, writer, final = setup
    first_snapshot(writer, final)

    def broken_write(store: Any, path: str, data: tuple[Any, ...], bytes_per_s: int = 0,
                     stage_dir: str | None = None) -> None:
        pathlib.Path(path).write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(snapshot, "write", broken_write)
    pysyncobj_serialize(writer, final, SECOND)
    assert finished(writer) == SERIALIZER_STATE.FAILED
    assert last_index(final) == 5
    assert snapshot_files(final) == [final.name, final.name + ".retired"], "the half copy's file, for reuse"


def test_a_copy_overtaken_by_a_restore_is_dropped(setup, monkeypatch) -> None:
    _, writer, final = setup
    first_snapshot(writer, final)
    release = gated_copies(monkeypatch)
    pysyncobj_serialize(writer, final, SECOND)
    threading.Timer(0.2, release.set).start()
    writer.abandon()  # waits for the copy, then throws it away
    assert last_index(final) == 5
    assert writer.state() == SERIALIZER_STATE.FAILED  # pysyncobj must hear an outcome to compact again
    assert writer.state() == SERIALIZER_STATE.NOT_SERIALIZING
    assert not os.path.exists(str(final) + ".next")


def test_a_copy_waits_its_turn_and_an_abandon_does_not_wait_for_it(tmp_path: pathlib.Path) -> None:
    d = Driver(str(tmp_path / "lmdb"))
    final = tmp_path / "group-0.snapshot"
    writer = SnapshotWriter(d.store, str(final), delay_s=lambda: 60.0)
    first_snapshot(writer, final)
    pysyncobj_serialize(writer, final, SECOND)
    assert writer.state() == SERIALIZER_STATE.SERIALIZING
    started = time.monotonic()
    writer.abandon()
    assert time.monotonic() - started < 5
    assert last_index(final) == 5 and writer.state() == SERIALIZER_STATE.FAILED
    d.store.close()


def test_a_snapshot_that_cannot_start_is_reported_failed_and_compaction_goes_on(setup, monkeypatch) -> None:
    _, writer, final = setup
    first_snapshot(writer, final)

    def no_links(src: str, dst: str) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    with pytest.raises(OSError):  # pysyncobj catches it and leaves its .tmp alone
        writer.write(str(final) + ".tmp", SECOND)
    assert writer.state() == SERIALIZER_STATE.FAILED
    monkeypatch.undo()
    pysyncobj_serialize(writer, final, SECOND)
    assert finished(writer) == SERIALIZER_STATE.SUCCESS and last_index(final) == 9


def test_a_copy_that_cannot_be_put_in_place_fails_without_raising(setup, monkeypatch) -> None:
    _, writer, final = setup
    first_snapshot(writer, final)
    pysyncobj_serialize(writer, final, SECOND)
    wait_until(lambda: writer._thread is not None and not writer._thread.is_alive(), 10, "the copy")

    def no_rename(src: str, dst: str) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", no_rename)
    assert writer.state() == SERIALIZER_STATE.FAILED
    assert last_index(final) == 5
    monkeypatch.undo()
    pysyncobj_serialize(writer, final, THIRD)  # over the copy left behind
    assert finished(writer) == SERIALIZER_STATE.SUCCESS and last_index(final) == 13


def test_the_snapshot_size_is_read_at_most_once_a_second_once_there_is_one(setup, monkeypatch) -> None:
    """The compaction check asks at every tick; py-spy put a stat per tick at 0.4-1.2% of a busy tick thread."""
    _, writer, final = setup
    clock = [1000.0]
    monkeypatch.setattr("schedulerd.raft.snapshot_writer.time.monotonic", lambda: clock[0])
    assert writer.size_bytes() == 0
    final.write_bytes(b"x" * 10)
    assert writer.size_bytes() == 10, "no snapshot yet: every ask reads the file"
    final.write_bytes(b"x" * 20)
    clock[0] += 0.5
    assert writer.size_bytes() == 10
    clock[0] += 0.5
    assert writer.size_bytes() == 20
