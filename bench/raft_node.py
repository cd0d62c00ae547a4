"""One node of the bench/raft_fsync.py cluster, run in its own process ('spawn').

The parent talks to each node over a multiprocessing Pipe:
    ("status",)        -> {"leader", "ready", "has_quorum", "journal"}
    ("counters",)      -> {"journal_fsync": {count, time_s_total, time_s_max} or None,
                           "truncations": {calls, entries}, "pysyncobj_warnings"}
                          (totals since start-up)
    ("run", params)    -> the result of one workload (leader only)
    ("stop",)          -> the counters, then exit
A node exits by itself after `lifetime_s` or when the parent goes away.

Variants (what the journal under the Raft log is):
    durable         raft.journal.DurableJournal, wired by make_durable (production)
    nofsync         pysyncobj's own FileJournal: an mmap that is never fsynced
    durable-nohook  DurableJournal without make_durable: the same file format and
                    write path, fsynced only by its once-a-second meta timer
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import time
from multiprocessing.connection import Connection
from typing import Any, Iterator

import pysyncobj.journal

from raft import journal, segments
from raft.conf import RaftConfig
from raft.group import Group, ProposalFailed
from storage import ops
from storage.ops import Op

US = 1_000_000
FAR_FUTURE_US = 10 * 366 * 86_400 * US  # jobs fire in ten years: nothing becomes due
PROPOSE_TIMEOUT_S = 10.0  # one proposal that takes longer than this is an error, not a sample
POLL_S = 0.2
ERROR_BACKOFF_S = 0.05  # after a failed proposal, so a leaderless cluster is not spun on


class PlainFileJournal(pysyncobj.journal.FileJournal):
    """pysyncobj's FileJournal unchanged, plus the `path` raft.journal's registry reads
    (`_create_journal` stores every journal under `journal.path`) and the `size_bytes()`
    raft.group's compaction check asks for every tick (kept as a running total)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = os.path.abspath(path)
        self._live_bytes = self._framed(0, len(self))

    def _framed(self, start: int, stop: int) -> int:
        return sum(segments.record_bytes(self[i]) for i in range(start, stop))

    def size_bytes(self) -> int:
        """What raft.group weighs for compaction: the entries' size as DurableJournal frames them."""
        return self._live_bytes

    def add(self, command: bytes, idx: int, term: int) -> None:
        super().add(command, idx, term)
        self._live_bytes += segments.record_bytes((command, idx, term))

    def clear(self) -> None:
        super().clear()
        self._live_bytes = 0

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        self._live_bytes -= self._framed(entryFrom, len(self))
        super().deleteEntriesFrom(entryFrom)

    def deleteEntriesTo(self, entryTo: int) -> None:
        self._live_bytes -= self._framed(0, min(entryTo, len(self)))
        super().deleteEntriesTo(entryTo)


def _skip_make_durable(syncobj: Any, log_journal: Any) -> None:
    """The variant's point: no fsync hooks (and FileJournal has no sync() to hook)."""


def install_variant(variant: str) -> type:
    """Set up raft.journal in this process for `variant`; returns the expected journal class.

    Group.__init__ calls `journal.install()` with its own DurableJournal factory, so
    installing a factory before building a Group has no effect. For `nofsync` we
    wrap install() so Group's own call installs ours instead."""
    if variant == "durable":
        return journal.DurableJournal
    if variant == "nofsync":
        real_install = journal.install
        journal.install = lambda factory=None: real_install(PlainFileJournal)
        journal.make_durable = _skip_make_durable
        return PlainFileJournal
    if variant == "durable-nohook":
        journal.make_durable = _skip_make_durable
        return journal.DurableJournal
    raise ValueError(f"unknown variant {variant!r}")


def node_main(variant: str, addrs: list[str], index: int, data_dir: str, conn: Connection,
              lifetime_s: float) -> None:
    logging.basicConfig(level=logging.WARNING, format=f"node{index} %(levelname)s %(name)s %(message)s")
    expected = install_variant(variant)
    conf = RaftConfig(self_addr=addrs[index], peers=tuple(a for a in addrs if a != addrs[index]),
                      data_dir=data_dir)
    conf.validate()
    warnings = _WarningCounter()
    pysyncobj_log = logging.getLogger("pysyncobj")
    pysyncobj_log.addHandler(warnings)
    pysyncobj_log.propagate = False
    group = Group(0, conf)
    if type(group.journal) is not expected:
        group.destroy()
        raise RuntimeError(f"variant {variant}: journal is {type(group.journal).__name__}, "
                           f"expected {expected.__name__}")
    node = _Node(group, _count_truncations(group.journal), warnings)
    deadline = time.monotonic() + lifetime_s
    try:
        _serve(node, conn, deadline)
    finally:
        group.destroy()
        try:
            conn.send(node.counters())
        except (OSError, ValueError):
            pass  # the parent is gone


@dataclasses.dataclass
class _Node:
    group: Group
    truncations: dict[str, int]
    warnings: "_WarningCounter"

    def counters(self) -> dict[str, Any]:
        """Totals since start-up (fsync: DurableJournal only)."""
        stats = getattr(self.group.journal, "stats", None)
        return {"journal_fsync": _total(_retired_stats + [stats]) if stats is not None else None,
                "truncations": dict(self.truncations), "pysyncobj_warnings": dict(self.warnings.counts),
                "cpu_s": _own_cpu_s()}


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def _total(parts: list[journal.SyncStats]) -> dict[str, float]:
    return {"count": sum(p.count for p in parts), "time_s_total": sum(p.time_s_total for p in parts),
            "time_s_max": max(p.time_s_max for p in parts)}


class _WarningCounter(logging.Handler):
    """Counts pysyncobj's warnings by message template; prints only the first of each."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        key = f"{record.levelname} {record.msg}"
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.counts[key] == 1:
            print(f"{record.name} {record.levelname} {record.getMessage()} (first of its kind; counted)",
                  file=sys.stderr, flush=True)


def _count_truncations(log_journal: Any) -> dict[str, int]:
    """Wrap this journal's deleteEntriesFrom (pysyncobj calls it through the instance)
    to count calls that dropped entries, and the entries dropped."""
    counts = {"calls": 0, "entries": 0}
    delete = log_journal.deleteEntriesFrom

    def counting(entry_from: int) -> None:
        before = len(log_journal)
        delete(entry_from)
        if len(log_journal) < before:
            counts["calls"] += 1
            counts["entries"] += before - len(log_journal)

    log_journal.deleteEntriesFrom = counting
    return counts


def _serve(node: _Node, conn: Connection, deadline: float) -> None:
    while time.monotonic() < deadline:
        if not conn.poll(POLL_S):
            continue
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "status":
            conn.send(_status(node.group))
        elif message[0] == "counters":
            conn.send(node.counters())
        elif message[0] == "run":
            conn.send(asyncio.run(run_workload(node.group, message[1])))
        elif message[0] == "stop":
            return
        else:
            raise ValueError(f"unknown message {message!r}")


def _status(group: Group) -> dict[str, Any]:
    s = group.replica.getStatus()
    return {"leader": group.is_leader(), "ready": group.replica.isReady(),
            "has_quorum": s["has_quorum"], "journal": type(group.journal).__name__}


# -- workloads (run on the leader) ---------------------------------------------


def _job_ids(prefix: str) -> Iterator[str]:
    n = 0
    while True:
        n += 1
        yield f"{prefix}-{n}"


def _create_blob(ids: Iterator[str], jobs: int, version: int) -> bytes:
    now_us = time.time_ns() // 1000
    at_us = now_us + FAR_FUTURE_US
    specs = [{"job_id": next(ids), "schedule": {"kind": "at", "at_us": at_us},
              "schedule_spec": {"at": "ten years from now"}, "queue": "bench",
              "payload_json": "{}", "max_attempts": 3, "priority": 0} for _ in range(jobs)]
    return ops.encode(Op.CREATE_JOBS, {"now": now_us, "jobs": specs}, version)


async def run_workload(group: Group, params: dict[str, Any]) -> dict[str, Any]:
    name, callers, jobs = params["workload"]
    ids = _job_ids(f"{params['tag']}-{name}")
    return await _measure(group, name, callers, jobs, ids, params)


async def _measure(group: Group, name: str, callers: int, jobs: int, ids: Iterator[str],
                   params: dict[str, Any]) -> dict[str, Any]:
    """`callers` loops, each proposing one command of `jobs` jobs and awaiting it.

    Throughput counts commands that completed inside the measured window;
    latency samples are commands issued and completed inside it."""
    loop = asyncio.get_running_loop()
    window_start = loop.time() + params["warmup_s"]
    window_end = window_start + params["duration_s"]
    latencies: list[float] = []
    completed = [0]
    errors: dict[str, int] = {}
    window: dict[str, Any] = {}
    loop.call_at(window_start, _open_window, group, window)
    loop.call_at(window_end, _close_window, group, window)

    async def caller() -> None:
        while (start := loop.time()) < window_end:
            blob = _create_blob(ids, jobs, group.versions.writes())
            try:
                result = await asyncio.wait_for(group.propose(blob, loop), PROPOSE_TIMEOUT_S)
            except (ProposalFailed, asyncio.TimeoutError) as exc:
                key = f"{type(exc).__name__}: {exc}"
                errors[key] = errors.get(key, 0) + 1
                await asyncio.sleep(ERROR_BACKOFF_S)
                continue
            end = loop.time()
            rejected = sum(not r["ok"] for r in result.get("results", [])) if "results" in result else jobs
            if rejected:
                errors["jobs rejected"] = errors.get("jobs rejected", 0) + rejected
            if window_start <= end <= window_end:
                completed[0] += 1
                if start >= window_start:
                    latencies.append(end - start)

    await asyncio.gather(*(caller() for _ in range(callers)))
    return _summary(name, callers, jobs, params["duration_s"], completed[0], latencies, errors, window)


_retired_stats: list[journal.SyncStats] = []  # replaced at each window start, summed at stop


def _open_window(group: Group, window: dict[str, Any]) -> None:
    if isinstance(group.journal, journal.DurableJournal):
        _retired_stats.append(group.journal.stats)
        group.journal.stats = journal.SyncStats()  # the tick thread records into the new object
    window["cpu_s"] = time.process_time()
    window["leader_at_start"] = group.is_leader()


def _close_window(group: Group, window: dict[str, Any]) -> None:
    window["cpu_s"] = time.process_time() - window["cpu_s"]
    stats = getattr(group.journal, "stats", None)
    window["fsync"] = stats.summary() if stats is not None else None
    window["leader_at_end"] = group.is_leader()


def _summary(name: str, callers: int, jobs: int, duration_s: float, completed: int,
             latencies: list[float], errors: dict[str, int], window: dict[str, Any]) -> dict[str, Any]:
    latencies.sort()

    def pct(p: float) -> float | None:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else None

    return {
        "workload": name, "callers": callers, "jobs_per_command": jobs,
        "commands_per_s": completed / duration_s, "items_per_s": completed * jobs / duration_s,
        "p50_ms": pct(0.50), "p99_ms": pct(0.99), "samples": len(latencies),
        "errors": errors, "leader_cpu": window["cpu_s"] / duration_s, "fsync": window["fsync"],
        "stayed_leader": window["leader_at_start"] and window["leader_at_end"],
    }
