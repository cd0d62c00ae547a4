"""One LMDB environment per Raft group: opened, swapped by a snapshot restore, closed.

Entries are applied into one write txn per Raft tick (`apply_txn`, storage/fsm.py),
committed by `commit_applied` before anyone learns a result. Commits are not fsynced
(raft/bootmark.py says why that is safe and what happens after a machine crash):
the Raft journal, fsynced before any ack, still holds every entry after the last
snapshot, and restart re-applies whatever is above the store's last_applied; a
store older than the snapshot is replaced by it."""
from __future__ import annotations

import logging
import os
import threading
import weakref
from contextlib import contextmanager
from typing import Iterator

import lmdb

from schedulerd.raft import bootmark
from schedulerd.raft.writeback import WritebackPacer
from schedulerd.storage import keys
from schedulerd.storage.tables import DB_NAMES, SCHEMA, SCHEMA_VERSION, Tables, last_applied

log = logging.getLogger("schedulerd.store")


class SchemaMismatch(Exception):
    """The data directory was written by an incompatible schema version."""


class Store:
    """An LMDB environment plus the lock that lets a snapshot restore swap it.

    Reads and the swap take the lock; apply runs in the Raft tick thread, the
    same thread that restores and commits, so it never races the swap."""

    def __init__(self, path: str, group: int, map_bytes: int, writeback_s: float = 0.0) -> None:
        """writeback_s: while commits are not synced, start the kernel writing the data
        file back this often (raft/writeback.py); 0 leaves it to the kernel."""
        self.path = path
        self.group = group
        self.map_bytes = map_bytes
        self._lock = threading.Lock()
        self._applying: lmdb.Transaction | None = None
        self._boot = bootmark.current_boot()
        self.env, self.tables = self._open()
        self._pacer: WritebackPacer | None = None
        if writeback_s > 0 and self._boot is not None:
            self._pacer = WritebackPacer(os.path.join(path, "data.mdb"), writeback_s)
            self._pacer.start()

    def _discard(self) -> None:
        """The machine went down while this store had unsynced commits: it may be torn."""
        for name in ("data.mdb", "lock.mdb"):
            path = os.path.join(self.path, name)
            if os.path.exists(path):
                os.remove(path)
        log.warning("store_discarded path=%s reason=machine_restarted_without_clean_close: "
                    "rebuilding from the snapshot and the Raft journal", self.path)

    def _open(self) -> tuple[lmdb.Environment, Tables]:
        os.makedirs(self.path, exist_ok=True)
        if self._boot is not None:
            if bootmark.torn_by_reboot(self.path, self._boot):
                self._discard()
            bootmark.mark(self.path, self._boot, clean=False)
        env = lmdb.open(self.path, map_size=self.map_bytes, max_dbs=len(DB_NAMES) + 1,
                        sync=self._boot is None, metasync=False, readahead=False)
        tables = Tables(**{name: env.open_db(name.encode()) for name in DB_NAMES})
        with env.begin(write=True) as txn:
            raw = txn.get(SCHEMA, db=tables.meta)
            if raw is None:
                txn.put(SCHEMA, keys.u64(SCHEMA_VERSION), db=tables.meta)
            elif keys.read_u64(raw) != SCHEMA_VERSION:
                env.close()
                raise SchemaMismatch(f"{self.path}: schema {keys.read_u64(raw)}, this build uses {SCHEMA_VERSION}")
        return env, tables

    @contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        """A read txn, handed out as a weak proxy. py-lmdb keeps a txn's reader slot until
        the Transaction object itself is freed, ended or not: a caller's frame kept alive
        by an exception (a traceback in a failed future, a cycle waiting for the collector)
        held its txn's slot, and polls failing by the hundred while a group had no leader
        used up all 126 (MDB_READERS_FULL). Only this frame holds the txn itself."""
        with self._lock:
            txn = self.env.begin()
            try:
                yield weakref.proxy(txn)
            finally:
                txn.abort()
                del txn

    def apply_txn(self) -> lmdb.Transaction:
        """The write txn this tick's entries apply in, opened on first use (Raft tick thread only)."""
        if self._applying is None:
            self._applying = self.env.begin(write=True)
        return self._applying

    def commit_applied(self) -> bool:
        """Commit what this tick applied (fsynced only where bootmark has no boot id); False if nothing."""
        txn, self._applying = self._applying, None
        if txn is None:
            return False
        txn.commit()
        return True

    def abort_applied(self) -> None:
        txn, self._applying = self._applying, None
        if txn is not None:
            txn.abort()

    def last_applied(self) -> int:
        with self.read() as txn:
            return last_applied(txn, self.tables)

    @contextmanager
    def swapping(self) -> Iterator[None]:
        """Close the environment for the body (which replaces its files), then reopen."""
        self.commit_applied()
        with self._lock:
            self.env.close()
            try:
                yield
            finally:
                self.env, self.tables = self._open()

    def close(self) -> None:
        if self._pacer is not None:
            self._pacer.stop()
        self.abort_applied()
        with self._lock:
            self.env.sync(True)
            self.env.close()
        if self._boot is not None:
            bootmark.mark(self.path, self._boot, clean=True)
