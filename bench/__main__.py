"""`python -m bench SCENARIO [options]`: schedulerd (3 nodes on 127.0.0.1, fsync on)
side by side with APScheduler and Celery+Redis (`--peers apscheduler,celery`).

Scenarios: create, steady [--find-max], spike, recurring, scale, failover; retention
(schedulerd only: store size and lateness with --finished-ttl). Defaults are small so
a smoke run is quick; docs/performance.md has the sizes the targets are about. Every
process a scenario starts is stopped before it returns, and every run is bounded in
time. The micro-benchmarks are modules of their own: bench/README.md."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

from bench import profile, retention, scenarios, sd_scenarios, topology
from bench.common import WORKER_SLOTS, BenchError, uptime_line
from bench.scenarios import Options
from bench.sd import QueueLimits
from bench.speed import PROBE

NOT_DISK_FS = {"tmpfs", "ramfs"}


def _fs_type(path: str) -> str:
    best, fstype = "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            _, mount, kind, *_ = line.split()
            if os.path.realpath(path).startswith(mount) and len(mount) > len(best):
                best, fstype = mount, kind
    return fstype


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--peers", default="", help="comma list: apscheduler,celery (default: schedulerd only)")
    common.add_argument("--workers", type=int, default=4, help="schedulerd worker processes (the SDK)")
    common.add_argument("--worker-concurrency", type=int, default=WORKER_SLOTS, help="task slots per worker process")
    common.add_argument("--in-flight", type=int, default=64, help="concurrent create requests of the feeder")
    common.add_argument("--data-root", default=tempfile.gettempdir(), help="run dirs go here (a real disk)")
    common.add_argument("--keep", action="store_true", help="keep the run dir (logs, data, worker records)")
    common.add_argument("--json", help="write the raw results here")
    common.add_argument("--profile-s", type=float, default=0.0,
                        help="steady/spike/scale: py-spy the schedulerd leader for this many seconds")
    limited = argparse.ArgumentParser(add_help=False)
    limited.add_argument("--queue-max-running", type=int, metavar="N",
                         help="PUT this max_running on the jobs' queue before the creates (schedulerd only)")
    limited.add_argument("--queue-max-starts-per-s", type=float, metavar="R",
                         help="PUT this max_starts_per_s on the jobs' queue before the creates (schedulerd only)")
    sub = p.add_subparsers(dest="scenario", required=True)

    s = sub.add_parser("create", parents=[common], help="jobs accepted per second")
    s.add_argument("--count", type=int, default=2000, help="jobs created one per request")
    s.add_argument("--batch-count", type=int, default=20000, help="jobs created in batches of 100")
    s.add_argument("--concurrency", type=int, default=64, help="concurrent requests (batches: a eighth)")
    s.add_argument("--peer-threads", type=int, default=4, help="client threads of the peers")

    s = sub.add_parser("steady", parents=[common, limited], help="R one-off jobs/s due uniformly")
    s.add_argument("--rate", type=float, default=200.0, help="jobs due per second (--find-max: first rate)")
    s.add_argument("--duration", type=float, default=20.0, help="seconds of due times")
    s.add_argument("--lead-s", type=float, default=5.0, help="each job is created this long before it is due")
    s.add_argument("--drain-s", type=float, default=30.0, help="wait this long after the last due time")
    s.add_argument("--find-max", action="store_true", help="search the highest rate with p99 < 1 s")
    s.add_argument("--max-rate", type=float, default=20000.0)
    s.add_argument("--bisect-steps", type=int, default=3)
    s.add_argument("--fresh-per-step", action="store_true",
                   help="--find-max: run each step on a new system (default: all steps on one)")

    s = sub.add_parser("spike", parents=[common, limited], help="N jobs due at the same instant")
    s.add_argument("--jobs", type=int, default=5000)
    s.add_argument("--drain-s", type=float, default=120.0)

    s = sub.add_parser("recurring", parents=[common], help="K cron jobs on '* * * * *'")
    s.add_argument("--jobs", type=int, default=500)
    s.add_argument("--minutes", type=int, default=2)
    s.add_argument("--drain-s", type=float, default=50.0)

    s = sub.add_parser("scale", parents=[common], help="many live far-future jobs, then steady (schedulerd)")
    s.add_argument("--live", type=int, default=50_000)
    s.add_argument("--baseline-live", type=int, default=10_000)
    s.add_argument("--rate", type=float, default=200.0)
    s.add_argument("--duration", type=float, default=20.0)
    s.add_argument("--lead-s", type=float, default=5.0)
    s.add_argument("--drain-s", type=float, default=30.0)
    s.add_argument("--side-by-side", type=int, default=0, metavar="PAIRS",
                   help="two clusters up at once (baseline and live), PAIRS pairs of steady runs alternated "
                        "between them (default: one cluster, filled between its two runs)")

    s = sub.add_parser("failover", parents=[common], help="kill -9 the leader during a steady run (schedulerd)")
    s.add_argument("--rate", type=float, default=200.0)
    s.add_argument("--duration", type=float, default=20.0)
    s.add_argument("--kill-after-s", type=float, default=8.0, help="seconds after the first due time")
    s.add_argument("--lead-s", type=float, default=5.0)
    s.add_argument("--drain-s", type=float, default=30.0)

    s = sub.add_parser("topology", parents=[common],
                       help="nodes join a 3-node cluster under steady load: time to balance, lateness (schedulerd)")
    s.add_argument("--rate", type=float, default=2000.0, help="jobs due per second")
    s.add_argument("--duration", type=float, default=90.0, help="seconds of due times")
    s.add_argument("--groups", type=int, default=6, help="the cluster's --groups")
    s.add_argument("--join", type=int, default=2, help="nodes that join")
    s.add_argument("--join-after", type=float, default=10.0, help="seconds after the first due time")
    s.add_argument("--cost", action="store_true",
                   help="instead: the same load on 3 nodes x G groups and 6 nodes x 2G, CPU per node per job")
    s.add_argument("--heal", action="store_true",
                   help="instead: 5 nodes hold --live jobs, one is killed for good --kill-after s into the run")
    s.add_argument("--live", type=int, default=1_000_000, help="--heal: far-future jobs created first")
    s.add_argument("--kill-after", type=float, default=15.0, help="--heal: seconds after the first due time")
    s.add_argument("--dead-after", type=float, default=20.0, help="--heal: the nodes' --dead-node-timeout (s)")
    s.add_argument("--lead-s", type=float, default=5.0)
    s.add_argument("--drain-s", type=float, default=60.0)

    s = sub.add_parser("retention", parents=[common],
                       help="steady one-off jobs on nodes with --finished-ttl: store size, RSS, lateness (schedulerd)")
    s.add_argument("--rate", type=float, default=2000.0, help="jobs due per second")
    s.add_argument("--duration", type=float, default=600.0, help="seconds of due times")
    s.add_argument("--finished-ttl", default="60s", metavar="DURATION",
                   help="the nodes' --finished-ttl (e.g. 60s, 5m; 0: never delete)")
    s.add_argument("--sample-s", type=float, default=30.0, help="sample every node this often")
    s.add_argument("--tail-s", type=float, default=60.0,
                   help="go on sampling this long after the run (last ack or drain deadline), with no load")
    s.add_argument("--compare", action="store_true",
                   help="then the same on a fresh cluster with --finished-ttl 0, side by side")
    s.add_argument("--lead-s", type=float, default=5.0, help="each job is created this long before it is due")
    s.add_argument("--drain-s", type=float, default=30.0, help="wait this long after the last due time")
    s.add_argument("--backlog-s", type=float, default=0.0,
                   help="the jobs due in the first this many seconds all expire at once, one TTL after the last "
                        "of them: a sweep of a backlog beside the steady load")
    s.add_argument("--limit", action="append", default=[], metavar="NAME=VALUE",
                   help="the nodes' --limit (repeatable), e.g. sweep_batch_max=25")
    return p.parse_args(argv)


def queue_limits(a: argparse.Namespace) -> QueueLimits | None:
    """steady's and spike's --queue-max-*, None when neither is given. Refused with peers:
    they have no such limit, and would run another workload than schedulerd."""
    limits = QueueLimits(a.queue_max_running, a.queue_max_starts_per_s)
    if limits == QueueLimits():
        return None
    if a.peers:
        raise BenchError("--queue-max-running and --queue-max-starts-per-s limit schedulerd's queue only; "
                         "run them without --peers")
    return limits


def run(a: argparse.Namespace, opts: Options) -> scenarios.Report:
    if a.scenario == "create":
        return scenarios.create(opts, a.count, a.batch_count, a.concurrency, a.peer_threads)
    if a.scenario == "steady" and a.find_max:
        return scenarios.find_max(opts, a.rate, a.max_rate, a.duration, a.lead_s, a.drain_s, a.bisect_steps,
                                  a.fresh_per_step, queue_limits(a))
    if a.scenario == "steady":
        return scenarios.steady(opts, a.rate, a.duration, a.lead_s, a.drain_s, queue_limits(a))
    if a.scenario == "spike":
        return scenarios.spike(opts, a.jobs, a.drain_s, queue_limits(a))
    if a.scenario == "recurring":
        return scenarios.recurring(opts, a.jobs, a.minutes, a.drain_s)
    if a.scenario == "scale" and a.side_by_side:
        return sd_scenarios.scale_side_by_side(opts, a.live, a.baseline_live, a.rate, a.duration, a.lead_s,
                                               a.drain_s, a.side_by_side)
    if a.scenario == "scale":
        return sd_scenarios.scale(opts, a.live, a.baseline_live, a.rate, a.duration, a.lead_s, a.drain_s)
    if a.scenario == "topology" and a.heal:
        return topology.heal(opts, a.live, a.rate, a.duration, a.groups, a.kill_after, a.dead_after, a.lead_s,
                             a.drain_s)
    if a.scenario == "topology" and a.cost:
        return topology.cost(opts, a.rate, a.duration, a.groups, a.lead_s, a.drain_s)
    if a.scenario == "topology":
        return topology.grow(opts, a.rate, a.duration, a.groups, a.join, a.join_after, a.lead_s, a.drain_s)
    if a.scenario == "retention":
        return retention.retention(opts, a.finished_ttl, a.rate, a.duration, a.lead_s, a.drain_s, a.sample_s,
                                   a.tail_s, a.compare, a.backlog_s, tuple(a.limit))
    return sd_scenarios.failover(opts, a.rate, a.duration, a.kill_after_s, a.lead_s, a.drain_s)


def _profiles(report: scenarios.Report) -> str:
    infos: dict[str, Any] = report.raw.get("infos") or {}
    if "info" in report.raw:
        infos = {"schedulerd": report.raw["info"]}
    out = [f"### py-spy, schedulerd leader ({name})\n\n{profile.render(i['profile'])}"
           for name, i in infos.items() if isinstance(i, dict) and "tick_phases" in i.get("profile", {})]
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    # SIGTERM (timeout, kill) unwinds through the scenarios' finally blocks like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    peers = [p.strip() for p in a.peers.split(",") if p.strip()]
    if _fs_type(a.data_root) in NOT_DISK_FS:
        print(f"error: {a.data_root} is tmpfs: fsync is free there; pass --data-root on a disk", file=sys.stderr)
        return 2
    run_dir = tempfile.mkdtemp(prefix=f"bench-{a.scenario}-", dir=a.data_root)
    opts = Options(run_dir, peers, a.workers, a.worker_concurrency, a.in_flight, a.profile_s)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    before = uptime_line()
    print(f"bench {a.scenario}: run dir {run_dir}; nproc {os.cpu_count()}; started {started}", file=sys.stderr)
    print(f"uptime before: {before}", file=sys.stderr)
    PROBE.start()
    try:
        report = run(a, opts)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        PROBE.stop()
        if not a.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    after = uptime_line()
    print(f"command: python -m bench {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"started {started}; nproc {os.cpu_count()}\nuptime before: {before}\nuptime after:  {after}\n")
    print(report.render())
    for line in report.raw.get("uptime", []):
        print(f"  uptime {line}")
    prof = _profiles(report)
    if prof:
        print("\n" + prof)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"scenario": a.scenario, "args": vars(a), "started": started, "uptime_before": before,
                       "uptime_after": after, "report": report.raw, "rows": [r.__dict__ for r in report.rows],
                       "notes": report.notes}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
