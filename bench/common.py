"""Shared helpers of the `python -m bench` scenarios: ports, waiting with a
deadline, /proc readings (CPU, RSS), load, percentiles and lateness summaries.

Everything here is pure or reads /proc; nothing starts a process."""
from __future__ import annotations

import math
import os
import random
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from schedulerd.timefmt import to_iso
from schedulerd.units import US_PER_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# A run counts as "on time" for --find-max when its p99 lateness stays below this.
FIND_MAX_P99_S_MAX = 1.0
# Task slots per schedulerd worker process. The handler is an async no-op, so a slot
# costs nothing; at 300 a poll to each of three nodes asked for at most 100 tasks.
WORKER_SLOTS = 1500


class BenchError(Exception):
    """A benchmark could not be run as asked (a server did not start, a limit was hit)."""


def free_ports(n: int) -> list[int]:
    return free_port_runs(n, 1)


def _server_ports() -> tuple[int, int]:
    """Where ports for servers are drawn: below the kernel's ephemeral range. A port drawn in
    it could be taken, between the draw and the server's bind, as the source port of any
    outgoing connection (a test's own polls make 50 a second), and a node whose metadata
    port was taken that way never bootstrapped."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    return 10000, max(10000 + 1000, ephemeral_low)


def free_port_runs(n: int, width: int) -> list[int]:
    """n first ports of `width` consecutive ports each, all free a moment ago (a node's
    Raft port is the first of a run: its groups and its metadata group listen on the next)."""
    low, high = _server_ports()
    draw = random.Random()  # seeded from the OS: processes drawing at once pick apart
    held: list[socket.socket] = []
    firsts: list[int] = []
    try:
        while len(firsts) < n:
            first = draw.randrange(low, high - width)
            run = []
            try:
                for offset in range(width):
                    run.append(_bound(first + offset))
            except OSError:
                for sock in run:
                    sock.close()
                continue
            held += run
            firsts.append(first)
        return firsts
    finally:
        for sock in held:
            sock.close()


def _bound(port: int) -> socket.socket:
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    return sock


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # a server may refuse while it starts; keep waiting until the deadline
            last_error = exc
        time.sleep(interval_s)
    raise BenchError(f"timed out after {timeout_s:g} s waiting for {what}; last error: {last_error!r}")


def alternation(pairs: int) -> list[int]:
    """Which of two systems (0, 1) runs each measured turn: 0 1 1 0 0 1 ..., so a drift
    of the box's speed over the run slows both alike to first order."""
    return [k % 2 ^ (k // 2) % 2 for k in range(2 * pairs)]


def iso_us(ts: float) -> str:
    """Epoch seconds -> the API's ISO 8601 UTC form, to the microsecond. The daemon's own
    renderer, which caches each second's text: strftime per job nearly doubled what a
    request body cost the feeder, CPU taken from the cluster under test on a 2-core box."""
    seconds = math.floor(ts)
    return to_iso(seconds * US_PER_S + round((ts - seconds) * US_PER_S))  # rounded as datetime rounds


def loadavg() -> tuple[float, float, float]:
    return os.getloadavg()


def uptime_line() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: %.2f, %.2f, %.2f" % loadavg()


# ---- /proc readings ---------------------------------------------------------------

def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (its threads included), 0 if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        parts = [int(v) for v in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return (sum(parts[:8]) - idle) / CLK_TCK


def du_bytes(path: str) -> int:
    """Bytes allocated on disk under path (like `du -s`, sparse LMDB maps count what they use)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


@dataclass
class CpuMeter:
    """CPU used by named groups of processes, and by everything else, over a window."""
    groups: dict[str, Callable[[], list[int]]]
    _start: dict[str, float] = field(default_factory=dict)
    _pids: dict[str, list[int]] = field(default_factory=dict)
    _busy0: float = 0.0
    _t0: float = 0.0

    def begin(self) -> None:
        self._t0, self._busy0 = time.monotonic(), machine_busy_s()
        self._pids = {name: list(f()) for name, f in self.groups.items()}
        self._start = {name: sum(cpu_s(p) for p in pids) for name, pids in self._pids.items()}

    def elapsed_s(self) -> float:
        return time.monotonic() - self._t0

    def end(self) -> dict[str, float]:
        """Cores used on average per group, plus 'other' (processes not in any group)."""
        wall = max(1e-6, time.monotonic() - self._t0)
        out = {name: round((sum(cpu_s(p) for p in pids) - self._start[name]) / wall, 2)
               for name, pids in self._pids.items()}
        out["other"] = round(max(0.0, (machine_busy_s() - self._busy0) / wall - sum(out.values())), 2)
        return out


# ---- statistics -------------------------------------------------------------------

def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in 0..100); nan when empty."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass
class Record:
    """One executed occurrence: when it was due, when the handler started, when it was
    acked (schedulerd) or the callback returned (peers)."""
    key: str
    due: float
    start: float
    done: float


def summarize(records: Iterable[Record], expected: int, t_first_due: float) -> dict[str, Any]:
    """Lateness percentiles (seconds), completion throughput and what went missing."""
    first: dict[str, Record] = {}
    duplicates = 0
    for r in records:
        if r.key in first:
            duplicates += 1
            if r.start < first[r.key].start:
                first[r.key] = r
        else:
            first[r.key] = r
    late = sorted(r.start - r.due for r in first.values())
    done = sorted(r.done for r in first.values())
    last_done = done[-1] if done else math.nan
    span = last_done - t_first_due if done else math.nan
    return {
        "expected": expected, "ran": len(first), "missing": expected - len(first), "duplicates": duplicates,
        "lateness_p50_s": percentile(late, 50), "lateness_p99_s": percentile(late, 99),
        "lateness_max_s": late[-1] if late else math.nan,
        "lateness_mean_s": sum(late) / len(late) if late else math.nan,
        "early": sum(1 for v in late if v < -0.001),
        "done_per_s": len(done) / span if done and span > 0 else math.nan,
        "drain_s": span,
    }


def fmt(value: Any, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float):
        if unit == "ms":
            return f"{value * 1000:,.1f} ms" if value < 10 else f"{value:,.2f} s"
        if abs(value) >= 100:
            return f"{value:,.0f}{unit}"
        return f"{value:,.3g}{unit}"
    if isinstance(value, int):
        return f"{value:,}{unit}"
    return str(value)


def ratio(ours: Any, theirs: Any, higher_is_better: bool) -> str:
    """schedulerd's ratio to a peer, written as 'x' = how many times better (>1) or worse (<1)."""
    try:
        a, b = float(ours), float(theirs)
    except (TypeError, ValueError):
        return "n/a"
    if math.isnan(a) or math.isnan(b) or a <= 0 or b <= 0:
        return "n/a"
    return f"{(a / b if higher_is_better else b / a):.2f}x"


def descendants(pid: int) -> list[int]:
    """Every live process below pid (children, grandchildren...), from /proc."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent_of[int(entry)] = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent_of.items() if pp == p]
        out += kids
        frontier += kids
    return out


def die_with_parent() -> None:
    """preexec_fn for Popen: the child gets SIGTERM when the bench process dies, even by
    SIGKILL, so no server outlives a run (Linux prctl PR_SET_PDEATHSIG)."""
    import ctypes
    import signal
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
