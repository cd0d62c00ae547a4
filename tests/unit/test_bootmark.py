"""The store commits without fsync and is trusted again only within the same
boot or after a clean close: a store a machine crash may have torn is thrown
away before LMDB reads it (the node rebuilds from its snapshot and journal)."""
from __future__ import annotations

import logging
import pathlib

import pytest

from schedulerd.raft import bootmark
from schedulerd.raft.store import Store
from schedulerd.storage.tables import last_applied, set_last_applied


def applied_store(path: pathlib.Path, index: int) -> Store:
    store = Store(str(path), 0, 1 << 26)
    set_last_applied(store.apply_txn(), store.tables, index)
    store.commit_applied()
    return store


def crash(store: Store) -> None:
    """What kill -9 leaves: the environment gone, no sync, no clean mark."""
    store.abort_applied()
    store.env.close()


def boot(monkeypatch: pytest.MonkeyPatch, boot_id: str | None) -> None:
    monkeypatch.setattr(bootmark, "current_boot", lambda: boot_id)


def reopened(path: pathlib.Path) -> int:
    store = Store(str(path), 0, 1 << 26)
    try:
        with store.read() as txn:
            return last_applied(txn, store.tables)
    finally:
        store.close()


def test_commits_are_not_fsynced_when_the_kernel_gives_a_boot_id(tmp_path, monkeypatch) -> None:
    boot(monkeypatch, "boot-a")
    store = Store(str(tmp_path), 0, 1 << 26)
    assert store.env.flags()["sync"] is False
    assert (tmp_path / bootmark.MARKER).read_text() == "boot-a dirty\n"
    store.close()
    assert (tmp_path / bootmark.MARKER).read_text() == "boot-a clean\n"


def test_without_a_boot_id_every_commit_is_fsynced(tmp_path, monkeypatch) -> None:
    boot(monkeypatch, None)
    store = Store(str(tmp_path), 0, 1 << 26)
    assert store.env.flags()["sync"] is True
    store.close()
    assert not (tmp_path / bootmark.MARKER).exists()


def test_a_process_crash_keeps_the_store(tmp_path, monkeypatch) -> None:
    boot(monkeypatch, "boot-a")
    crash(applied_store(tmp_path, 42))
    assert reopened(tmp_path) == 42


def test_a_clean_close_keeps_the_store_across_a_reboot(tmp_path, monkeypatch) -> None:
    boot(monkeypatch, "boot-a")
    applied_store(tmp_path, 42).close()
    boot(monkeypatch, "boot-b")
    assert reopened(tmp_path) == 42


def test_a_machine_crash_discards_the_store_before_lmdb_reads_it(tmp_path, monkeypatch, caplog) -> None:
    boot(monkeypatch, "boot-a")
    crash(applied_store(tmp_path, 42))
    (tmp_path / "data.mdb").write_bytes(b"torn" * 4096)  # LMDB would refuse or fault on this
    boot(monkeypatch, "boot-b")
    with caplog.at_level(logging.WARNING, logger="schedulerd.store"):
        assert reopened(tmp_path) == 0
    assert "store_discarded" in caplog.text
    assert (tmp_path / bootmark.MARKER).read_text() == "boot-b clean\n"


def test_a_store_written_by_an_fsyncing_build_is_trusted(tmp_path, monkeypatch) -> None:
    boot(monkeypatch, None)
    crash(applied_store(tmp_path, 7))
    boot(monkeypatch, "boot-b")
    assert reopened(tmp_path) == 7
