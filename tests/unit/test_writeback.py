"""The store's writeback pacer (raft/writeback.py): it gets a file's dirty pages
written without waiting for the kernel's 30 s, it keeps going on its period, it paces
only a file that dirties fast, and it runs only where commits are not synced."""
from __future__ import annotations

import itertools
import os
import pathlib

import pytest

from schedulerd.raft import bootmark, writeback
from schedulerd.raft.conf import RaftConfig
from schedulerd.raft.store import Store
from tests.integration.harness import wait_until

pytestmark = pytest.mark.skipif(writeback._sync_file_range is None, reason="no sync_file_range (not Linux)")


def test_a_files_dirty_pages_are_written_back_when_asked(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "data.mdb"
    before = writeback.dirty_bytes()
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20) * 64)  # 64 MiB, not synced
    dirtied = writeback.dirty_bytes()
    if dirtied - before < 32 << 20:
        pytest.skip("this file system does not leave written pages dirty (tmpfs?)")
    assert writeback.start_writeback(str(path))
    wait_until(lambda: writeback.dirty_bytes() < dirtied - (32 << 20), 20, "the file's pages to be written back")


def test_a_missing_file_is_not_an_error(tmp_path: pathlib.Path) -> None:
    """A snapshot restore replaces the data file: for a moment there is none."""
    assert writeback.start_writeback(str(tmp_path / "gone.mdb")) is False


def test_a_files_own_dirty_bytes_are_read(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "data.mdb"
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20) * 8)
        dirty = writeback.file_dirty_bytes(str(path))
        if dirty is None:
            pytest.skip("no cachestat(2) here (Linux < 6.5)")
        if dirty == 0:
            pytest.skip("this file system does not leave written pages dirty (tmpfs?)")
        assert dirty >= 7 << 20
        f.flush()
        os.fsync(f.fileno())
    assert writeback.file_dirty_bytes(str(path)) == 0
    assert writeback.file_dirty_bytes(str(tmp_path / "gone.mdb")) is None


def test_the_pacer_asks_every_period_until_stopped(tmp_path: pathlib.Path) -> None:
    (tmp_path / "data.mdb").write_bytes(b"x" * 4096)
    pacer = writeback.WritebackPacer(str(tmp_path / "data.mdb"), 0.02, 0, 0)
    pacer.start()
    wait_until(lambda: pacer.rounds >= 3, 10, "three rounds of the pacer")
    pacer.stop()
    stopped_at = pacer.rounds
    assert not pacer._thread.is_alive() and pacer.rounds == stopped_at


def _run_rounds(pacer: writeback.WritebackPacer, rounds: int) -> None:
    pacer.start()
    wait_until(lambda: pacer.checks >= rounds, 10, f"{rounds} checks of the pacer")
    pacer.stop()


def test_the_pacer_paces_only_rounds_in_which_the_file_dirtied_enough(tmp_path: pathlib.Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """At a low rate, pacing would only write the store's hot pages more often. The file is
    read before the first round, at each round, and again after each round's call."""
    mib = 1 << 20
    readings = iter([0, 20 * mib, 0, 5 * mib, 30 * mib, 0, 2 * mib])
    monkeypatch.setattr(writeback, "file_dirty_bytes", lambda path: next(readings, 0))
    monkeypatch.setattr(writeback, "dirty_bytes", lambda: pytest.fail("the box's total is only a fallback"))
    asked: list[int] = []
    monkeypatch.setattr(writeback, "start_writeback", lambda path: asked.append(1) or True)
    pacer = writeback.WritebackPacer(str(tmp_path / "data.mdb"), 0.01, 16 * mib, 64 * mib)
    _run_rounds(pacer, 4)
    # grew 20 MiB: paced; 5: not; 25 (from 5 to 30): paced; 2: not
    assert pacer.checks >= 4 and pacer.rounds == 2 and len(asked) == 2


def test_where_a_files_dirty_bytes_are_unknown_the_pacer_reads_the_boxs(tmp_path: pathlib.Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data.mdb").write_bytes(b"x" * 4096)
    monkeypatch.setattr(writeback, "file_dirty_bytes", lambda path: None)
    box = itertools.cycle([1 << 20, 100 << 20])
    monkeypatch.setattr(writeback, "dirty_bytes", lambda: next(box))
    pacer = writeback.WritebackPacer(str(tmp_path / "data.mdb"), 0.01, 16 << 20, 64 << 20)
    _run_rounds(pacer, 4)
    assert pacer.rounds == pacer.checks // 2


def test_a_store_paces_only_unsynced_commits(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bootmark, "current_boot", lambda: "boot-a")
    unsynced = Store(str(tmp_path / "a"), 0, 1 << 26, writeback_s=0.02)
    assert unsynced._pacer is not None
    wait_until(lambda: unsynced._pacer.checks >= 2, 10, "the store's pacer to run")
    unsynced.close()
    assert not unsynced._pacer._thread.is_alive()

    monkeypatch.setattr(bootmark, "current_boot", lambda: None)  # every commit is fsynced
    synced = Store(str(tmp_path / "b"), 0, 1 << 26, writeback_s=0.02)
    assert synced._pacer is None
    synced.close()


@pytest.mark.parametrize("period", [0.5, 61.0, -1.0])
def test_a_writeback_period_out_of_range_is_refused(period: float) -> None:
    with pytest.raises(ValueError, match=r"lmdb_writeback_s must be 0 \(the kernel's own writeback\) or within 1..60"):
        RaftConfig(self_addr="127.0.0.1:7000", data_dir="/tmp/x", lmdb_writeback_s=period).validate()
    RaftConfig(self_addr="127.0.0.1:7000", data_dir="/tmp/x", lmdb_writeback_s=0).validate()
