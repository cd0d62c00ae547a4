"""py-spy on the schedulerd leader during a run, and a summary of where its CPU goes.

`py-spy record --format raw --threads --idle` writes collapsed stacks
("thread;frame;...;frame N"), idle samples included, so each thread's samples are
its wall time. The summary splits the wall time of the two threads that matter into
what they were doing (`TICK_PHASES`, `LOOP_PHASES`: first match wins), and lists the
lines with the most self samples per thread. A C call (LMDB commit with its fsync,
fdatasync, socket send, uvloop's epoll) shows as the Python line that made it; a
sample of a thread waiting for the GIL shows as the line it waits on."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections import Counter
from typing import Any

SAMPLE_RATE_HZ = 100
TOP_N = 25
_LINE = re.compile(r"^(.*) (\d+)$")
# Frames every sample of a thread passes through: they say nothing about where time goes.
_BOILERPLATE = re.compile(r"\((click/|<frozen runpy>|threading\.py|uvloop/__init__|asyncio/runners|schedulerd/main\.py)"
                          r"|^<module>|_autoTickThread")


def available() -> bool:
    return shutil.which("py-spy") is not None


class LeaderProfile(threading.Thread):
    """Starts `py-spy record` on pid at `start_at` (epoch s) for duration_s, in the background."""

    def __init__(self, pid_of_leader: Any, start_at: float, duration_s: float, out_path: str) -> None:
        super().__init__(daemon=True)
        self.pid_of_leader, self.start_at = pid_of_leader, start_at
        self.duration_s, self.out_path = duration_s, out_path
        self.error: str | None = None
        self.pid: int | None = None
        self.sched: dict[int, dict[str, float]] = {}

    def run(self) -> None:
        time.sleep(max(0.0, self.start_at - time.time()))
        try:
            self.pid = self.pid_of_leader()
            before, t0 = schedstat(self.pid), time.monotonic()
            subprocess.run(["py-spy", "record", "--pid", str(self.pid), "--duration", str(int(self.duration_s)),
                            "--rate", str(SAMPLE_RATE_HZ), "--format", "raw", "--threads", "--idle",
                            "--output", self.out_path],
                           capture_output=True, timeout=self.duration_s + 60, check=True)
            after, wall_s = schedstat(self.pid), time.monotonic() - t0
            self.sched = {tid: {"on_cpu_pct": round(100 * (a[0] - before[tid][0]) / 1e9 / wall_s, 1),
                                "runnable_waiting_pct": round(100 * (a[1] - before[tid][1]) / 1e9 / wall_s, 1)}
                          for tid, a in after.items() if tid in before}
        except (OSError, subprocess.SubprocessError) as exc:
            self.error = repr(exc)


def schedstat(pid: int) -> dict[int, tuple[int, int]]:
    """Per thread: (ns on a CPU, ns runnable but waiting for a CPU), from /proc/PID/task/*/schedstat.
    Wall time minus both is time the thread slept or blocked (I/O, fsync, a lock, the GIL, poll)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run_ns, wait_ns, _ = f.read().split()
            out[int(tid)] = (int(run_ns), int(wait_ns))
        except (OSError, ValueError):
            pass
    return out


# (label, substring of the joined stack or of the leaf frame): the pysyncobj tick thread.
TICK_PHASES = [
    ("idle: waiting on sockets (pysyncobj poller)", "leaf", "poller.py"),
    ("LMDB commit of the tick's txn [raft/store.py Store.commit_applied]", "leaf", "Store.commit_applied"),
    ("LMDB write txn begin", "leaf", "Store.apply_txn (raft/store.py"),
    ("journal fdatasync / meta rename [raft/journal.py]", "stack", "raft/journal.py"),
    ("apply: Python work of the state machine (decode, records, msgpack)", "stack", "__applyLogEntries"),
    ("send to followers (pickle + socket)", "stack", "__sendAppendEntries"),
    ("receive/handle Raft messages", "stack", "tcp_connection.py"),
    ("take new commands into the log", "stack", "_checkCommandsToApply"),
    ("log compaction / snapshot", "stack", "__tryLogCompaction"),
]
# The asyncio (uvloop) thread: HTTP API and the leader's scan loops.
LOOP_PHASES = [
    ("uvloop: epoll wait and C-level I/O (idle or busy in C)", "leaf", "Runner.run (asyncio/runners.py"),
    ("POST /v1/tasks/poll (lease queue)", "stack", "api/tasks.py:"),
    ("POST /v1/tasks/{id}/ack and /v1/tasks/ack", "stack", "ack_"),
    ("POST /v1/jobs:batch and /v1/jobs", "stack", "api/jobs.py"),
    ("leader loop: due scan + claim", "stack", "claim_due"),
    ("leader loop: lease expiry", "stack", "expire_leases"),
    ("lease queue (poll wait/wake, ready scan)", "stack", "lease_queue.py"),
    ("group commit (coalescer)", "stack", "coalescer.py"),
    ("aiohttp request parsing/response writing", "stack", "aiohttp/"),
    ("apply results handed back (call_soon_threadsafe)", "stack", "raft/group.py"),
]


def _phase(phases: list[tuple[str, str, str]], stack: str, leaf: str) -> str:
    for label, where, needle in phases:
        if needle in (leaf if where == "leaf" else stack):
            return label
    return "other: " + leaf[:70]


def summarize(path: str, sched: dict[int, dict[str, float]] | None = None) -> dict[str, Any]:
    tids: dict[str, int] = {}
    phases: dict[str, Counter[str]] = {"tick": Counter(), "loop": Counter()}
    lines: dict[str, Counter[str]] = {"tick": Counter(), "loop": Counter()}
    per_thread: Counter[str] = Counter()
    with open(path) as f:
        for raw in f:
            m = _LINE.match(raw.rstrip("\n"))
            if not m:
                continue
            stack, count = m.group(1).split(";"), int(m.group(2))
            frames = [fr.strip() for fr in stack[1:]]
            role = _thread_role(stack[0], frames)
            per_thread[role] += count
            tid = re.search(r"\((\d+)\)", stack[0])
            if tid and role in ("tick", "loop"):
                tids[role] = int(tid.group(1))
            if role not in phases or not frames:
                continue
            joined, leaf = ";".join(frames), frames[-1]
            phases[role][_phase(TICK_PHASES if role == "tick" else LOOP_PHASES, joined, leaf)] += count
            lines[role][leaf] += count

    def shares(c: Counter[str], n: int = TOP_N) -> list[tuple[str, float]]:
        total = sum(c.values())
        return [(k, round(100.0 * v / total, 1)) for k, v in c.most_common(n)] if total else []

    sched = sched or {}
    return {"rate_hz": SAMPLE_RATE_HZ, "samples_per_thread": dict(per_thread),
            "sched": {role: sched.get(tid) for role, tid in tids.items()},
            "tick_phases": shares(phases["tick"], 12), "loop_phases": shares(phases["loop"], 12),
            "tick_lines": shares(lines["tick"], 15), "loop_lines": shares(lines["loop"], 15)}


def _thread_role(thread: str, frames: list[str]) -> str:
    text = ";".join(frames)
    if "_autoTickThread" in text:
        return "tick"
    if "uvloop" in text or "Runner.run" in text:
        return "loop"
    return thread


def render(summary: dict[str, Any]) -> str:
    names = {"tick": "Raft tick thread (pysyncobj: log, replication, apply)", "loop": "event loop thread (HTTP API)"}
    rows = [f"py-spy --idle at {summary['rate_hz']} Hz; samples per thread: {summary['samples_per_thread']}"]
    for role in ("tick", "loop"):
        st = summary.get("sched", {}).get(role)
        if st:
            rows += ["", f"{names[role]}, from /proc schedstat over the same window: on a CPU {st['on_cpu_pct']}% "
                     f"of wall time, runnable but waiting for a CPU {st['runnable_waiting_pct']}%, the rest blocked "
                     f"or asleep (fsync, page faults, the GIL, poll)"]
        rows += ["", f"{names[role]}: share of its wall time", "", "| % | doing |", "|---|---|"]
        rows += [f"| {pct} | {label} |" for label, pct in summary[f"{role}_phases"]]
        rows += ["", f"{names[role]}: lines with most samples", "", "| % | line |", "|---|---|"]
        rows += [f"| {pct} | `{line}` |" for line, pct in summary[f"{role}_lines"]]
    return "\n".join(rows)
