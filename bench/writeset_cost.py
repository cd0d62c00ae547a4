"""What a follower would pay if it applied the leader's write sets instead of
re-running the state machine: the design docs/decisions.md weighs under
"Followers still re-run the state machine".

    python -m bench.writeset_cost [--jobs 20000] [--data-root DIR]

The phases of bench.apply_cost (one-off jobs created, leased and acked in the
daemon's batch sizes) are applied once on a "leader" store whose apply txn
records every put and delete; each entry's writes are packed as one write set
(msgpack `[[table, key, value or None], ...]`). A second, fresh store then
applies only those write sets, one commit per entry, as a follower would. For
each phase it prints the leader's apply (recording included), the follower's
write-set apply, and the bytes per job of the command entry and of its write
set: the journal and the network would carry both. The last two columns are
what pysyncobj's transport spends to send each (pickle and zlib), per follower,
on the leader. It ends by checking that the follower's store is byte for byte
the leader's."""
from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
import tempfile
import time
import zlib
from typing import Any

import lmdb

from bench.apply_cost import S, Replica, phases
from bench.common import BenchError, uptime_line
from schedulerd.config import NodeConfig
from schedulerd.gctune import tune_gc
from storage import codec, queries
from storage.db import DB_NAMES, LAST_APPLIED, Store, set_last_applied

Write = list[Any]  # [table number, key, value or None for a delete]
META = DB_NAMES.index("meta")


class RecordingTxn:
    """An apply txn that notes every put and delete. Cursors are the real txn's: the
    phases' commands carry no audit notes, so no cursor deletes (audit trimming)."""

    def __init__(self, txn: lmdb.Transaction, table_no: dict[Any, int], writes: list[Write]) -> None:
        self._txn, self._table_no, self._writes = txn, table_no, writes

    def get(self, key: bytes, default: Any = None, db: Any = None) -> Any:
        return self._txn.get(key, default, db=db)

    def cursor(self, db: Any = None) -> lmdb.Cursor:
        return self._txn.cursor(db=db)

    def stat(self, db: Any) -> dict[str, int]:
        return self._txn.stat(db)

    # py-lmdb's signatures: storage/records.py passes the options by position.
    def put(self, key: bytes, value: bytes, dupdata: bool = True, overwrite: bool = True, append: bool = False,
            db: Any = None) -> bool:
        stored = self._txn.put(key, value, dupdata, overwrite, append, db)
        if stored:
            self._writes.append([self._table_no[db], key, value])
        return stored

    def delete(self, key: bytes, value: bytes = b"", db: Any = None) -> bool:
        deleted = self._txn.delete(key, value, db)
        if deleted:
            self._writes.append([self._table_no[db], key, None])
        return deleted


class RecordingStore(Store):
    def __init__(self, path: str, group: int, map_bytes: int) -> None:
        super().__init__(path, group, map_bytes)
        self.writes: list[Write] = []
        self._table_no = {getattr(self.tables, name): i for i, name in enumerate(DB_NAMES)}

    def apply_txn(self) -> Any:
        return RecordingTxn(super().apply_txn(), self._table_no, self.writes)


class Follower:
    """Applies write sets only: a put or a delete per write, last_applied, one commit."""

    def __init__(self, path: str) -> None:
        self.store = Store(path, 0, 8 << 30)
        self.handles = [getattr(self.store.tables, name) for name in DB_NAMES]
        self.index = 0

    def apply(self, blob: bytes) -> None:
        self.index += 1
        txn = self.store.apply_txn()
        handles = self.handles
        for table, key, value in codec.unpack(blob):
            if value is None:
                txn.delete(key, db=handles[table])
            else:
                txn.put(key, value, db=handles[table])
        set_last_applied(txn, self.store.tables, self.index)
        self.store.commit_applied()


def send_s(blobs: list[bytes]) -> float:
    """Seconds to pickle and compress each blob as pysyncobj 0.3.17's TCP transport
    does every message (zlib level 3), once per follower: the leader's cost to send it."""
    started = time.perf_counter()
    for blob in blobs:
        zlib.compress(pickle.dumps(blob), 3)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.writeset_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--data-root", default=None, help="the stores go here (a real disk)")
    args = p.parse_args(argv)
    path = tempfile.mkdtemp(prefix="writeset-cost-", dir=args.data_root)
    tune_gc(NodeConfig.gc_young_objects)
    print(f"bench.writeset_cost: {args.jobs:,} one-off jobs, store in {path}; {uptime_line()}")
    print(f"  {'phase':<7} {'leader':>7} {'follower':>9} {'entry':>7} {'write set':>10} "
          f"{'send entry':>11} {'send write set':>15}")
    print(f"  {'':<7} {'µs/job':>7} {'µs/job':>9} {'B/job':>7} {'B/job':>10} {'µs/job':>11} {'µs/job':>15}")
    try:
        leader = Replica(os.path.join(path, "leader"), RecordingStore)
        recorded = leader.store
        assert isinstance(recorded, RecordingStore)
        follower = Follower(os.path.join(path, "follower"))
        for name, run in phases(leader, args.jobs, 12 * S):  # apply_cost's default claim-ahead
            entry_bytes, recorded.writes, leader.kept = leader.entry_bytes, [], []
            started = time.perf_counter()
            run()
            leader_s = time.perf_counter() - started
            # One write set per entry: fsm.apply's last write is last_applied.
            sets, current = [], []
            for write in recorded.writes:
                current.append(write)
                if write[0] == META and write[1] == LAST_APPLIED:
                    sets.append(codec.pack(current[:-1]))
                    current = []
            started = time.perf_counter()
            for blob in sets:
                follower.apply(blob)
            follower_s = time.perf_counter() - started
            per_job = 1e6 / args.jobs
            print(f"  {name:<7} {leader_s * per_job:7.1f} {follower_s * per_job:9.1f} "
                  f"{(leader.entry_bytes - entry_bytes) / args.jobs:7.1f} {sum(map(len, sets)) / args.jobs:10.1f} "
                  f"{send_s(leader.kept) * per_job:11.2f} {send_s(sets) * per_job:15.2f}")
        with leader.store.read() as a, follower.store.read() as b:
            same = queries.state_digest(a, leader.store.tables) == queries.state_digest(b, follower.store.tables)
        leader.store.close()
        follower.store.close()
        if not same:
            raise BenchError("the follower's store differs from the leader's: a write went unrecorded")
        print("  the follower's store is identical to the leader's (queries.state_digest)")
    finally:
        shutil.rmtree(path, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
