"""Scenarios only schedulerd can run: the peers are single-node, so they have no
leader to kill and no replica to rebuild.

5. scale: many live jobs due far in the future, steady lateness with few vs many,
   RSS and LMDB size per node, restart time, wiped-node catch-up time.
6. failover: kill -9 the leader during a steady run."""
from __future__ import annotations

import asyncio
import math
import os
import re
import threading
import time
from dataclasses import replace
from typing import Any

from bench.common import BenchError, alternation, fmt, iso_us, summarize, uptime_line, wait_until
from bench.plan import OneOff
from bench.scenarios import SD, Options, Report, _cpu_rows, _lateness_rows, make_system, steady_once
from bench.feeder import create_jobs, job_body
from bench.sd import BATCH_MAX, Node, SdSystem
from bench.speed import PROBE

FAR_FUTURE_S = 365 * 86_400.0
FILL_CHUNK = 50_000  # jobs per create_jobs call while filling (bounds the parent's memory)
CATCH_UP_S_MAX = 900.0
_SNAPSHOT = re.compile(r"^(\S+ \S+) .*(snapshot_written|snapshot_restored).*?(bytes=\d+)?$")


def fill(system: SdSystem, prefix: str, start: int, stop: int, in_flight: int) -> dict[str, Any]:
    far = iso_us(time.time() + FAR_FUTURE_S)
    t0, created, failed = time.monotonic(), 0, 0
    for lo in range(start, stop, FILL_CHUNK):
        bodies = [job_body(f"{prefix}-{k}", {"at": far}) for k in range(lo, min(stop, lo + FILL_CHUNK))]
        stats = asyncio.run(create_jobs(system.cluster.urls, bodies, BATCH_MAX, in_flight))
        created, failed = created + stats.created, failed + stats.failed
    elapsed = time.monotonic() - t0
    return {"created": created, "failed": failed, "elapsed_s": elapsed, "jobs_per_s": created / max(elapsed, 1e-9)}


def _follower(system: SdSystem) -> Node:
    leader = system.cluster.leader()
    return next(n for n in system.cluster.nodes if n is not leader and n.proc is not None)


def _caught_up(system: SdSystem, node: Node) -> bool:
    leader = system.cluster.leader()
    target = leader.group0()["commit_index"]
    return node.ready() and node.group0()["last_applied"] >= target


def _restart(system: SdSystem, wipe: bool) -> dict[str, Any]:
    """kill -9 a follower (and wipe its data dir), start it again; time until it is ready
    and has applied the leader's commit index, then compare digests."""
    node = _follower(system)
    t0 = time.monotonic()
    if wipe:
        system.cluster.wipe_and_restart(node)
    else:
        node.kill9()
        node.start()
    wait_until(node.ready, CATCH_UP_S_MAX, f"{node.name} ready again", interval_s=0.1)
    ready_s = time.monotonic() - t0
    wait_until(lambda: _caught_up(system, node), CATCH_UP_S_MAX, f"{node.name} caught up", interval_s=0.1)
    caught_s = time.monotonic() - t0
    leader_digest, node_digest = _digests_at_one_index(system, node)
    return {"node": node.name, "ready_s": ready_s, "caught_up_s": caught_s,
            "digest_match": leader_digest == node_digest, "last_applied": node_digest[0]}


def _digests_at_one_index(system: SdSystem, node: Node) -> tuple[tuple[int, str], tuple[int, str]]:
    """The leader's and node's (last_applied, digest), read when both have applied the same
    entries: a digest of a 1M-job store takes seconds, and an entry may land in between."""
    pair: list[tuple[int, str]] = []

    def same_index() -> bool:
        pair[:] = [system.cluster.leader().digest(), node.digest()]
        return pair[0][0] == pair[1][0]

    wait_until(same_index, CATCH_UP_S_MAX, f"{node.name} and the leader at one index", interval_s=0.5)
    return pair[0], pair[1]


def _settled(system: SdSystem) -> float:
    """Wait out the compactions a fill set off (each copies the whole store, the replicas
    one after another), then the kernel's writeback of the pages the fill dirtied: the
    minute measured is steady state. Without the sync, the writeback of a 1M-job fill
    (GBs, starting 30 s after the pages were dirtied) ran during the measured minute and
    slowed the journal's fdatasyncs. Returns the seconds the sync took."""
    wait_until(lambda: not any(n.group0()["snapshotting"] for n in system.cluster.nodes if n.proc is not None),
               CATCH_UP_S_MAX, "compactions set off by the fill to finish", interval_s=0.5)
    t0 = time.monotonic()
    os.sync()
    return time.monotonic() - t0


def _snapshots_between(events: list[str], t0: float, t1: float) -> int:
    """snapshot_written lines logged between two time.time() instants (node logs are local time)."""
    count = 0
    for line in events:
        match = _SNAPSHOT.match(line.split(" ", 1)[1])
        if match and match.group(2) == "snapshot_written":
            at = time.mktime(time.strptime(match.group(1).split(",")[0], "%Y-%m-%d %H:%M:%S"))
            count += t0 <= at <= t1
    return count


def _snapshot_events(system: SdSystem) -> list[str]:
    out = []
    for node in system.cluster.nodes:
        with open(node.log_path, errors="replace") as f:
            out += [f"{node.name} {line.strip()[:160]}" for line in f if "snapshot_" in line]
    return out


def scale(opts: Options, live: int, baseline_live: int, rate: float, duration_s: float, lead_s: float,
          drain_s: float) -> Report:
    """One cluster: fill to baseline_live, measure a steady run, fill on to live, measure
    again. The two runs are minutes apart (the fill sits between them)."""
    if live <= baseline_live:
        raise BenchError("--live must exceed --baseline-live")
    report = Report(f"scale: steady {rate:g} jobs/s with {baseline_live:,} vs {live:,} live far-future jobs",
                    [f"{baseline_live:,} live", f"{live:,} live"])
    system = make_system(SD, opts)
    small, big = report.systems
    report.raw["uptime"] = [f"before: {uptime_line()}"]
    try:
        system.setup()
        fill_small = fill(system, "lv", 0, baseline_live, opts.in_flight)
        sync_small = _settled(system)
        windows = [time.time()]
        s_small, i_small = steady_once(system, rate, duration_s, lead_s, drain_s, "sa")
        windows.append(time.time())
        mem_small = system.cluster.rss_and_disk()
        fill_big = fill(system, "lv", baseline_live, live, opts.in_flight)
        report.raw["uptime"].append(f"after fill: {uptime_line()}")
        sync_big = _settled(system)
        report.raw["uptime"].append(f"compactions done: {uptime_line()}")
        mem_big = system.cluster.rss_and_disk()
        windows.append(time.time())
        s_big, i_big = steady_once(system, rate, duration_s, lead_s, drain_s, "sb", opts.profile_s)
        windows.append(time.time())
        restart = _restart(system, wipe=False)
        wiped = _restart(system, wipe=True)
        report.raw["snapshots"] = _snapshot_events(system)
    finally:
        system.teardown()
        report.raw["uptime"].append(f"after: {uptime_line()}")
    stats = {small: s_small, big: s_big}
    _lateness_rows(report, stats)
    report.add("jobs done/s", {small: s_small["done_per_s"], big: s_big["done_per_s"]}, None)
    _cpu_rows(report, {small: i_small, big: i_big})
    report.add("snapshots written during the steady run",
               {small: _snapshots_between(report.raw["snapshots"], windows[0], windows[1]),
                big: _snapshots_between(report.raw["snapshots"], windows[2], windows[3])}, None)
    _scale_tail(report, stats, {small: sync_small, big: sync_big}, {small: fill_small, big: fill_big},
                {small: mem_small, big: mem_big}, restart, wiped)
    report.raw.update(infos={small: i_small, big: i_big})
    return report


def mean_stats(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """A system's figures over its windows: lateness percentiles and rates as the mean of the
    windows', counts summed, max the largest."""
    out: dict[str, Any] = {}
    for key in windows[0]:
        values = [w[key] for w in windows]
        if key in ("expected", "ran", "missing", "duplicates", "early"):
            out[key] = sum(values)
        elif key == "lateness_max_s":
            out[key] = max(values)
        else:
            out[key] = sum(values) / len(values)
    return out


def copy_split(windows: list[dict[str, Any]], names: list[str]) -> str:
    """The big system's windows split by whether it wrote a snapshot in them (a compaction
    copies its whole store), each as the mean p99 against the baseline's windows."""
    def mean_p99(ws: list[dict[str, Any]]) -> float:
        return sum(w["stats"]["lateness_p99_s"] for w in ws) / len(ws) if ws else math.nan

    small, big = names
    base = mean_p99([w for w in windows if w["system"] == small])
    parts = []
    for label, copied in (("without", False), ("with", True)):
        ws = [w for w in windows if w["system"] == big and (w["big_copies"] > 0) == copied]
        value = mean_p99(ws)
        parts.append(f"{len(ws)} {label} a snapshot of it: p99 {fmt(value, 'ms')} ({value / base:.2f}x)" if ws
                     else f"none {label} a snapshot of it")
    return f"{big} windows against the {small} ones (mean p99 {fmt(base, 'ms')}): " + "; ".join(parts)


def scale_side_by_side(opts: Options, live: int, baseline_live: int, rate: float, duration_s: float,
                       lead_s: float, drain_s: float, pairs: int) -> Report:
    """Two clusters up at once, one holding baseline_live jobs and one live, their steady runs
    alternated (alternation()): the comparison scale() makes, without the minutes between
    its two runs in which this shared box may change speed by 2x."""
    if live <= baseline_live:
        raise BenchError("--live must exceed --baseline-live")
    if pairs < 1:
        raise BenchError("--side-by-side needs at least 1 pair of runs")
    report = Report(f"scale, side by side: steady {rate:g} jobs/s with {baseline_live:,} vs {live:,} live "
                    f"far-future jobs, {pairs} pair(s) of runs alternated", [f"{baseline_live:,} live",
                                                                              f"{live:,} live"])
    names = report.systems
    systems = [make_system(SD, replace(opts, run_dir=os.path.join(opts.run_dir, tag))) for tag in ("small", "big")]
    report.raw["uptime"] = [f"before: {uptime_line()}"]
    fills, syncs, mems, windows = {}, {}, {}, []
    try:
        for name, system, count in zip(names, systems, (baseline_live, live)):
            system.setup()
            fills[name] = fill(system, "lv", 0, count, opts.in_flight)
        report.raw["uptime"].append(f"after fills: {uptime_line()}")
        for name, system in zip(names, systems):
            syncs[name] = _settled(system)
            mems[name] = system.cluster.rss_and_disk()
        report.raw["uptime"].append(f"compactions done: {uptime_line()}")
        for k, which in enumerate(alternation(pairs)):
            t0 = time.time()
            stats, info = steady_once(systems[which], rate, duration_s, lead_s, drain_s, f"w{k}",
                                      opts.profile_s if which == 1 and k < 2 else 0.0)
            windows.append({"system": names[which], "t0": t0, "t1": time.time(), "stats": stats, "info": info})
        restart = _restart(systems[1], wipe=False)
        wiped = _restart(systems[1], wipe=True)
        snapshots = {name: _snapshot_events(system) for name, system in zip(names, systems)}
    finally:
        for system in systems:
            system.teardown()
        report.raw["uptime"].append(f"after: {uptime_line()}")
    stats = {name: mean_stats([w["stats"] for w in windows if w["system"] == name]) for name in names}
    _lateness_rows(report, stats)
    report.add("jobs done/s", {name: s["done_per_s"] for name, s in stats.items()}, None)
    report.add("box slowdown over the windows (mean; bench/speed.py)",
               {name: sum(w["info"]["box_slowdown"] for w in windows if w["system"] == name) / pairs
                for name in names}, None)
    report.add("CPU cores: server (mean over the windows)",
               {name: sum(w["info"].get("cpu_cores", {}).get("server", math.nan) for w in windows
                          if w["system"] == name) / pairs for name in names}, None)
    report.add("snapshots written during the steady runs",
               {name: sum(_snapshots_between(snapshots[name], w["t0"], w["t1"]) for w in windows
                          if w["system"] == name) for name in names}, None)
    _scale_tail(report, stats, syncs, fills, mems, restart, wiped)
    for w in windows:
        w["big_copies"] = _snapshots_between(snapshots[names[1]], w["t0"], w["t1"])
    report.notes[1:1] = [f"window {k}, {w['system']}: p50 {fmt(w['stats']['lateness_p50_s'], 'ms')}, "
                         f"p99 {fmt(w['stats']['lateness_p99_s'], 'ms')}, box {fmt(w['info']['box_slowdown'])}x, "
                         f"{w['big_copies']} snapshot(s) of the {names[1]} cluster written"
                         for k, w in enumerate(windows)] + [copy_split(windows, names)]
    report.raw.update(windows=windows, snapshots=snapshots)
    return report


def _scale_tail(report: Report, stats: dict[str, dict[str, Any]], syncs: dict[str, float],
                fills: dict[str, dict[str, Any]], mems: dict[str, list[dict[str, Any]]], restart: dict[str, Any],
                wiped: dict[str, Any]) -> None:
    """The rows and notes both scale runs end with: fill, memory, the ratios, restarts."""
    small, big = report.systems
    report.add("after the fill: seconds to sync dirty pages", syncs, None)
    report.add("fill: create jobs/s (batch of 100)", {n: f["jobs_per_s"] for n, f in fills.items()}, None)
    for a, b in zip(mems[small], mems[big]):
        report.add(f"RSS {a['node']} (MiB)", {small: a["rss_bytes"] / 2**20, big: b["rss_bytes"] / 2**20}, None)
        report.add(f"data dir {a['node']} (MiB)", {small: a["data_bytes"] / 2**20, big: b["data_bytes"] / 2**20},
                   None)
    p99_ratio = stats[big]["lateness_p99_s"] / stats[small]["lateness_p99_s"] \
        if stats[small]["lateness_p99_s"] > 0 else math.nan
    p50_ratio = stats[big]["lateness_p50_s"] / stats[small]["lateness_p50_s"] \
        if stats[small]["lateness_p50_s"] > 0 else math.nan
    report.notes += [
        f"lateness with {big} / with {small}: p50 {p50_ratio:.2f}x, p99 {p99_ratio:.2f}x (target: within 1.10x)",
        f"restart after kill -9 of follower {restart['node']} ({big}): ready in {restart['ready_s']:.2f} s, "
        f"caught up in {restart['caught_up_s']:.2f} s, digest match {restart['digest_match']}",
        f"wiped follower {wiped['node']} (data dir deleted, {big}): ready in {wiped['ready_s']:.2f} s, caught up "
        f"in {wiped['caught_up_s']:.2f} s, digest match {wiped['digest_match']}",
    ]
    report.raw.update(stats=stats, fill=fills, mem=mems, restart=restart, wiped=wiped)


# ---- 6. failover ----------------------------------------------------------------------

class LeaderKiller(threading.Thread):
    def __init__(self, system: SdSystem, at: float) -> None:
        super().__init__(daemon=True)
        self.system, self.at = system, at
        self.killed_at = math.nan
        self.new_leader_at = math.nan
        self.victim = ""
        self.error: str | None = None

    def run(self) -> None:
        try:
            time.sleep(max(0.0, self.at - time.time()))
            leader = self.system.cluster.leader()
            self.victim = leader.name
            self.killed_at = time.time()
            leader.kill9()
            self.system.cluster.leader(timeout_s=30)
            self.new_leader_at = time.time()
        except Exception as exc:  # reported with the results, never swallowed
            self.error = repr(exc)


def _largest_gap(times: list[float], lo: float, hi: float) -> tuple[float, float]:
    inside = sorted(t for t in times if lo <= t <= hi)
    best = (0.0, lo)
    for a, b in zip(inside, inside[1:]):
        if b - a > best[0]:
            best = (b - a, a)
    return best


def failover(opts: Options, rate: float, duration_s: float, kill_after_s: float, lead_s: float,
             drain_s: float) -> Report:
    report = Report(f"failover: kill -9 the leader {kill_after_s:g} s into a {rate:g} jobs/s steady run",
                    [SD])
    system = make_system(SD, opts)
    report.raw["uptime"] = [f"before: {uptime_line()}"]
    try:
        system.setup()
        plan = OneOff.steady("fo", lead_s + 2.0, rate, duration_s, lead_s, time.time())
        killer = LeaderKiller(system, plan.t0 + kill_after_s)
        killer.start()
        records, info = system.oneoff(plan, drain_s)
        info["box_slowdown"] = PROBE.slowdown(plan.t0, plan.t0 + duration_s)
        killer.join(60)
    finally:
        system.teardown()
        report.raw["uptime"].append(f"after: {uptime_line()}")
    if killer.error:
        raise BenchError(f"leader kill failed: {killer.error}")
    k = killer.killed_at
    starts = [r.start for r in records]
    acks = [r.done for r in records if not math.isnan(r.done)]
    gap_start, gap_from = _largest_gap(starts, k - 1.0, k + 30.0)
    resume = min((t for t in starts if t > k + 0.05), default=math.nan) - k
    ack_resume = min((t for t in acks if t > k + 0.05), default=math.nan) - k
    before = [r for r in records if plan.t0 <= r.due < k - 1.0]
    around = [r for r in records if k - 1.0 <= r.due < k + 5.0]
    s_all = summarize(records, plan.count, plan.t0)
    s_before = summarize(before, len(before), plan.t0)
    s_around = summarize(around, len(around), k - 1.0)
    report.add("new leader seen (s after kill)", {SD: killer.new_leader_at - k}, None)
    report.add("first task start after kill (s)", {SD: resume}, None)
    report.add("first ack after kill (s)", {SD: ack_resume}, None)
    report.add("largest gap between task starts (s)", {SD: gap_start}, None)
    for label, s in (("before the kill", s_before), ("due kill-1 s .. kill+5 s", s_around), ("whole run", s_all)):
        report.add(f"lateness p50, {label}", {SD: s["lateness_p50_s"]}, None, "ms")
        report.add(f"lateness p99, {label}", {SD: s["lateness_p99_s"]}, None, "ms")
        report.add(f"lateness max, {label}", {SD: s["lateness_max_s"]}, None, "ms")
    report.add("runs later than 10 s (leased by the dead node, waited out the lease)",
               {SD: sum(1 for r in records if r.start - r.due > 10.0)}, None)
    report.add("not run by the deadline", {SD: s_all["missing"]}, None)
    report.add("run twice", {SD: s_all["duplicates"]}, None)
    _cpu_rows(report, {SD: info})
    report.notes.append(f"killed {killer.victim} at {fmt(kill_after_s)} s; target: dispatch resumes within 2 s. "
                        "Peers: n/a (single node: a kill -9 is an outage until someone restarts it).")
    report.raw.update(killed=killer.victim, stats=s_all, before=s_before, around=s_around, info=info)
    return report
