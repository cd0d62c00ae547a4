"""7. retention (schedulerd only): a steady stream of one-off jobs on a cluster whose
nodes run with `--finished-ttl`, sampled every --sample-s: per node the LMDB data
file, the snapshot file, RSS, the jobs and runs the store holds and what the sweep
deleted; the dispatch lateness of the whole run and of each sample's window. With
--compare, the same run again on a fresh cluster with `--finished-ttl 0` (nothing
deleted), side by side.

What a sample reads (`StoreSampler`): file sizes from the node's data dir
(group-*.lmdb/data.mdb, group-*.snapshot), VmRSS and RssAnon from /proc/PID/status,
the CPU time the node has used from /proc/PID/stat, and the node's /metrics: `schedulerd_jobs` (every state: the jobs stored),
`schedulerd_runs_stored` (every state: the runs stored), `schedulerd_runs` (the open
ones) and `schedulerd_retention_deleted_total{kind=job|run}`. Each window also counts
the snapshots the nodes wrote in it and the longest one's seconds (their
`snapshot_written` log lines), and the server CPU it took per job due in it."""
from __future__ import annotations

import math
import os
import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench import series
from bench.common import BenchError, Record, fmt, rss_bytes, summarize, uptime_line
from bench.scenarios import Options, Report, _cpu_rows, _lateness_rows, steady_once
from bench.sd import Node, SdSystem
from schedulerd.jobspec import parse_duration_us

MB = 2**20
SCRAPE_TIMEOUT_S = 10.0
WORKER_LIFETIME_MARGIN_S = 120.0  # beyond the run's own length: setup, late drains, teardown
LAST_SAMPLE_GAP_S = 1.0  # stop() takes no last sample when the periodic one is this fresh
PROCESS_START_S = 2.0  # steady_once places the first due time lead_s + this after it starts


def ttl_seconds(text: str) -> float:
    """The seconds a --finished-ttl means, as the daemon reads it ('0': never delete)."""
    if text.strip() == "0":
        return 0.0
    try:
        return parse_duration_us(text, "--finished-ttl") / 1_000_000
    except Exception as exc:  # the daemon's own error, said before any node starts
        raise BenchError(f"--finished-ttl {text!r}: {getattr(exc, 'message', exc)}") from None


# ---- one sample of the cluster -------------------------------------------------------

def _file_bytes(paths: list[str]) -> int | None:
    total, seen = 0, False
    for path in paths:
        try:
            total += os.stat(path).st_size
            seen = True
        except FileNotFoundError:
            pass
    return total if seen else None


def _status_kb(pid: int | None, fields: tuple[str, ...]) -> dict[str, int | None]:
    out: dict[str, int | None] = {f: None for f in fields}
    if pid is None:
        return out
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in out:
                    out[name] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return out


def _cpu_s(pid: int | None) -> float | None:
    """The CPU seconds (user + system) process pid has used, or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


_SNAPSHOT_LINE = re.compile(r"^(\S+ \S+) .*snapshot_written .*seconds=([0-9.]+)")


def snapshot_events(log_path: str) -> list[tuple[float, float]]:
    """(epoch s, seconds it took) of each snapshot a node's log says it wrote."""
    out = []
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                m = _SNAPSHOT_LINE.match(line)
                if m:
                    at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    out.append((at, float(m.group(2))))
    except OSError:
        pass
    return out


def scrape(url: str) -> dict[str, Any]:
    """The figures of a node's /metrics this scenario reads (see the module doc)."""
    with urllib.request.urlopen(url + "/metrics", timeout=SCRAPE_TIMEOUT_S) as resp:
        text = resp.read().decode()
    jobs_by_state: dict[str, float] = {}
    open_runs = stored_runs = 0.0
    deleted: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "schedulerd_jobs":
                jobs_by_state[s.labels["state"]] = s.value
            elif s.name == "schedulerd_runs":
                open_runs += s.value
            elif s.name == "schedulerd_runs_stored":
                stored_runs = s.value
            elif s.name == "schedulerd_retention_deleted_total":
                deleted[s.labels["kind"]] = s.value
    return {"jobs": int(sum(jobs_by_state.values())), "jobs_by_state": jobs_by_state,
            "runs": int(stored_runs), "open_runs": int(open_runs),
            "deleted_jobs": int(deleted.get("job", 0)), "deleted_runs": int(deleted.get("run", 0)),
            "retention_metric": bool(deleted) or "schedulerd_retention_deleted" in text}


def sample_node(node: Node) -> dict[str, Any]:
    d = node.data_dir
    groups = sorted(n for n in _listdir(d) if n.startswith("group-") and n.endswith(".lmdb"))
    snapshots = [os.path.join(d, n[:-len(".lmdb")] + ".snapshot") for n in groups]
    status = _status_kb(node.pid, ("VmRSS", "RssAnon"))
    out: dict[str, Any] = {
        "node": node.name,
        "data_mdb_bytes": _file_bytes([os.path.join(d, n, "data.mdb") for n in groups]),
        "snapshot_bytes": _file_bytes(snapshots),
        "rss_bytes": status["VmRSS"] * 1024 if status["VmRSS"] is not None else
        (rss_bytes(node.pid) if node.pid else None),
        "rss_anon_bytes": status["RssAnon"] * 1024 if status["RssAnon"] is not None else None,
        "cpu_s": _cpu_s(node.pid),
    }
    try:
        g = node.group0()
        out.update(leader=g["is_leader"], journal_bytes=g.get("journal_bytes"), commit_index=g["commit_index"])
    except (BenchError, OSError, KeyError, ValueError):
        out["leader"] = None
    try:
        out.update(scrape(node.url))
    except (OSError, ValueError) as exc:
        out["scrape_error"] = repr(exc)
    return out


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


class StoreSampler(threading.Thread):
    """A sample of every node at start, every sample_s, and at stop()."""

    def __init__(self, system: SdSystem, sample_s: float) -> None:
        super().__init__(daemon=True, name="store-sampler")
        self.system, self.sample_s = system, sample_s
        self.samples: list[dict[str, Any]] = []
        self.started_at = math.nan
        self.error: str | None = None
        self._halt = threading.Event()

    def take(self) -> None:
        at = time.time()
        nodes = [sample_node(n) for n in self.system.cluster.nodes]
        self.samples.append({"at": at, "t_s": at - self.started_at, "nodes": nodes})

    def run(self) -> None:
        try:
            k = 0
            while True:
                self.take()
                k += 1
                if self._halt.wait(max(0.0, self.started_at + k * self.sample_s - time.time())):
                    return
        except Exception as exc:  # reported with the results, never swallowed
            self.error = repr(exc)

    def start(self) -> None:
        self.started_at = time.time()
        super().start()

    def halt(self) -> None:
        """Stop sampling (a scrape under way ends within its timeout)."""
        self._halt.set()
        if self.is_alive():
            self.join((SCRAPE_TIMEOUT_S + 5) * len(self.system.cluster.nodes) + 5)  # + /v1/cluster's 5 s

    def stop(self) -> None:
        """Stop sampling and take a last sample."""
        self.halt()
        if self.error is None and not (self.samples and time.time() - self.samples[-1]["at"] < LAST_SAMPLE_GAP_S):
            self.take()


# ---- one run, and the figures of its samples -------------------------------------------

@dataclass
class Run:
    label: str
    ttl: str
    stats: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    first_due: float = math.nan
    last_due: float = math.nan


def _leader_view(sample: dict[str, Any]) -> dict[str, Any]:
    """The leader's figures of a sample (the replicas apply the same entries), or the
    first node that answered /metrics."""
    answered = [n for n in sample["nodes"] if "jobs" in n]
    leaders = [n for n in answered if n.get("leader")]
    return (leaders or answered or [{}])[0]


def window_lateness(records: list[Record], samples: list[dict[str, Any]]) -> None:
    """Into each sample after the first: the lateness of the jobs due since the sample
    before it (summarize(), as the whole run's)."""
    ordered = sorted(records, key=lambda r: r.due)
    dues = [r.due for r in ordered]
    lo = 0
    for prev, cur in zip(samples, samples[1:]):
        a, b = prev["at"], cur["at"]
        while lo < len(dues) and dues[lo] < a:
            lo += 1
        hi = lo
        while hi < len(dues) and dues[hi] < b:
            hi += 1
        inside = ordered[lo:hi]
        s = summarize(inside, len(inside), a)
        cur["window"] = {"due": len(inside), "ran": s["ran"], "lateness_p50_s": s["lateness_p50_s"],
                         "lateness_p99_s": s["lateness_p99_s"], "lateness_max_s": s["lateness_max_s"]}
        lo = hi


def window_costs(samples: list[dict[str, Any]], snapshots: list[tuple[float, float]]) -> None:
    """Into each sample's window: the nodes' CPU seconds per job due in it (all nodes
    summed), and the snapshots written in it (count, longest)."""
    for prev, cur in zip(samples, samples[1:]):
        w = cur.setdefault("window", {})
        spent = [(b.get("cpu_s") or 0.0) - (a.get("cpu_s") or 0.0) for a, b in zip(prev["nodes"], cur["nodes"])
                 if a.get("cpu_s") is not None and b.get("cpu_s") is not None]
        w["server_cpu_s"] = sum(spent) if spent else None
        w["cpu_us_per_job"] = sum(spent) / w["due"] * 1e6 if spent and w.get("due") else None
        taken = [secs for at, secs in snapshots if prev["at"] <= at < cur["at"]]
        w["snapshots"] = len(taken)
        w["snapshot_max_s"] = max(taken) if taken else None


def retention_once(opts: Options, label: str, ttl: str, rate: float, duration_s: float, lead_s: float,
                   drain_s: float, sample_s: float, tail_s: float, backlog_s: float = 0.0,
                   limits: tuple[str, ...] = ()) -> Run:
    """A fresh cluster with `--finished-ttl ttl` (and `--limit` each of limits), a steady
    run on it (steady_once), sampled from before the first create until tail_s after the
    run; everything stopped before it returns. backlog_s > 0: the jobs due in the first
    backlog_s seconds all expire together, one TTL after the last of them is due."""
    run = Run(label, ttl)
    lifetime = lead_s + PROCESS_START_S + duration_s + drain_s + tail_s + WORKER_LIFETIME_MARGIN_S
    node_args = ("--finished-ttl", ttl, *(arg for limit in limits for arg in ("--limit", limit)))
    system = SdSystem(opts.run_dir, opts.workers, opts.worker_concurrency, opts.in_flight,
                      node_args=node_args, worker_lifetime_s=lifetime)
    sampler = StoreSampler(system, sample_s)
    run.info["uptime"] = [f"before: {uptime_line()}"]
    try:
        system.setup()
        sampler.start()
        prefix = "rt"
        run.stats, info = steady_once(system, rate, duration_s, lead_s, drain_s, prefix, opts.profile_s,
                                      backlog_s, backlog_s + ttl_seconds(ttl))
        run.info.update(info)
        run.info["run_ended_at"] = time.time()
        time.sleep(tail_s)
        sampler.stop()
        records = system.fleet.records(prefix + "-")
        snapshots = [e for n in system.cluster.nodes for e in snapshot_events(n.log_path)]
    finally:
        sampler.halt()
        system.teardown()
        run.info["uptime"].append(f"after: {uptime_line()}")
    if sampler.error:
        raise BenchError(f"sampling failed: {sampler.error}")
    run.samples = sampler.samples
    window_lateness(records, run.samples)
    window_costs(run.samples, snapshots)
    if records:
        run.first_due = min(r.due for r in records)
        run.last_due = max(r.due for r in records)
    for s in run.samples:
        s["t_from_first_due_s"] = s["at"] - run.first_due
    return run


# ---- the report ------------------------------------------------------------------------

def _mb(value: Any) -> str:
    return "-" if value is None else f"{value / MB:,.1f}"


def _per_node(sample: dict[str, Any], key: str) -> str:
    return "/".join(_mb(n.get(key)) for n in sample["nodes"])


def _count(value: Any) -> str:
    return "?" if value is None else f"{value:,}"


def sample_table(run: Run) -> str:
    names = "/".join(n["node"] for n in run.samples[0]["nodes"]) if run.samples else ""
    head = ["t (s)", f"data.mdb MB {names}", f"snapshot MB {names}", f"RSS MB {names}", f"anon RSS MB {names}",
            "jobs", "runs", "deleted jobs", "deleted runs", "due in window", "window p50", "window p99",
            "server CPU µs/job", "snapshots (longest s)"]
    out = [f"### {run.label}: every sample (jobs, runs, deleted: the leader's /metrics; window: jobs due "
           "since the sample before)", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in run.samples:
        lead = _leader_view(s)
        w = s.get("window", {})
        out.append("| " + " | ".join([
            f"{s['t_s']:.0f}", _per_node(s, "data_mdb_bytes"), _per_node(s, "snapshot_bytes"),
            _per_node(s, "rss_bytes"), _per_node(s, "rss_anon_bytes"), _count(lead.get("jobs")),
            _count(lead.get("runs")), _count(lead.get("deleted_jobs")), _count(lead.get("deleted_runs")),
            _count(w.get("due")) if w else "", fmt(w.get("lateness_p50_s"), "ms") if w.get("due") else "",
            fmt(w.get("lateness_p99_s"), "ms") if w.get("due") else "",
            f"{w['cpu_us_per_job']:.0f}" if w.get("cpu_us_per_job") is not None else "",
            _snapshots(w)]) + " |")
    return "\n".join(out)


def _snapshots(window: dict[str, Any]) -> str:
    if not window.get("snapshots"):
        return "0" if window else ""
    return f"{window['snapshots']} ({window['snapshot_max_s']:.1f})"


def compare_table(runs: list[Run]) -> str:
    """Both runs' samples at the same t: the leader's data.mdb, jobs stored and window p99."""
    a, b = runs
    head = ["t (s)"] + [f"{what}, {r.label}" for what in ("leader data.mdb MB", "jobs", "window p99")
                        for r in runs]
    out = ["### side by side, sample by sample", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for sa, sb in zip(a.samples, b.samples):
        la, lb = _leader_view(sa), _leader_view(sb)
        wa, wb = sa.get("window", {}), sb.get("window", {})
        out.append("| " + " | ".join([
            f"{sa['t_s']:.0f}", _mb(la.get("data_mdb_bytes")), _mb(lb.get("data_mdb_bytes")),
            _count(la.get("jobs")), _count(lb.get("jobs")),
            fmt(wa.get("lateness_p99_s"), "ms") if wa.get("due") else "",
            fmt(wb.get("lateness_p99_s"), "ms") if wb.get("due") else ""]) + " |")
    return "\n".join(out)


@dataclass
class SampledReport(Report):
    """A Report followed by per-sample tables."""
    tables: list[str] = field(default_factory=list)

    def render(self) -> str:
        return "\n\n".join([super().render(), *self.tables])


def _growth_mb_per_min(run: Run, node: int) -> float | None:
    """data.mdb growth of one node over the second half of the due times, MB per minute."""
    mid = run.first_due + (run.last_due - run.first_due) / 2
    inside = [s for s in run.samples if mid <= s["at"] <= run.last_due + 1]
    sizes = [(s["at"], s["nodes"][node].get("data_mdb_bytes")) for s in inside]
    sizes = [(t, v) for t, v in sizes if v is not None]
    if len(sizes) < 2 or sizes[-1][0] <= sizes[0][0]:
        return None
    return (sizes[-1][1] - sizes[0][1]) / MB / ((sizes[-1][0] - sizes[0][0]) / 60)


def _summary_rows(report: Report, runs: list[Run]) -> None:
    by = {r.label: r for r in runs}
    report.add("jobs done/s", {k: r.stats["done_per_s"] for k, r in by.items()}, None)
    _lateness_rows(report, {k: r.stats for k, r in by.items()})
    report.add("samples taken", {k: len(r.samples) for k, r in by.items()}, None)
    last = {k: r.samples[-1] for k, r in by.items()}
    for i, node in enumerate(runs[0].samples[-1]["nodes"]):
        name = node["node"]
        report.add(f"{name} data.mdb at the end (MB)", {k: _val(s, i, "data_mdb_bytes", MB) for k, s in last.items()},
                   None)
        report.add(f"{name} data.mdb growth, 2nd half of the due times (MB/min)",
                   {k: _growth_mb_per_min(r, i) for k, r in by.items()}, None)
        report.add(f"{name} snapshot at the end (MB)", {k: _val(s, i, "snapshot_bytes", MB) for k, s in last.items()},
                   None)
        report.add(f"{name} RSS at the end / max (MB)",
                   {k: f"{fmt(_val(s, i, 'rss_bytes', MB))} / {fmt(_max(by[k], i, 'rss_bytes', MB))}"
                    for k, s in last.items()}, None)
    for key, label in (("jobs", "jobs stored at the end"), ("runs", "runs stored at the end"),
                       ("deleted_jobs", "jobs deleted by the TTL"), ("deleted_runs", "runs deleted by the TTL")):
        report.add(f"{label} (leader)", {k: _leader_view(s).get(key) for k, s in last.items()}, None)
    _cpu_rows(report, {k: r.info for k, r in by.items()})


def _val(sample: dict[str, Any], i: int, key: str, unit: float) -> float | None:
    v = sample["nodes"][i].get(key)
    return None if v is None else v / unit


def _max(run: Run, i: int, key: str, unit: float) -> float | None:
    values = [s["nodes"][i].get(key) for s in run.samples if s["nodes"][i].get(key) is not None]
    return max(values) / unit if values else None


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b and not math.isnan(a) and not math.isnan(b) and b > 0 else "n/a"


def retention(opts: Options, ttl: str, rate: float, duration_s: float, lead_s: float, drain_s: float,
              sample_s: float, tail_s: float, compare: bool, backlog_s: float = 0.0,
              limits: tuple[str, ...] = ()) -> Report:
    ttl_s = ttl_seconds(ttl)
    if compare and ttl_s == 0:
        raise BenchError("--compare runs --finished-ttl 0 after the first run: give a non-zero --finished-ttl")
    if sample_s <= 0:
        raise BenchError("--sample-s must be > 0")
    if not 0 <= backlog_s <= duration_s or (backlog_s and ttl_s == 0):
        raise BenchError(f"--backlog-s {backlog_s:g}: between 0 and --duration, with a non-zero --finished-ttl")
    for limit in limits:
        if "=" not in limit:
            raise BenchError(f"--limit {limit!r}: give NAME=VALUE, as the daemon's --limit")
    labels = [f"--finished-ttl {ttl}"] + (["--finished-ttl 0"] if compare else [])
    report = SampledReport(f"retention: {rate:g} one-off jobs/s for {duration_s:g} s, sampled every {sample_s:g} s, "
                           + " vs ".join(labels), labels)
    runs: list[Run] = []
    report.raw["uptime"] = []
    for tag, label, node_ttl in zip(("ttl", "nottl"), labels, (ttl, "0")):
        run_opts = replace(opts, run_dir=os.path.join(opts.run_dir, tag))
        run = retention_once(run_opts, label, node_ttl, rate, duration_s, lead_s, drain_s, sample_s, tail_s,
                             backlog_s if node_ttl != "0" else 0.0, limits)
        runs.append(run)
        report.raw["uptime"] += [f"{label} {line}" for line in run.info["uptime"]]
    _summary_rows(report, runs)
    first = runs[0]
    last = _leader_view(first.samples[-1])
    if ttl_s and not first.samples[-1]["nodes"][0].get("retention_metric", True):
        report.notes.append("no schedulerd_retention_deleted_total in /metrics: deleted counts read as 0")
    if ttl_s and not last.get("deleted_jobs"):
        report.notes.append(f"{first.label}: no job was deleted by the end of the run (TTL {ttl_s:g} s)")
    if compare:
        a, b = (r.stats for r in runs)
        report.notes.append(f"lateness {labels[0]} / {labels[1]}: p50 "
                            f"{_ratio(a['lateness_p50_s'], b['lateness_p50_s'])}, p99 "
                            f"{_ratio(a['lateness_p99_s'], b['lateness_p99_s'])} (> 1: the TTL run was later); "
                            "the two runs are sequential, so compare their box slowdown rows too")
    due_from = lead_s + PROCESS_START_S
    report.notes.append(f"t is seconds since sampling began, just before the first create; the first job is due "
                        f"at t ≈ {due_from:g}, the last at t ≈ {due_from + duration_s:g}; sampling goes on "
                        f"{tail_s:g} s after the last ack (--tail-s)")
    if backlog_s:
        report.notes.append(f"backlog: the {round(backlog_s * rate):,} jobs due at t ≈ {due_from:g}–"
                            f"{due_from + backlog_s:g} all expire at t ≈ {due_from + backlog_s + ttl_s:g}, beside "
                            "the steady load; the windows from then show the sweep's toll")
    if limits:
        report.notes.append("every node ran with " + " ".join(f"--limit {limit}" for limit in limits))
    report.notes += [series.render(r.label, r.info["series"]) for r in runs]
    report.tables = [sample_table(r) for r in runs] + ([compare_table(runs)] if compare else [])
    # Each run's info (CPU, series, profile) is in infos, keyed by its label, as __main__ reads it.
    report.raw.update(ttl=ttl, ttl_s=ttl_s, runs=[{"label": r.label, "ttl": r.ttl, "stats": r.stats,
                                                   "samples": r.samples, "first_due": r.first_due,
                                                   "last_due": r.last_due} for r in runs],
                      stats={r.label: r.stats for r in runs}, infos={r.label: r.info for r in runs})
    return report
