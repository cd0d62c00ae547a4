"""The issue-5 scenarios. Each runs every system asked for, one after the other
on the same machine in the same invocation, and returns a `Report`: rows of
(metric, value per system) that `Report.render` turns into a table with
schedulerd's ratio to each peer."""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from bench import profile, series
from bench.aps_peer import ApsSystem
from bench.celery_peer import CelerySystem
from bench.common import (FIND_MAX_P99_S_MAX, WORKER_SLOTS, BenchError, Record, fmt, ratio, summarize,
                          uptime_line)
from bench.plan import OneOff
from bench.sd import QueueLimits, SdSystem
from bench.speed import PROBE

SD = "schedulerd"
# Creates per second assumed when placing a spike's due time after its creates
# (measured by `python -m bench create`); a run whose creates overran says so.
SPIKE_CREATE_RATE_GUESS = {SD: 3000.0, "apscheduler": 250.0, "celery": 1000.0}
SPIKE_MARGIN_S = 5.0
FIND_MAX_HALVINGS_MAX = 16  # --find-max goes down to start/16 when the start rate already fails


@dataclass
class Row:
    metric: str
    values: dict[str, Any]
    higher_is_better: bool | None  # None: no ratio (a count, a note)
    unit: str = ""


@dataclass
class Report:
    title: str
    systems: list[str]
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def add(self, metric: str, values: dict[str, Any], higher_is_better: bool | None, unit: str = "") -> None:
        self.rows.append(Row(metric, values, higher_is_better, unit))

    def render(self) -> str:
        peers = [s for s in self.systems if s != SD] if SD in self.systems else []  # scale: no peers
        head = ["metric", *self.systems, *(f"{SD} vs {p}" for p in peers)]
        out = [f"## {self.title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in self.rows:
            cells = [fmt(row.values.get(s), row.unit) for s in self.systems]
            ratios = [ratio(row.values.get(SD), row.values.get(p), row.higher_is_better)
                      if row.higher_is_better is not None else "" for p in peers]
            out.append("| " + " | ".join([row.metric, *cells, *ratios]) + " |")
        out += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(out)


@dataclass
class Options:
    run_dir: str
    peers: list[str]
    workers: int = 4
    worker_concurrency: int = WORKER_SLOTS
    in_flight: int = 64
    profile_s: float = 0.0


def make_system(name: str, opts: Options) -> Any:
    if name == SD:
        return SdSystem(opts.run_dir, opts.workers, opts.worker_concurrency, opts.in_flight)
    if name == "apscheduler":
        return ApsSystem(opts.run_dir)
    if name == "celery":
        return CelerySystem(opts.run_dir)
    raise BenchError(f"unknown system {name!r}; peers are apscheduler, celery")


def each_system(opts: Options, report: Report, body: Callable[[Any], None], sd_only: bool = False) -> None:
    """Run body(system) for schedulerd then each peer; every system is torn down after its turn."""
    for name in [SD] + ([] if sd_only else opts.peers):
        system = make_system(name, opts)
        report.raw.setdefault("uptime", []).append(f"{name} before: {uptime_line()}")
        try:
            system.setup()
            body(system)
        finally:
            system.teardown()
            report.raw["uptime"].append(f"{name} after: {uptime_line()}")


def _lateness_rows(report: Report, stats: dict[str, dict[str, Any]]) -> None:
    for key, label in (("lateness_p50_s", "lateness p50"), ("lateness_p99_s", "lateness p99"),
                       ("lateness_max_s", "lateness max")):
        report.add(label, {s: v[key] for s, v in stats.items()}, False, "ms")
    report.add("not run by the deadline", {s: v["missing"] for s, v in stats.items()}, None)
    report.add("run twice", {s: v["duplicates"] for s, v in stats.items()}, None)


def _cpu_rows(report: Report, infos: dict[str, dict[str, Any]]) -> None:
    report.add("box slowdown over the window (1 = its fastest; bench/speed.py)",
               {s: i.get("box_slowdown") for s, i in infos.items()}, None)
    for part in ("server", "clients", "other"):
        report.add(f"CPU cores: {part}", {s: i.get("cpu_cores", {}).get(part) for s, i in infos.items()}, None)
    for name, info in infos.items():
        nodes = info.get("nodes")
        if nodes:
            report.notes.append(f"{name} nodes over the run: " + "; ".join(
                f"{n}{' (leader)' if v['leader'] else ''}: {v['entries_per_s']:g} Raft entries/s, "
                f"{v['fsyncs_per_s']:g} journal fdatasyncs/s (mean {fmt(v['fsync_ms_mean'])} ms), "
                f"CPU {fmt(v['cpu_cores'])} cores" for n, v in nodes.items()))


# ---- 1. create ------------------------------------------------------------------------

def create(opts: Options, count: int, batch_count: int, concurrency: int, peer_threads: int) -> Report:
    report = Report(f"create: {count:,} jobs one per request ({concurrency} concurrent), "
                    f"{batch_count:,} in batches of 100", [SD, *opts.peers])
    single, batched = {}, {}

    def body(system: Any) -> None:
        if system.name == SD:
            single[SD] = system.create(count, concurrency, 1, "c1")
            batched[SD] = system.create(batch_count, max(1, concurrency // 8), 100, "c100")
        else:
            single[system.name] = system.create(count, peer_threads, "c1")

    each_system(opts, report, body)
    report.add("one per request: jobs/s", {s: v["jobs_per_s"] for s, v in single.items()}, True)
    report.add("one per request: p50 latency", {s: v["p50_s"] for s, v in single.items()}, False, "ms")
    report.add("one per request: p99 latency", {s: v["p99_s"] for s, v in single.items()}, False, "ms")
    report.add("batch of 100: jobs/s", {s: v["jobs_per_s"] for s, v in batched.items()}, True)
    report.add("batch of 100: p99 request latency", {s: v["p99_s"] for s, v in batched.items()}, False, "ms")
    report.notes.append(f"peers use {peer_threads} client threads; they have no batch create. Celery 'accepted' = "
                        "published to Redis (no worker running); APScheduler = add_job committed to SQLite.")
    report.raw.update(single=single, batched=batched)
    return report


# ---- 2. steady ------------------------------------------------------------------------

def steady_once(system: Any, rate: float, duration_s: float, lead_s: float, drain_s: float, prefix: str,
                profile_s: float = 0.0, backlog_s: float = 0.0,
                backlog_expire_s: float = 0.0) -> tuple[dict[str, Any], dict[str, Any]]:
    """backlog_s > 0: the jobs due in the first backlog_s seconds all expire
    backlog_expire_s after the first due time (OneOff.with_backlog)."""
    plan = OneOff.steady(prefix, lead_s + 2.0, rate, duration_s, lead_s, time.time()).with_backlog(
        backlog_s, backlog_expire_s)
    prof = _start_profile(system, plan.t0 + min(5.0, duration_s / 4), profile_s, prefix)
    busy = series.BusySampler()
    busy.start()
    try:
        records, info = system.oneoff(plan, drain_s)
    finally:
        busy.stop()
    stats = summarize(records, plan.count, plan.t0)
    info["series"] = series.windows(records, plan.t0, busy.samples)
    info["box_slowdown"] = PROBE.slowdown(plan.t0, plan.t0 + duration_s)
    if prof is not None:
        prof.join(profile_s + 90)
        info["profile"] = (profile.summarize(prof.out_path, prof.sched) if prof.error is None
                           else {"error": prof.error})
    return stats, info


def _start_profile(system: Any, start_at: float, duration_s: float, tag: str) -> profile.LeaderProfile | None:
    if system.name != SD or duration_s <= 0:
        return None
    if not profile.available():
        raise BenchError("--profile-s needs py-spy: pip install py-spy")
    prof = profile.LeaderProfile(lambda: system.cluster.leader().pid, start_at, duration_s,
                                 os.path.join(system.dir, f"pyspy-{tag}.txt"))
    prof.start()
    return prof


def _titled(title: str, limits: QueueLimits | None) -> str:
    return f"{title}; {limits}" if limits is not None else title


def steady(opts: Options, rate: float, duration_s: float, lead_s: float, drain_s: float,
           limits: QueueLimits | None = None) -> Report:
    """limits: set on the jobs' queue before the first create (schedulerd only)."""
    report = Report(_titled(f"steady: {rate:g} one-off jobs/s due uniformly for {duration_s:g} s", limits),
                    [SD, *opts.peers])
    stats, infos = {}, {}

    def body(system: Any) -> None:
        if limits is not None:
            report.raw["queue"] = system.limit_queue(limits)
        stats[system.name], infos[system.name] = steady_once(system, rate, duration_s, lead_s, drain_s, "st",
                                                            opts.profile_s)

    each_system(opts, report, body)
    report.add("jobs done/s (acked; peers: callback returned)", {s: v["done_per_s"] for s, v in stats.items()}, True)
    _lateness_rows(report, stats)
    report.add("creates answered after the job's due time", {s: i.get("late_creates") for s, i in infos.items()}, None)
    _cpu_rows(report, infos)
    report.notes += [series.render(name, info["series"]) for name, info in infos.items()]
    report.raw.update(stats=stats, infos=infos)
    return report


def find_max(opts: Options, start_rate: float, max_rate: float, duration_s: float, lead_s: float,
             drain_s: float, bisect_steps: int, fresh_per_step: bool = False,
             limits: QueueLimits | None = None) -> Report:
    """Highest rate with p99 lateness < 1 s and nothing missing: double, then bisect.

    Every step runs on one system (one cluster, its store holding the jobs of the steps
    before), or with fresh_per_step each on a new one in its own run dir; limits are set on
    each system as it comes up (schedulerd only)."""
    report = Report(_titled(f"steady --find-max: highest rate with p99 lateness < {FIND_MAX_P99_S_MAX:g} s "
                            f"({duration_s:g} s per step{', a fresh system each' if fresh_per_step else ''})",
                            limits), [SD, *opts.peers])
    best: dict[str, float] = {}
    steps: dict[str, list[dict[str, Any]]] = {}
    for name in [SD, *opts.peers]:
        tried: list[dict[str, Any]] = steps.setdefault(name, [])
        current: list[Any] = []  # the system the next step runs on

        def ok(rate: float, name: str = name, tried: list[dict[str, Any]] = tried,
               current: list[Any] = current) -> bool:
            if fresh_per_step or not current:
                for old in current:
                    old.teardown()
                step_opts = replace(opts, run_dir=os.path.join(opts.run_dir, f"step{len(tried)}")) \
                    if fresh_per_step else opts
                current[:] = [make_system(name, step_opts)]
                report.raw.setdefault("uptime", []).append(f"{name} step {len(tried)} before: {uptime_line()}")
                current[0].setup()
                if limits is not None:
                    report.raw["queue"] = current[0].limit_queue(limits)
            s, info = steady_once(current[0], rate, duration_s, lead_s, drain_s, f"fm{len(tried)}")
            passed = s["missing"] == 0 and s["lateness_p99_s"] < FIND_MAX_P99_S_MAX
            tried.append({"rate": rate, "passed": passed, "p50_s": s["lateness_p50_s"],
                          "p99_s": s["lateness_p99_s"], "done_per_s": s["done_per_s"], "missing": s["missing"],
                          "cpu": info.get("cpu_cores"), "box_slowdown": info["box_slowdown"]})
            return passed

        try:
            best[name] = search_max(ok, start_rate, max_rate, bisect_steps)
        finally:
            for old in current:
                old.teardown()
            report.raw.setdefault("uptime", []).append(f"{name} after: {uptime_line()}")
    report.add("highest rate with p99 < 1 s (jobs/s)", best, True)
    for name, tried in steps.items():
        report.notes.append(f"{name}: " + "; ".join(
            f"{t['rate']:g}/s {'pass' if t['passed'] else 'FAIL'} p99 {fmt(t['p99_s'], 'ms')}"
            f" (box {fmt(t['box_slowdown'])}x)"
            f"{' missing ' + str(t['missing']) if t['missing'] else ''}" for t in tried))
    report.raw.update(best=best, steps=steps)
    return report


def search_max(ok: Callable[[float], bool], start_rate: float, max_rate: float, bisect_steps: int) -> float:
    """The highest rate ok() passes: double from start_rate while it passes (halve while the
    first fails), then bisect between the last pass and the first failure; 0 if none passes."""
    good, bad, rate = 0.0, math.inf, start_rate
    while rate <= max_rate and ok(rate):
        good, rate = rate, rate * 2
    bad = min(rate, bad) if rate <= max_rate else bad
    while not good and rate >= start_rate / FIND_MAX_HALVINGS_MAX:  # the first rate failed: halve
        rate /= 2
        if ok(rate):
            good = rate
        else:
            bad = rate
    for _ in range(bisect_steps if good and bad != math.inf else 0):
        mid = round((good + bad) / 2, -1) or (good + bad) / 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


# ---- 3. spike -------------------------------------------------------------------------

def spike(opts: Options, jobs: int, drain_s: float, limits: QueueLimits | None = None) -> Report:
    """limits: set on the jobs' queue before they are created (schedulerd only)."""
    report = Report(_titled(f"spike: {jobs:,} one-off jobs due at the same instant", limits), [SD, *opts.peers])
    stats, infos = {}, {}

    def body(system: Any) -> None:
        if limits is not None:
            report.raw["queue"] = system.limit_queue(limits)
        due_in = SPIKE_MARGIN_S + jobs / SPIKE_CREATE_RATE_GUESS[system.name]
        plan = OneOff.spike("sp", due_in, jobs, time.time())
        prof = _start_profile(system, plan.t0, opts.profile_s, "spike")
        records, info = system.oneoff(plan, drain_s)
        stats[system.name] = summarize(records, plan.count, plan.t0)
        info["box_slowdown"] = PROBE.slowdown(plan.t0, plan.t0 + stats[system.name]["drain_s"])
        if limits is not None and limits.max_starts_per_s is not None:
            info["starts_per_s_after_burst"] = starts_per_s_after_burst(records, limits.max_starts_per_s)
        if prof is not None:
            prof.join(opts.profile_s + 90)
            info["profile"] = (profile.summarize(prof.out_path, prof.sched) if prof.error is None
                           else {"error": prof.error})
        infos[system.name] = info
        if info.get("created_at", 0) > plan.t0:
            report.notes.append(f"{system.name}: creating the jobs overran the due time by "
                                f"{info['created_at'] - plan.t0:.1f} s; its lateness includes that")

    each_system(opts, report, body)
    report.add("due instant -> all done (s)", {s: v["drain_s"] if not v["missing"] else None
                                               for s, v in stats.items()}, False)
    for name, v in stats.items():
        if v["missing"]:
            report.notes.append(f"{name}: {v['missing']:,} of {jobs:,} jobs had not run {drain_s:g} s after the "
                                f"due instant (--drain-s); its rates and lateness cover the ones that ran")
    report.add("jobs done/s over the drain", {s: v["done_per_s"] for s, v in stats.items()}, True)
    if limits is not None and limits.max_starts_per_s is not None:
        report.add(f"handler starts/s after the first second's burst (limit {fmt(limits.max_starts_per_s)}/s)",
                   {s: i["starts_per_s_after_burst"] for s, i in infos.items()}, True)
    _lateness_rows(report, stats)
    _cpu_rows(report, infos)
    report.raw.update(stats=stats, infos=infos)
    return report


def starts_per_s_after_burst(records: list[Record], max_starts_per_s: float) -> float:
    """The rate the handlers started at once the bucket's first second's worth of starts was
    spent: the slope between the 25th and the 75th percentile of the later starts, so
    neither the burst nor the drain's last stragglers weigh on it; nan if too few ran."""
    later = sorted(r.start for r in records)[math.ceil(max_starts_per_s):]
    lo, hi = len(later) // 4, 3 * len(later) // 4
    if hi - lo < 2 or later[hi] <= later[lo]:
        return math.nan
    return (hi - lo) / (later[hi] - later[lo])


# ---- 4. recurring ---------------------------------------------------------------------

def recurring(opts: Options, jobs: int, minutes: int, drain_s: float) -> Report:
    report = Report(f"recurring: {jobs:,} cron jobs on '* * * * *', {minutes} minutes measured", [SD, *opts.peers])
    stats, infos = {}, {}

    def body(system: Any) -> None:
        records, info = system.cron(jobs, minutes, drain_s, "cr")
        first = info["first_minute"]
        stats[system.name] = summarize(records, jobs * minutes, first)
        info["box_slowdown"] = PROBE.slowdown(first, first + 60 * minutes)
        infos[system.name] = info
        if info.get("warning"):
            report.notes.append(f"{system.name}: {info['warning']}")

    each_system(opts, report, body)
    _lateness_rows(report, stats)
    report.add("last occurrence done, s after its minute", {s: v["drain_s"] - 60 * (minutes - 1)
                                                           for s, v in stats.items()}, False)
    _cpu_rows(report, infos)
    report.notes.append("peers: the due minute of a run is its start time floored to the minute (valid while "
                        "lateness < 60 s); Celery's recurring jobs come from celery beat.")
    report.raw.update(stats=stats, infos=infos)
    return report
