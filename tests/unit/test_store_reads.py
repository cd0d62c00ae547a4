"""raft/store.py's read txns: a caller's frame that outlives its read (kept by an exception's
traceback, by a reference cycle) does not keep the txn's LMDB reader slot."""
from __future__ import annotations

import pathlib

import pytest

from schedulerd.raft.store import Store

READER_SLOTS = 126  # LMDB's default max_readers, as Store opens its env


def test_reads_whose_frames_outlive_them_keep_no_reader_slot(tmp_path: pathlib.Path) -> None:
    store = Store(str(tmp_path / "store"), 0, 1 << 26)

    def read_then_fail() -> None:
        with store.read() as txn:
            txn.get(b"anything")
        raise RuntimeError("a proposal failed after the read")

    def fail_inside_the_read() -> None:
        with store.read() as txn:
            txn.get(b"anything")
            raise RuntimeError("failed mid-read")

    kept = []
    for _ in range(2 * READER_SLOTS):
        for failing in (read_then_fail, fail_inside_the_read):
            with pytest.raises(RuntimeError) as failed:
                failing()
            kept.append(failed.value)  # each holds its traceback, and so the frames
    with store.read() as txn:
        assert txn.get(b"anything") is None
    with store.read() as txn:
        leaked = txn
    with pytest.raises(ReferenceError):  # the txn is gone with its read
        leaked.get(b"anything")
    store.close()
