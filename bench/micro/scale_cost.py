"""What a store's size costs one replica: apply per job and the leader's due scan,
in a store of --baseline-live far-future jobs and one of --live, in one process.

    python -m bench.micro.scale_cost [--live 1000000] [--baseline-live 10000] [--rounds 40] [--data-root DIR]

The two stores take turns, round by round (0 1 1 0 ...): each round runs the create,
claim, lease and ack entries of --jobs-per-round one-off jobs (bench.micro.apply_cost's
phases) on each, then times --scans due scans of each (the leader's scan over all
shards, as schedulerd/leader.py makes it every scan_interval_s). A shared box whose
speed drifts over minutes slows both stores alike, which the scale bench's steady runs,
minutes and a fill apart, could not promise."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from bench.micro.apply_cost import S, T0, Replica, fill, phases
from bench.common import alternation, uptime_line
from schedulerd.config import NodeConfig
from schedulerd.gctune import tune_gc
from schedulerd.limits import Limits
from schedulerd.storage import keys, queries

ROUND_SPACING_US = 120 * S  # each round's jobs are due after the previous round's


def scan_s(replica: Replica, now: int, scans: int) -> float:
    """Seconds per due scan of every shard up to now + lookahead_s, as the leader's (the
    round's jobs are acked by now and the rest are far-future: nothing is found)."""
    limit, until = Limits().scan_batch_max, now + int(NodeConfig.lookahead_s * S)
    started = time.perf_counter()
    for _ in range(scans):
        with replica.store.read() as txn:
            queries.due(txn, replica.store.tables, range(keys.SHARDS), until, limit)
    return (time.perf_counter() - started) / scans


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.micro.scale_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--live", type=int, default=1_000_000)
    p.add_argument("--baseline-live", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=40, help="rounds per store")
    p.add_argument("--jobs-per-round", type=int, default=2_000)
    p.add_argument("--scans", type=int, default=20, help="due scans timed per store per round")
    p.add_argument("--data-root", default=None, help="the stores go here (a real disk)")
    args = p.parse_args(argv)
    if args.live <= args.baseline_live or args.rounds < 1 or args.jobs_per_round < 1 or args.scans < 1:
        p.error("need --live > --baseline-live and --rounds, --jobs-per-round, --scans of at least 1")
    tune_gc()
    path = tempfile.mkdtemp(prefix="scale-cost-", dir=args.data_root)
    sizes = [args.baseline_live, args.live]
    print(f"bench.micro.scale_cost: {args.baseline_live:,} vs {args.live:,} live far-future jobs, {args.rounds} rounds "
          f"of {args.jobs_per_round:,} jobs each; store in {path}; {uptime_line()}")
    try:
        replicas = [Replica(os.path.join(path, f"live-{n}")) for n in sizes]
        for n, replica in zip(sizes, replicas):
            started = time.perf_counter()
            fill(replica, n)
            print(f"  filled {n:,} in {time.perf_counter() - started:.1f} s")
        spent: list[dict[str, float]] = [{}, {}]
        for k, which in enumerate(alternation(args.rounds)):
            t0 = T0 + (k + 1) * ROUND_SPACING_US
            for name, run in phases(replicas[which], args.jobs_per_round, 12 * S, f"r{k}", t0):
                started = time.perf_counter()
                run()
                spent[which][name] = spent[which].get(name, 0.0) + time.perf_counter() - started
            spent[which]["scan"] = spent[which].get("scan", 0.0) + scan_s(replicas[which], t0, args.scans)
        for replica in replicas:
            replica.store.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)
    jobs = args.rounds * args.jobs_per_round
    print(f"  {'':<14}{sizes[0]:>12,}{sizes[1]:>12,}   ratio")
    for name in ("create", "claim", "lease", "ack"):
        a, b = (s[name] * 1e6 / jobs for s in spent)
        print(f"  {name + ' µs/job':<14}{a:12.2f}{b:12.2f}   {b / a:.2f}x")
    a, b = (sum(v for n, v in s.items() if n != "scan") * 1e6 / jobs for s in spent)
    print(f"  {'apply µs/job':<14}{a:12.2f}{b:12.2f}   {b / a:.2f}x")
    a, b = (s["scan"] * 1e3 / args.rounds for s in spent)
    print(f"  {'due scan ms':<14}{a:12.3f}{b:12.3f}   {b / a:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
