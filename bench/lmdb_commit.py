"""What one LMDB write transaction costs on this disk, sync=True vs sync=False,
by transaction size: the entries of one Raft tick are one such transaction on the
pysyncobj tick thread of every node (storage/fsm.py; storage/db.py opens with
sync=False where the kernel gives a boot id, storage/bootmark.py).

    python -m bench.lmdb_commit [--data-root DIR] [--rounds 60] [--preload 50000]

Random 16-byte keys and 300-byte values spread over 5 named databases, each
preloaded with --preload keys so a transaction dirties many pages, as an apply does."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import lmdb

from bench.common import percentile, uptime_line

SIZES = (1, 20, 100, 500)
DBS = 5


def measure(root: str, sync: bool, rounds: int, preload: int) -> dict[int, tuple[float, float]]:
    path = tempfile.mkdtemp(prefix="lmdb-commit-", dir=root)
    try:
        env = lmdb.open(path, map_size=4 << 30, sync=sync, metasync=False, max_dbs=DBS + 1)
        dbs = [env.open_db(f"t{i}".encode()) for i in range(DBS)]
        with env.begin(write=True) as txn:
            for db in dbs:
                for _ in range(preload):
                    txn.put(os.urandom(16), os.urandom(200), db=db)
        out = {}
        for n in SIZES:
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                with env.begin(write=True) as txn:
                    for i in range(n):
                        txn.put(os.urandom(16), os.urandom(300), db=dbs[i % DBS])
                times.append(time.perf_counter() - t0)
            times.sort()
            out[n] = (percentile(times, 50), percentile(times, 90))
        env.close()
        return out
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lmdb_commit")
    p.add_argument("--data-root", default=tempfile.gettempdir())
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--preload", type=int, default=50_000)
    a = p.parse_args(argv)
    before = uptime_line()
    results = {sync: measure(a.data_root, sync, a.rounds, a.preload) for sync in (True, False)}
    print(f"uptime before: {before}\nuptime after:  {uptime_line()}\n")
    print("| puts per txn | sync=True p50 / p90 ms | sync=False p50 / p90 ms | p50 ratio |\n|---|---|---|---|")
    for n in SIZES:
        (a50, a90), (b50, b90) = results[True][n], results[False][n]
        print(f"| {n} | {a50 * 1e3:.2f} / {a90 * 1e3:.2f} | {b50 * 1e3:.2f} / {b90 * 1e3:.2f} | {a50 / b50:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
