"""The store's writeback pacer (storage/writeback.py): it gets a file's dirty pages
written without waiting for the kernel's 30 s, it keeps going on its period, and it runs
only where commits are not synced."""
from __future__ import annotations

import os
import pathlib

import pytest

from raft.conf import RaftConfig
from storage import bootmark, writeback
from storage.db import Store
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


def test_the_pacer_asks_every_period_until_stopped(tmp_path: pathlib.Path) -> None:
    (tmp_path / "data.mdb").write_bytes(b"x" * 4096)
    pacer = writeback.WritebackPacer(str(tmp_path / "data.mdb"), 0.02, 0)
    pacer.start()
    wait_until(lambda: pacer.rounds >= 3, 10, "three rounds of the pacer")
    pacer.stop()
    stopped_at = pacer.rounds
    assert not pacer._thread.is_alive() and pacer.rounds == stopped_at


def test_the_pacer_leaves_a_box_with_little_dirty_to_the_kernel(tmp_path: pathlib.Path) -> None:
    """At a low rate, pacing would only write the store's hot pages more often."""
    (tmp_path / "data.mdb").write_bytes(b"x" * 4096)
    pacer = writeback.WritebackPacer(str(tmp_path / "data.mdb"), 0.02, 1 << 50)
    pacer.start()
    wait_until(lambda: pacer.checks >= 3, 10, "three checks of the pacer")
    pacer.stop()
    assert pacer.rounds == 0


def test_a_store_paces_only_unsynced_commits(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bootmark, "current_boot", lambda: "boot-a")
    unsynced = Store(str(tmp_path / "a"), 0, 1 << 26, writeback_s=0.02)
    assert unsynced._pacer is not None
    wait_until(lambda: unsynced._pacer.rounds >= 2, 10, "the store's pacer to run")
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


def test_a_negative_dirty_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="lmdb_writeback_dirty_min_bytes must be 0"):
        RaftConfig(self_addr="127.0.0.1:7000", data_dir="/tmp/x", lmdb_writeback_dirty_min_bytes=-1).validate()
