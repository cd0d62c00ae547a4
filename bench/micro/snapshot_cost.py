"""What one log-compaction snapshot of a big store costs its node: wall time, the
CPU (user and kernel) of `raft.snapshot.write`, and what it does to a journal's
fdatasync on the same disk while it runs.

    python -m bench.micro.snapshot_cost [--live 1000000] [--rounds 3] [--bytes-per-s N] [--stage-dir DIR] [--store DIR] [--data-root DIR]

The store holds --live far-future one-off jobs (bench.micro.apply_cost's fill), or is an
existing store directory given with --store (so two builds can take turns copying
the same one). Each round writes a snapshot into the same directory, paced as a
node's background copy is (--bytes-per-s, RaftConfig.snapshot_write_bytes_per_s; 0:
unpaced) and staged where it is (--stage-dir, raft/snapshot_writer.py's STAGE_DIR; '' for
none), times it and deletes it. CPU is this process's, every thread's, over the
write. Meanwhile a probe thread appends a 2 KB record to a file beside it and
fdatasyncs it every 3 ms, as a node's Raft journal does under load; it also runs
for --idle-s before the first round, for the disk's own figure."""
from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

from bench.common import percentile, uptime_line
from bench.micro.apply_cost import Replica, fill
from schedulerd.raft import snapshot
from schedulerd.raft.conf import RaftConfig
from schedulerd.raft.snapshot_writer import STAGE_DIR

# pysyncobj's (last applied entry, the one before it, cluster), as a compaction passes them.
ENTRIES = ((b"\x01", 2, 1), (b"\x01", 1, 1), ())  # no members: the copy is what is timed
PROBE_RECORD = b"r" * 2048
PROBE_PAUSE_S = 0.003


class JournalProbe:
    """fdatasync latencies of small appends to a file of its own, while it runs."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="journal-probe", daemon=True)
        self.sync_s: list[float] = []

    def _run(self) -> None:
        while not self._stop.is_set():
            os.write(self._fd, PROBE_RECORD)
            started = time.perf_counter()
            os.fdatasync(self._fd)
            self.sync_s.append(time.perf_counter() - started)
            time.sleep(PROBE_PAUSE_S)

    def __enter__(self) -> "JournalProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        os.close(self._fd)

    def summary(self) -> dict[str, float]:
        ordered = sorted(self.sync_s)
        return {"syncs": len(ordered), "sync_p50_ms": percentile(ordered, 50) * 1e3,
                "sync_p99_ms": percentile(ordered, 99) * 1e3, "sync_max_ms": ordered[-1] * 1e3 if ordered else math.nan}


def _cpu_s() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def time_write(replica: Replica, out: str, bytes_per_s: int, stage_dir: str | None) -> dict[str, float]:
    with JournalProbe(out + ".probe") as probe:
        user0, sys0 = _cpu_s()
        started = time.perf_counter()
        snapshot.write(replica.store, out, ENTRIES, bytes_per_s, stage_dir)
        wall = time.perf_counter() - started
        user1, sys1 = _cpu_s()
    size = os.path.getsize(out)
    os.remove(out)
    return {"wall_s": wall, "user_s": user1 - user0, "sys_s": sys1 - sys0, "bytes": size, **probe.summary()}


def idle_probe(path: str, seconds: float) -> dict[str, float]:
    with JournalProbe(path) as probe:
        time.sleep(seconds)
    return probe.summary()


def _probe_line(r: dict[str, float]) -> str:
    return (f"journal fdatasync p50 {r['sync_p50_ms']:.2f} / p99 {r['sync_p99_ms']:.2f} / "
            f"max {r['sync_max_ms']:.1f} ms ({r['syncs']:.0f})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.micro.snapshot_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--live", type=int, default=1_000_000, help="far-future jobs to fill a new store with")
    p.add_argument("--store", default=None, help="copy this existing store directory instead of filling one")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bytes-per-s", type=int, default=RaftConfig.snapshot_write_bytes_per_s,
                   help="pace of the copy (0: unpaced)")
    p.add_argument("--stage-dir", default=STAGE_DIR,
                   help="stage the copy here first, as a node does ('': through the pipe, no staging)")
    p.add_argument("--idle-s", type=float, default=3.0, help="the probe alone, before the first round")
    p.add_argument("--data-root", default=None, help="the store and the snapshots go here (a real disk)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.live < 1 or args.bytes_per_s < 0 or args.idle_s < 0:
        p.error("--rounds and --live must be at least 1, --bytes-per-s and --idle-s at least 0")
    path = tempfile.mkdtemp(prefix="snapshot-cost-", dir=args.data_root)
    pace = f"{args.bytes_per_s / 2**20:g} MiB/s" if args.bytes_per_s else "unpaced"
    pace += f", staged in {args.stage_dir}" if args.stage_dir else ", through the pipe"
    print(f"bench.micro.snapshot_cost: {args.store or f'{args.live:,} far-future jobs'}, {args.rounds} rounds, {pace}; "
          f"{uptime_line()}")
    try:
        replica = Replica(args.store or os.path.join(path, "lmdb"))
        if args.store is None:
            started = time.perf_counter()
            fill(replica, args.live)
            replica.store.commit_applied()
            print(f"  filled in {time.perf_counter() - started:.1f} s")
        out = os.path.join(path, "group-0.snapshot")
        idle = idle_probe(out + ".probe", args.idle_s) if args.idle_s else None
        rounds = [time_write(replica, out, args.bytes_per_s, args.stage_dir or None) for _ in range(args.rounds)]
        replica.store.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)
    if idle is not None:
        print(f"  no copy ({args.idle_s:g} s): {_probe_line(idle)}")
    for k, r in enumerate(rounds):
        print(f"  round {k}: {r['bytes'] / 2**20:,.0f} MiB in {r['wall_s']:.2f} s, "
              f"CPU user {r['user_s']:.2f} s + kernel {r['sys_s']:.2f} s; {_probe_line(r)}")
    median = {key: statistics.median(r[key] for r in rounds)
              for key in ("wall_s", "user_s", "sys_s", "sync_p50_ms", "sync_p99_ms")}
    print(f"  median: {median['wall_s']:.2f} s wall, {median['user_s'] + median['sys_s']:.2f} s CPU "
          f"(user {median['user_s']:.2f} + kernel {median['sys_s']:.2f}); journal fdatasync p50 "
          f"{median['sync_p50_ms']:.2f} / p99 {median['sync_p99_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
