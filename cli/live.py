"""Live views: `schedctl runs JOB --follow` and `schedctl top`. Both poll the
API every --interval seconds until Ctrl-C; `top --once` prints one frame."""
from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any, Iterator, Mapping

import click
from prometheus_client.parser import text_string_to_metric_families

from schedulerd.cli.output import first_line, format_table, state_text
from schedulerd.cli.session import Session

LATENESS = "schedulerd_dispatch_lateness_seconds"
EVENTS = "schedulerd_run_events"


def follow_runs(session: Session, job_id: str, interval_s: float) -> None:
    """Print each run of the job as it appears or changes state, one line per change."""
    seen: dict[str, tuple[str, int]] = {}
    for _ in _ticks(interval_s):
        for run in session.client.job_runs(job_id, limit=100)["runs"]:
            key = (run["state"], run["attempt"])
            if seen.get(run["run_id"]) == key:
                continue
            seen[run["run_id"]] = key
            if session.as_json:
                click.echo(json.dumps(run, separators=(",", ":")))
                continue
            detail = first_line(run.get("error")) if run["state"] != "succeeded" else None
            click.echo("  ".join(part for part in (
                datetime.now().strftime("%H:%M:%S"), run["run_id"], state_text(run["state"]),
                f"attempt {run['attempt']}/{run.get('max_attempts', '?')}", run["scheduled_time"],
                run.get("worker_id") or "", detail or "") if part).rstrip())


def top(session: Session, interval_s: float, once: bool) -> None:
    """A frame every interval: leaders, queues, dispatch lateness and run events. The
    first frame counts since each node's start; later ones cover the last interval."""
    before: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    window: float | None = None
    for _ in _ticks(interval_s):
        now = _scrape(session)
        frame = _frame(session, before, now, window)
        if session.as_json:
            click.echo(json.dumps(frame, separators=(",", ":")))
        else:
            if not once:
                click.clear()
            click.echo(_render(frame))
        if once:
            return
        before, window = now, interval_s


def _ticks(interval_s: float) -> Iterator[int]:
    tick = 0
    try:
        while True:
            yield tick
            tick += 1
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return


def _scrape(session: Session) -> dict[str, Any]:
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(session.client.metrics()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def _frame(session: Session, before: Mapping, now: Mapping, interval_s: float | None) -> dict[str, Any]:
    cluster = session.client.cluster()
    queues = session.client.queues()["queues"]
    events = {dict(labels)["event"]: value - before.get((name, labels), 0.0)
              for (name, labels), value in now.items() if name == f"{EVENTS}_total"}
    by_bound: dict[float, float] = {}  # every queue's buckets together
    for (name, labels), value in now.items():
        if name == f"{LATENESS}_bucket":
            bound = float(dict(labels)["le"])
            by_bound[bound] = by_bound.get(bound, 0.0) + value - before.get((name, labels), 0.0)
    buckets = sorted(by_bound.items())
    return {
        "node": cluster["node"], "time": datetime.now().isoformat(timespec="seconds"),
        "window_s": interval_s,
        "groups": [{k: g.get(k) for k in ("group", "leader", "is_leader", "term", "commit_index", "last_applied")}
                   for g in cluster["groups"]],
        "queues": queues,
        "lateness_p50_s": _quantile(buckets, 0.5), "lateness_p99_s": _quantile(buckets, 0.99),
        "events": {k: v / interval_s for k, v in events.items()} if interval_s else events,
        "poll_waiters": cluster.get("poll_waiters"),
    }


def _quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket holding the q-th observation."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank, low, below = q * total, 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return low
            return low + (bound - low) * (rank - below) / max(count - below, 1e-12)
        low, below = bound, count
    return low


def _render(frame: Mapping[str, Any]) -> str:
    per = "/s" if frame["window_s"] else " since start"
    groups = format_table(("GROUP", "LEADER", "ROLE", "TERM", "COMMIT", "APPLIED"),
                          [(g["group"], g["leader"], "leader" if g["is_leader"] else "follower", g["term"],
                            g["commit_index"], g["last_applied"]) for g in frame["groups"]])
    queues = format_table(("QUEUE", "READY", "WAITING", "OLDEST_READY"),
                          [(q["queue"], q["ready"], q["waiting"],
                            f"{q['oldest_ready_age_s']:.1f}s" if q["ready"] else "-") for q in frame["queues"]])
    late = "  ".join(f"{name} {_ms(frame[key])}" for name, key in (("p50", "lateness_p50_s"),
                                                                   ("p99", "lateness_p99_s")))
    events = "  ".join(f"{k} {v:.1f}" for k, v in sorted(frame["events"].items()) if v) or "none"
    return "\n".join([
        f"schedulerd top  node {frame['node']}  {frame['time']}  polls waiting {frame['poll_waiters']}", "",
        groups, "", queues or "no queues", "",
        f"dispatch lateness ({'last ' + str(frame['window_s']) + ' s' if frame['window_s'] else 'since start'}): "
        f"{late}",
        f"run events{per}: {events}"])


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"
