"""What making the Raft journal durable costs: DurableJournal vs pysyncobj's FileJournal.

    python -m bench.raft_fsync                      # ~2 min: 2 variants x 2 rounds
    python -m bench.raft_fsync --rounds 1 --duration-s 5 --json out.json

Each cluster is 3 processes on 127.0.0.1 (multiprocessing 'spawn'), each hosting
one raft.group.Group (one SyncObj + one LMDB store) with its data in a fresh
temp dir under --data-root. The leader's process runs the workloads in order,
each for --warmup-s then --duration-s:
    (a) 1 caller, one CREATE_JOBS command of 1 job at a time, awaiting each
    (b) --in-flight callers doing the same (that many proposals in flight)
    (c) 1 caller, --batch-jobs jobs per command
Variants run interleaved (durable, nofsync, durable, nofsync, ...) so a load
change on the machine hits both; a ratio is durable / nofsync within a round.
See bench/raft_node.py for the variants and the node side.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from bench import raft_node

DURATION_S_MAX = 30.0
WARMUP_S_MAX = 10.0
ROUNDS_MAX = 3
IN_FLIGHT_MAX = 1024
BATCH_JOBS_MAX = 500  # 100 jobs encode to ~16 KB; stay well under pysyncobj's 64 KiB chunking
BUDGET_S_MAX = 200.0  # refuse settings whose estimated run time exceeds this
STARTUP_S_MAX = 30.0  # spawn + imports + first election
STARTUP_S_ESTIMATE = 6.0
STOP_S_MAX = 15.0
VARIANTS = ("durable", "nofsync", "durable-nohook")
NOT_MEMORY_FS = {"tmpfs", "ramfs"}


class BenchError(Exception):
    """The cluster did not behave well enough to measure."""


@dataclass(frozen=True)
class Settings:
    duration_s: float
    warmup_s: float
    rounds: int
    variants: tuple[str, ...]
    in_flight: int
    batch_jobs: int
    data_root: str
    workload_names: tuple[str, ...] = ("a", "b", "c")

    def workloads(self) -> list[tuple[str, int, int]]:
        every = {"a": (1, 1), "b": (self.in_flight, 1), "c": (1, self.batch_jobs)}
        return [(name, *every[name]) for name in self.workload_names]

    def cluster_s_estimate(self) -> float:
        return STARTUP_S_ESTIMATE + len(self.workloads()) * (self.warmup_s + self.duration_s + 1.0)

    def validate(self) -> None:
        if not 1.0 <= self.duration_s <= DURATION_S_MAX:
            raise BenchError(f"--duration-s must be 1..{DURATION_S_MAX}")
        if not 0.0 <= self.warmup_s <= WARMUP_S_MAX:
            raise BenchError(f"--warmup-s must be 0..{WARMUP_S_MAX}")
        if not 1 <= self.rounds <= ROUNDS_MAX:
            raise BenchError(f"--rounds must be 1..{ROUNDS_MAX}")
        if not self.workload_names or not set(self.workload_names) <= {"a", "b", "c"}:
            raise BenchError("--workloads must be a comma list of a, b, c")
        if not self.variants or not set(self.variants) <= set(VARIANTS):
            raise BenchError(f"--variants must be a comma list of {', '.join(VARIANTS)}")
        if not 1 <= self.in_flight <= IN_FLIGHT_MAX or not 1 <= self.batch_jobs <= BATCH_JOBS_MAX:
            raise BenchError(f"--in-flight must be 1..{IN_FLIGHT_MAX}, --batch-jobs 1..{BATCH_JOBS_MAX}")
        total_s = self.rounds * len(self.variants) * self.cluster_s_estimate()
        if total_s > BUDGET_S_MAX:
            raise BenchError(f"estimated {total_s:.0f} s exceeds the {BUDGET_S_MAX:.0f} s budget; "
                             "lower --duration-s, --rounds or --variants")


def filesystem_of(path: str) -> tuple[str, str, str]:
    """(device, fstype, mount point) of the mount holding `path`, from /proc/mounts."""
    real = os.path.realpath(path)
    best = ("?", "?", "")
    with open("/proc/mounts") as f:
        for line in f:
            device, mount, fstype = line.split()[:3]
            inside = real == mount or real.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best[2]):
                best = (device, fstype, mount)
    return best


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / hz, sum(fields) / hz


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _rpc(conn: Connection, proc: BaseProcess, message: tuple[Any, ...], timeout_s: float) -> Any:
    conn.send(message)
    if not conn.poll(timeout_s):
        raise BenchError(f"node pid {proc.pid} did not answer {message[0]!r} within {timeout_s:.0f} s "
                         f"(alive={proc.is_alive()})")
    try:
        return conn.recv()
    except EOFError:
        raise BenchError(f"node pid {proc.pid} exited (code {proc.exitcode}) during {message[0]!r}") from None


def _wait_for_leader(nodes: list[tuple[BaseProcess, Connection]]) -> int:
    deadline = time.monotonic() + STARTUP_S_MAX
    while time.monotonic() < deadline:
        for proc, _ in nodes:
            if not proc.is_alive():
                raise BenchError(f"node pid {proc.pid} exited with code {proc.exitcode} during start-up")
        statuses = [_rpc(conn, proc, ("status",), STARTUP_S_MAX) for proc, conn in nodes]
        leaders = [i for i, s in enumerate(statuses) if s["leader"]]
        if len(leaders) == 1 and all(s["ready"] for s in statuses) and statuses[leaders[0]]["has_quorum"]:
            return leaders[0]
        time.sleep(0.1)
    raise BenchError(f"no single ready leader within {STARTUP_S_MAX:.0f} s")


def run_cluster(variant: str, round_no: int, settings: Settings) -> dict[str, Any]:
    """Start 3 nodes, run the workloads on the leader, stop the nodes; returns the results."""
    ctx = multiprocessing.get_context("spawn")
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    data_dir = tempfile.mkdtemp(prefix=f"raft-fsync-{variant}-", dir=settings.data_root)
    lifetime_s = STARTUP_S_MAX + settings.cluster_s_estimate() * 2 + 60
    nodes: list[tuple[BaseProcess, Connection]] = []
    busy0_s, wall0_s, own0 = machine_cpu_s()[0], time.monotonic(), os.times()
    try:
        for i in range(3):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=raft_node.node_main, daemon=True, name=f"raft-fsync-node{i}",
                               args=(variant, addrs, i, os.path.join(data_dir, f"n{i}"), child_end, lifetime_s))
            proc.start()
            child_end.close()
            nodes.append((proc, parent_end))
        started = time.monotonic()
        leader = _wait_for_leader(nodes)
        startup_s = time.monotonic() - started
        workloads = [_run_workload(nodes, leader, w, variant, round_no, settings) for w in settings.workloads()]
        node_totals = [_rpc(conn, proc, ("stop",), STOP_S_MAX) for proc, conn in nodes]
        _stop(nodes)
        own1 = os.times()
        ours_s = sum(n["cpu_s"] for n in node_totals) + own1.user + own1.system - own0.user - own0.system
        others_cores = (machine_cpu_s()[0] - busy0_s - ours_s) / (time.monotonic() - wall0_s)
        return {"others_cores": others_cores,"variant": variant, "round": round_no, "leader": leader, "startup_s": startup_s,
                "workloads": workloads, "node_totals": node_totals}
    finally:
        _stop(nodes)
        shutil.rmtree(data_dir, ignore_errors=True)


def _run_workload(nodes: list[tuple[BaseProcess, Connection]], leader: int, workload: tuple[str, int, int],
                  variant: str, round_no: int, settings: Settings) -> dict[str, Any]:
    """One workload on the leader, with every node's counters before and after it
    (so the per-node deltas include the warm-up)."""
    params = {"workload": workload, "duration_s": settings.duration_s, "warmup_s": settings.warmup_s,
              "tag": f"{variant}-r{round_no}"}
    before = [_rpc(conn, proc, ("counters",), STOP_S_MAX) for proc, conn in nodes]
    started = time.monotonic()
    timeout_s = settings.warmup_s + settings.duration_s + raft_node.PROPOSE_TIMEOUT_S + 30
    result = _rpc(nodes[leader][1], nodes[leader][0], ("run", params), timeout_s)
    elapsed_s = time.monotonic() - started
    after = [_rpc(conn, proc, ("counters",), STOP_S_MAX) for proc, conn in nodes]
    result["elapsed_s"] = elapsed_s
    result["nodes"] = [_delta(b, a) for b, a in zip(before, after)]
    return result


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    f0, f1 = before["journal_fsync"], after["journal_fsync"]
    fsync = None if f1 is None else {"count": f1["count"] - f0["count"],
                                     "time_s_total": f1["time_s_total"] - f0["time_s_total"]}
    trunc = {k: after["truncations"][k] - before["truncations"][k] for k in after["truncations"]}
    return {"fsync": fsync, "truncations": trunc}


def _stop(nodes: list[tuple[BaseProcess, Connection]]) -> None:
    """Only the processes this run started, by their handles."""
    for proc, conn in nodes:
        proc.join(STOP_S_MAX)
        if proc.is_alive():
            print(f"node pid {proc.pid} did not exit; terminating it", file=sys.stderr)
            proc.terminate()
            proc.join(STOP_S_MAX)
        conn.close()


# -- report ----------------------------------------------------------------------

METRICS = [  # (workload, label, key, unit)
    ("a", "(a) 1 caller x 1 job", "commands_per_s", "commits/s"),
    ("a", "", "p50_ms", "p50 ms"),
    ("a", "", "p99_ms", "p99 ms"),
    ("b", "(b) {in_flight} in flight x 1 job", "commands_per_s", "commits/s"),
    ("b", "", "p50_ms", "p50 ms"),
    ("b", "", "p99_ms", "p99 ms"),
    ("c", "(c) 1 caller x {batch_jobs} jobs", "items_per_s", "items/s"),
    ("c", "", "commands_per_s", "commits/s"),
    ("c", "", "p50_ms", "p50 ms"),
    ("c", "", "p99_ms", "p99 ms"),
]


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _by(results: list[dict[str, Any]], variant: str, workload: str) -> list[dict[str, Any]]:
    """One workload's result per round, in round order."""
    return [w for r in results if r["variant"] == variant for w in r["workloads"] if w["workload"] == workload]


def report(results: list[dict[str, Any]], settings: Settings) -> str:
    base, others = "nofsync", [v for v in settings.variants if v != "nofsync"]
    head = ["workload", "metric", *settings.variants]
    if base in settings.variants:
        head += [f"{v}/{base}" for v in others]
    rows = [head]
    names = {"in_flight": settings.in_flight, "batch_jobs": settings.batch_jobs}
    for workload, label, key, unit in METRICS:
        if workload not in settings.workload_names:
            continue
        row = [label.format(**names), unit]
        values = {v: [w[key] for w in _by(results, v, workload)] for v in settings.variants}
        row += [" / ".join(_fmt(x) for x in values[v]) for v in settings.variants]
        if base in settings.variants:
            row += [" / ".join(f"{a / b:.2f}" if a and b else "-" for a, b in zip(values[v], values[base]))
                    for v in others]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines += ["", "values are round 1 / round 2 / ...; ratios pair runs of the same round"]
    lines += ["CPU used by other processes during each cluster run (machine busy CPU minus this bench's "
              "processes), in cores: " + ", ".join(f"{r['variant']} r{r['round']} {r['others_cores']:.2f}"
                                                  for r in results), ""]
    lines += _fsync_report(results, settings)
    return "\n".join(lines)


def _fsync_report(results: list[dict[str, Any]], settings: Settings) -> list[str]:
    lines = ["leader, measured window only: journal fdatasync (DurableJournal variants) and process CPU"]
    lines.append(f"{'variant':<15} {'rnd':>3} {'wl':>2} {'fsyncs/s':>9} {'mean ms':>8} {'max ms':>8} "
                 f"{'cmds/fsync':>10} {'CPU':>5} {'errors'}")
    for r in results:
        for w in r["workloads"]:
            f = w["fsync"]
            cmds = w["commands_per_s"] * settings.duration_s
            cols = ["-"] * 4
            if f and f["count"]:
                cols = [f"{f['count'] / settings.duration_s:,.0f}", f"{f['time_s_total'] / f['count'] * 1e3:.3f}",
                        f"{f['time_s_max'] * 1e3:.2f}", f"{cmds / f['count']:.1f}"]
            errors = dict(w["errors"]) if w["errors"] else ""
            if not w["stayed_leader"]:
                errors = f"LEADER CHANGED {errors}"
            lines.append(f"{r['variant']:<15} {r['round']:>3} {w['workload']:>2} {cols[0]:>9} {cols[1]:>8} "
                         f"{cols[2]:>8} {cols[3]:>10} {w['leader_cpu']:>5.0%} {errors}")
    lines += ["", "every node, per workload including its warm-up (L = leader): journal fdatasyncs/s, "
                  "and the log-suffix truncations pysyncobj made (calls / entries dropped)"]
    for r in results:
        for w in r["workloads"]:
            cells = []
            for i, n in enumerate(w["nodes"]):
                f, t = n["fsync"], n["truncations"]
                sync = f"{f['count'] / w['elapsed_s']:,.0f} fsync/s" if f is not None else "no fsync"
                cells.append(f"n{i}{'L' if i == r['leader'] else ' '} {sync:>13}, trunc {t['calls']}/{t['entries']}")
            lines.append(f"{r['variant']:<15} {r['round']:>3} {w['workload']:>2}  " + " | ".join(cells))
    warnings: dict[str, int] = {}
    for r in results:
        for n in r["node_totals"]:
            for key, count in n["pysyncobj_warnings"].items():
                warnings[key] = warnings.get(key, 0) + count
    lines += ["", "pysyncobj warnings, all runs and nodes:"]
    lines += [f"  {count:>6} x {key}" for key, count in sorted(warnings.items())] or ["  none"]
    return lines


def parse_args(argv: list[str] | None) -> tuple[Settings, str | None]:
    p = argparse.ArgumentParser(prog="python -m bench.raft_fsync", description=__doc__.split("\n")[0])
    p.add_argument("--duration-s", type=float, default=8.0, help="measured seconds per workload")
    p.add_argument("--warmup-s", type=float, default=1.5, help="unmeasured seconds before each workload")
    p.add_argument("--rounds", type=int, default=2, help="how many times to run each variant")
    p.add_argument("--variants", default="durable,nofsync", help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--in-flight", type=int, default=64, help="concurrent proposals in workload (b)")
    p.add_argument("--batch-jobs", type=int, default=100, help="jobs per command in workload (c)")
    p.add_argument("--data-root", default=tempfile.gettempdir(),
                   help="where the nodes' temp data dirs go (must be a real disk, not tmpfs)")
    p.add_argument("--workloads", default="a,b,c", help="comma list of a, b, c (see above)")
    p.add_argument("--json", help="also write the raw results here")
    a = p.parse_args(argv)
    settings = Settings(a.duration_s, a.warmup_s, a.rounds, tuple(v for v in a.variants.split(",") if v),
                        a.in_flight, a.batch_jobs, a.data_root, tuple(w for w in a.workloads.split(",") if w))
    return settings, a.json


def main(argv: list[str] | None = None) -> int:
    settings, json_path = parse_args(argv)
    try:
        settings.validate()
        device, fstype, mount = filesystem_of(settings.data_root)
        if fstype in NOT_MEMORY_FS:
            raise BenchError(f"{settings.data_root} is on {fstype}: fsync is free there; pass --data-root on a disk")
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    header = (f"journal fsync cost: 3 nodes on 127.0.0.1, nproc {os.cpu_count()}, data under "
              f"{settings.data_root} ({fstype} on {device}, mounted at {mount}); "
              f"{settings.duration_s:g} s per workload after {settings.warmup_s:g} s warm-up")
    print(header, file=sys.stderr)
    load_before = os.getloadavg()
    results = []
    try:
        for round_no in range(1, settings.rounds + 1):
            for variant in settings.variants:
                print(f"round {round_no}: {variant} ...", file=sys.stderr, flush=True)
                results.append(run_cluster(variant, round_no, settings))
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    load_after = os.getloadavg()
    print(header)
    print("load average before: %.2f %.2f %.2f, after: %.2f %.2f %.2f\n" % (*load_before, *load_after))
    print(report(results, settings))
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"settings": settings.__dict__, "filesystem": [device, fstype, mount],
                       "load_before": load_before, "load_after": load_after, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
