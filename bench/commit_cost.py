"""What an LMDB commit costs a replica that applies one small entry per Raft tick, as
a follower does at a few hundred jobs per second: the bytes it leaves for writeback
and the CPU, per entry, with one commit per entry and with --per-commit entries per
commit (docs/decisions.md, "A snapshot copy is staged in memory", weighs both).

    python -m bench.commit_cost [--live 1000000] [--pool-jobs 50000] [--entries 5000] [--per-commit 10]

The store is first filled with --live far-future jobs, then --pool-jobs more are
created while a read txn stays open, as a paced snapshot copy holds one for seconds:
LMDB cannot reuse the pages those writes free until the reader ends, so afterwards
they sit on its free list, and it hands out the oldest free pages first. Each of
--entries one-job create entries is then applied; before each way of committing the
data file is fdatasynced, and after it cachestat(2) (Linux >= 6.5) reads how many
bytes of it are dirty. The two ways take turns on one store, --rounds times each."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from bench.apply_cost import GRACE_US, S, T0, Replica, fill
from bench.common import BenchError, alternation, uptime_line
from schedulerd.config import NodeConfig
from schedulerd.gctune import tune_gc
from storage import fsm, ops
from storage.ops import Op
from storage.writeback import file_dirty_bytes

def grow_free_list(replica: Replica, jobs: int) -> None:
    """Create jobs while a read txn is open: the pages they free stay on LMDB's free list."""
    reader = replica.store.env.begin()
    try:
        fill(replica, jobs, prefix="pool")
    finally:
        reader.abort()


def apply_one_per_entry(replica: Replica, prefix: str, entries: int, per_commit: int) -> tuple[float, float]:
    """(dirty bytes, CPU seconds) of entries one-job creates, committed every per_commit."""
    data = os.path.join(replica.store.path, "data.mdb")
    fd = os.open(data, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)
    due = T0 + 100 * S
    started = time.process_time()
    for i in range(entries):
        spec = {"job_id": f"{prefix}-{i:08d}", "schedule": {"kind": "at", "at_us": due + i * 3_000},
                "schedule_spec": {}, "queue": "bench", "payload_json": '{"n": 1}'}
        replica.index += 1
        fsm.apply(replica.store, replica.index, ops.encode(Op.CREATE_JOBS, {
            "now": due - 5 * S, "jobs": [spec], "grace_us": GRACE_US, "claim_ahead_us": 12 * S}))
        if (i + 1) % per_commit == 0:
            replica.store.commit_applied()
    replica.store.commit_applied()
    cpu_s = time.process_time() - started
    dirty = file_dirty_bytes(data)
    if dirty is None:
        raise BenchError("cachestat(2) is not available here (Linux >= 6.5): no dirty-byte figure")
    return dirty, cpu_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.commit_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--live", type=int, default=1_000_000)
    p.add_argument("--pool-jobs", type=int, default=50_000, help="jobs created while a reader is held")
    p.add_argument("--entries", type=int, default=5_000, help="one-job entries per way of committing per round")
    p.add_argument("--per-commit", type=int, default=10, help="entries per commit, the way compared with 1")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--data-root", default=None, help="the store goes here (a real disk)")
    args = p.parse_args(argv)
    if min(args.entries, args.per_commit, args.rounds) < 1 or min(args.live, args.pool_jobs) < 0:
        p.error("--entries, --per-commit and --rounds must be at least 1; --live and --pool-jobs at least 0")
    tune_gc(NodeConfig.gc_young_objects)
    path = tempfile.mkdtemp(prefix="commit-cost-", dir=args.data_root)
    ways = [1, args.per_commit]
    totals = [[0.0, 0.0], [0.0, 0.0]]
    print(f"bench.commit_cost: {args.live:,} live jobs, a free list left by {args.pool_jobs:,} more, "
          f"{args.entries:,} one-job entries per way per round; store in {path}; {uptime_line()}")
    try:
        replica = Replica(os.path.join(path, "lmdb"))
        fill(replica, args.live)
        grow_free_list(replica, args.pool_jobs)
        for k, which in enumerate(alternation(args.rounds)):
            dirty, cpu_s = apply_one_per_entry(replica, f"r{k}", args.entries, ways[which])
            totals[which][0] += dirty
            totals[which][1] += cpu_s
        replica.store.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)
    entries = args.rounds * args.entries
    for per, (dirty, cpu_s) in zip(ways, totals):
        print(f"  {per:>4} per commit: {dirty / entries / 1024:7.1f} KiB dirty per entry, "
              f"{cpu_s * 1e6 / entries:6.1f} µs CPU per entry")
    return 0


if __name__ == "__main__":
    sys.exit(main())
