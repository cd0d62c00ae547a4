"""What applying one job's life costs on one replica, with no network: the
create, claim, lease and ack entries of N one-off jobs applied through
storage/fsm.py into a real LMDB store, one commit per entry (as one Raft tick
with one entry would), in the batch sizes the daemon uses under load. Each job is
created LEAD_US before it is due, so the create entry claims it (within
--claim-ahead-s, as the daemon's lookahead_s) and the claim phase finds nothing.

    python -m bench.micro.apply_cost [--jobs 20000] [--claim-ahead-s 0] [--live N] [--data-root DIR] [--profile 25]

--live N first fills the store with N one-off jobs due a year later (the scale
bench's far-future jobs), so the phases run against a store of that size.

Every replica pays this for every job, in its one tick thread: it bounds what
the cluster can dispatch per second however fast the network and fsync are."""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

from bench.common import BenchError, uptime_line
from schedulerd.config import NodeConfig
from schedulerd.gctune import tune_gc
from schedulerd.raft.store import Store
from schedulerd.storage import fsm, ops, queries
from schedulerd.storage.jobs import SPEC_DEFAULTS
from schedulerd.storage.ops import Op

S = 1_000_000
T0 = 1_800_000_000 * S
CREATE_BATCH, CLAIM_BATCH, LEASE_BATCH, ACK_BATCH = 100, 500, 100, 500
FINISHED_TTL_US = int(NodeConfig.finished_ttl_s * S)
LEAD_US = 5 * S  # each job is created this long before it is due (the steady bench's --lead-s)
GRACE_US = 5 * S


class Replica:
    def __init__(self, path: str, store: type[Store] = Store) -> None:
        self.store = store(path, 0, 8 << 30)
        self.index = 0
        self.entry_bytes = 0  # of every entry applied: what each replica's journal writes, besides framing
        self.kept: list[bytes] | None = None  # every entry applied, when a list is set here

    def apply(self, op: Op, payload: dict[str, Any]) -> dict[str, Any]:
        self.index += 1
        blob = ops.encode(op, payload)
        self.entry_bytes += len(blob)
        if self.kept is not None:
            self.kept.append(blob)
        _, result = fsm.apply(self.store, self.index, blob)
        self.store.commit_applied()
        return result


def fill(replica: Replica, live: int, prefix: str = "live") -> None:
    """live far-future one-offs, created in batches as the scale bench's fill makes them."""
    far = T0 + 365 * 86_400 * S
    for lo in range(0, live, CREATE_BATCH):
        specs = [dict(SPEC_DEFAULTS, job_id=f"{prefix}-{i:08d}", schedule={"kind": "at", "at_us": far},
                      schedule_spec={}, queue="bench", payload_json='{"n": 1}')
                 for i in range(lo, min(live, lo + CREATE_BATCH))]
        replica.apply(Op.CREATE_JOBS, {"now": T0, "jobs": specs, "grace_us": GRACE_US, "claim_ahead_us": 12 * S})


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def phases(replica: Replica, jobs: int, ahead_us: int, prefix: str = "bench",
           t0: int = T0) -> list[tuple[str, Callable[[], None]]]:
    ids = [f"{prefix}-{i:08d}" for i in range(jobs)]
    due = t0 + 60 * S
    run_ids: list[str] = []
    tasks: list[dict[str, Any]] = []

    def create() -> None:
        for batch in _chunks(ids, CREATE_BATCH):
            # The fields a request gives, as the API sends them (entry version 5), with the
            # node's --finished-ttl for every job of the entry (version 11).
            specs = [{"job_id": job_id, "schedule": {"kind": "at", "at_us": due}, "schedule_spec": {},
                      "queue": "bench", "payload_json": '{"n": 1}'} for job_id in batch]
            result = replica.apply(Op.CREATE_JOBS, {"now": due - LEAD_US, "jobs": specs, "grace_us": GRACE_US,
                                                    "claim_ahead_us": ahead_us, "finished_ttl_us": FINISHED_TTL_US})
            run_ids.extend(result["runs"])

    def claim() -> None:
        with replica.store.read() as txn:
            found = queries.due(txn, replica.store.tables, range(256), due, jobs)
        for batch in _chunks(found, CLAIM_BATCH):
            result = replica.apply(Op.CLAIM_BATCH, {"now": due - S // 2, "claims": [list(c) for c in batch]})
            run_ids.extend(result["runs"])

    def lease() -> None:
        for _ in range(0, len(run_ids), LEASE_BATCH):
            result = replica.apply(Op.LEASE_READY, {"now": due, "lease_until": due + 30 * S,
                                                    "grants": [["worker-1", ["bench"], LEASE_BATCH]]})
            tasks.extend(result["grants"][0][1])

    def ack() -> None:
        acked = 0
        for batch in _chunks(tasks, ACK_BATCH):
            result = replica.apply(Op.ACK, {"now": due + S, "worker_id": "worker-1",
                                            "acks": [[t["run_id"], t["fence"], None] for t in batch]})
            acked += sum(1 for r in result["results"] if r["ok"])
        if not len(run_ids) == len(tasks) == acked == jobs:
            raise BenchError(f"of {jobs} jobs: {len(run_ids)} claimed, {len(tasks)} leased, {acked} acked")

    return [("create", create), ("claim", claim), ("lease", lease), ("ack", ack)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.micro.apply_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--data-root", default=None, help="the store goes here (a real disk)")
    p.add_argument("--claim-ahead-s", type=float, default=12.0,
                   help="creates claim what is due within this (the daemon's lookahead_s); 0: the scan claims all")
    p.add_argument("--live", type=int, default=0, help="far-future jobs in the store before the phases run")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest functions")
    args = p.parse_args(argv)
    path = tempfile.mkdtemp(prefix="apply-cost-", dir=args.data_root)
    tune_gc()  # the collector as the daemon runs it
    profiler = cProfile.Profile() if args.profile else None
    print(f"bench.micro.apply_cost: {args.jobs:,} one-off jobs, one replica, store in {path}; {uptime_line()}")
    try:
        replica = Replica(os.path.join(path, "lmdb"))
        if args.live:
            started = time.perf_counter()
            fill(replica, args.live)
            print(f"  filled with {args.live:,} far-future jobs in {time.perf_counter() - started:.1f} s")
        total = 0.0
        for name, run in phases(replica, args.jobs, int(args.claim_ahead_s * S)):
            entry_bytes = replica.entry_bytes
            started = time.perf_counter()
            if profiler is not None:
                profiler.runcall(run)
            else:
                run()
            took = time.perf_counter() - started
            total += took
            print(f"  {name:<7} {took * 1e6 / args.jobs:7.1f} µs/job  "
                  f"{(replica.entry_bytes - entry_bytes) / args.jobs:6.1f} entry bytes/job")
        print(f"  {'total':<7} {total * 1e6 / args.jobs:7.1f} µs/job  ({args.jobs / total:,.0f} jobs/s on one core)")
        replica.store.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)
    if profiler is not None:
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
