"""schedulerd under test: a 3-node cluster of `python -m schedulerd.main`
subprocesses on free 127.0.0.1 ports, worker processes (`bench.sdworker`,
the SDK), and `SdSystem`, which drives them with the feeder (`bench.feeder`).

Nothing here talks to anything but 127.0.0.1, and everything started is
stopped by `SdSystem.teardown()` (call it from a `finally`)."""
from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from bench.common import (ROOT, WORKER_SLOTS, BenchError, CpuMeter, Record, die_with_parent, du_bytes, fmt,
                          free_port_runs, iso_us, percentile, rss_bytes, wait_until)
from bench.feeder import QUEUE, create_jobs, feed_oneoff, job_body
from bench.plan import OneOff

BATCH_MAX = 100  # the server's create_batch_max
NODE_START_S_MAX = 60.0
STOP_S_MAX = 15.0
# A fresh cluster refuses queue limits (409) until its nodes have exchanged the entry
# versions they read, a few seconds after they start.
QUEUE_LIMITS_S_MAX = 30.0


def http_json(method: str, url: str, body: Any = None, timeout_s: float = 5.0) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@dataclass(frozen=True)
class QueueLimits:
    """A queue's limits as `PUT /v1/queues/{name}` takes them; None: no such limit."""
    max_running: int | None = None
    max_starts_per_s: float | None = None

    def __str__(self) -> str:
        shown = {k: "none" if v is None else fmt(v) for k, v in asdict(self).items()}
        return f"queue {QUEUE!r} limits: " + ", ".join(f"{k} {v}" for k, v in shown.items())


@dataclass
class Node:
    name: str
    http_port: int
    raft_addr: str
    peers: list[str]
    data_dir: str
    log_path: str
    proc: subprocess.Popen | None = None
    extra_args: tuple[str, ...] = ()  # more daemon flags, e.g. ("--finished-ttl", "60s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        args = [sys.executable, "-m", "schedulerd.main", "--data-dir", self.data_dir,
                "--http", f"127.0.0.1:{self.http_port}", "--raft", self.raft_addr, "--peers", ",".join(self.peers),
                *self.extra_args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=die_with_parent)

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(STOP_S_MAX)
            self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_S_MAX)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_S_MAX)
        self.proc = None

    def group0(self) -> dict[str, Any]:
        status, body = http_json("GET", self.url + "/v1/cluster")
        if status != 200:
            raise BenchError(f"{self.name}: /v1/cluster {status}")
        return body["groups"][0]

    def digest(self) -> tuple[int, str]:
        status, body = http_json("GET", self.url + "/v1/cluster/digest", timeout_s=60)
        if status != 200:
            raise BenchError(f"{self.name}: digest {status}")
        g = body["groups"][0]
        return g["last_applied"], g["digest"]

    def ready(self) -> bool:
        return http_json("GET", self.url + "/readyz", timeout_s=2)[0] == 200


class SdCluster:
    def __init__(self, base_dir: str, n: int = 3, extra_args: tuple[str, ...] = (), groups: int = 1) -> None:
        """extra_args: daemon flags every node gets after the ones the cluster needs."""
        self.groups = groups
        if groups > 1:
            extra_args = ("--groups", str(groups), *extra_args)
        # A node's Raft port, its other data groups' and its metadata group's after it.
        ports = free_port_runs(2 * n, groups + 1)
        raft = [f"127.0.0.1:{ports[n + i]}" for i in range(n)]
        self.base_dir = base_dir
        self.extra_args = tuple(extra_args)
        self.nodes = [Node(f"n{i}", ports[i], raft[i], [r for j, r in enumerate(raft) if j != i],
                           os.path.join(base_dir, f"n{i}"), os.path.join(base_dir, f"n{i}.log"),
                           extra_args=self.extra_args)
                      for i in range(n)]

    def join_node(self) -> Node:
        """Start one more node that joins the running cluster through node 0 (--join)."""
        http_port, raft_port = free_port_runs(2, self.groups + 1)
        name = f"n{len(self.nodes)}"
        node = Node(name, http_port, f"127.0.0.1:{raft_port}", [], os.path.join(self.base_dir, name),
                    os.path.join(self.base_dir, f"{name}.log"),
                    extra_args=(*self.extra_args, "--join", self.nodes[0].url))
        self.nodes.append(node)
        node.start()
        return node

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def pids(self) -> list[int]:
        return [n.pid for n in self.nodes if n.pid is not None]

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            wait_until(node.ready, NODE_START_S_MAX, f"{node.name} /readyz")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def leader(self, timeout_s: float = 15.0) -> Node:
        def find() -> Node | None:
            for node in self.nodes:
                if node.proc is not None and node.group0()["is_leader"]:
                    return node
            return None
        return wait_until(find, timeout_s, "a leader", interval_s=0.02)

    def wipe_and_restart(self, node: Node) -> None:
        node.kill9()
        shutil.rmtree(node.data_dir)
        node.start()

    def rss_and_disk(self) -> list[dict[str, Any]]:
        return [{"node": n.name, "rss_bytes": rss_bytes(n.pid) if n.pid else 0, "data_bytes": du_bytes(n.data_dir)}
                for n in self.nodes]


class WorkerFleet:
    """`processes` worker processes of `concurrency` slots each, all polling every node.
    A worker stops by itself after lifetime_s (None: bench.sdworker's default, 900 s)."""

    def __init__(self, urls: list[str], out_dir: str, processes: int, concurrency: int,
                 lifetime_s: float | None = None) -> None:
        self.urls, self.out_dir = urls, out_dir
        self.processes, self.concurrency = processes, concurrency
        self.lifetime_s = lifetime_s
        self.procs: list[subprocess.Popen] = []
        self._offsets: dict[str, int] = {}
        self._ack_lines: dict[str, tuple[int, int]] = {}  # acks file -> (bytes counted, lines in them)
        self.starts: dict[str, tuple[str, float, float]] = {}  # run_id -> (job_id, scheduled, start)
        self.acks: dict[str, float] = {}  # run_id -> first ack time
        self.acked_per_plan: dict[str, int] = {}  # job id prefix ("st" of "st-17") -> runs acked
        self._unplaced: set[str] = set()  # acked runs whose start line has not been read yet
        self.redelivered = 0

    def start(self) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        for i in range(self.processes):
            args = [sys.executable, "-m", "bench.sdworker", "--servers", ",".join(self.urls), "--queue", QUEUE,
                    "--out", os.path.join(self.out_dir, f"w{i}"), "--concurrency", str(self.concurrency)]
            if self.lifetime_s is not None:
                args += ["--lifetime-s", f"{self.lifetime_s:g}"]
            with open(os.path.join(self.out_dir, f"w{i}.log"), "ab") as log:
                self.procs.append(subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                                   preexec_fn=die_with_parent))

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.poll() is None]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(STOP_S_MAX + 5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(STOP_S_MAX)
        self.procs = []

    def _tail(self, path: str) -> list[list[str]]:
        """Complete new lines of a file since the last read."""
        chunk = _read_from(path, self._offsets.get(path, 0))
        end = chunk.rfind(b"\n") + 1
        self._offsets[path] = self._offsets.get(path, 0) + end
        return [line.split("\t") for line in chunk[:end].decode().splitlines()]

    def refresh(self) -> None:
        for i in range(self.processes):
            base = os.path.join(self.out_dir, f"w{i}")
            for run_id, job_id, sched, start in self._tail(base + ".starts.tsv"):
                if run_id in self.starts:
                    self.redelivered += 1
                    continue
                self.starts[run_id] = (job_id, float(sched), float(start))
            for run_id, t in self._tail(base + ".acks.tsv"):
                if run_id not in self.acks:
                    self.acks[run_id] = float(t)
                    self._unplaced.add(run_id)
        # A worker writes a start and its ack in one flush when the handler is quick; this read
        # can come between the two files, and the ack then waits for the next read of its start.
        for run_id in [r for r in self._unplaced if r in self.starts]:
            self._unplaced.discard(run_id)
            plan = self.starts[run_id][0].rpartition("-")[0]
            self.acked_per_plan[plan] = self.acked_per_plan.get(plan, 0) + 1

    def ack_lines(self) -> int:
        """Ack lines the workers have written so far, counted without parsing them. A run
        acked twice (redelivered) counts twice."""
        total = 0
        for i in range(self.processes):
            path = os.path.join(self.out_dir, f"w{i}.acks.tsv")
            offset, lines = self._ack_lines.get(path, (0, 0))
            chunk = _read_from(path, offset)
            self._ack_lines[path] = (offset + len(chunk), lines + chunk.count(b"\n"))
            total += self._ack_lines[path][1]
        return total

    def records(self, prefix: str) -> list[Record]:
        self.refresh()
        return [Record(f"{job_id}@{sched:.6f}", sched, start, self.acks.get(run_id, math.nan))
                for run_id, (job_id, sched, start) in self.starts.items() if job_id.startswith(prefix)]

    def acked_count(self, plan_prefix: str) -> int:
        """Runs acked of jobs named f"{plan_prefix}-{k}"."""
        self.refresh()
        return self.acked_per_plan.get(plan_prefix, 0)


def _read_from(path: str, offset: int) -> bytes:
    """What a worker's records file holds past `offset`; nothing before the worker writes it."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return b""


# ---- the system under test, as the scenarios see it --------------------------------------

class SdSystem:
    name = "schedulerd"
    replicated = "3 replicas (Raft), journal fdatasync + LMDB sync on every node"

    def __init__(self, run_dir: str, workers: int = 4, concurrency: int = WORKER_SLOTS, in_flight: int = 16,
                 node_args: tuple[str, ...] = (), worker_lifetime_s: float | None = None, groups: int = 1,
                 nodes: int = 3) -> None:
        """node_args: extra daemon flags of every node; worker_lifetime_s: the workers'
        --lifetime-s (None: their default, 900 s), for runs longer than that."""
        self.dir = os.path.join(run_dir, "schedulerd")
        self.cluster = SdCluster(self.dir, nodes, extra_args=node_args, groups=groups)
        self.fleet = WorkerFleet(self.cluster.urls, os.path.join(self.dir, "workers"), workers, concurrency,
                                 worker_lifetime_s)
        self.in_flight = in_flight

    def pids(self) -> dict[str, list[int]]:
        return {"server": self.cluster.pids(), "clients": [*self.fleet.pids(), os.getpid()]}

    def setup(self, with_workers: bool = True) -> None:
        os.makedirs(self.dir, exist_ok=True)
        self.cluster.start()
        if with_workers:
            self.fleet.start()

    def teardown(self) -> None:
        try:
            self.fleet.stop()
        finally:
            self.cluster.stop()

    def limit_queue(self, limits: QueueLimits, timeout_s: float = QUEUE_LIMITS_S_MAX) -> dict[str, Any]:
        """PUT the limits on the queue the bench's jobs use; a 409 is retried until timeout_s,
        as a fresh cluster answers it until its nodes read the limits' entry version. Returns
        the queue as the node answered it (the limits and each group's share)."""
        url = f"{self.cluster.nodes[0].url}/v1/queues/{QUEUE}"
        body = asdict(limits)
        deadline = time.monotonic() + timeout_s
        while True:
            status, answer = http_json("PUT", url, body)
            if status == 200:
                return answer
            if status != 409 or time.monotonic() >= deadline:
                raise BenchError(f"PUT /v1/queues/{QUEUE} {body}: HTTP {status} {answer}")
            time.sleep(0.2)

    def create(self, count: int, concurrency: int, batch: int, prefix: str) -> dict[str, Any]:
        far = iso_us(time.time() + 365 * 86_400)
        bodies = [job_body(f"{prefix}-{k}", {"at": far}) for k in range(count)]
        t0 = time.monotonic()
        stats = asyncio.run(create_jobs(self.cluster.urls, bodies, batch, concurrency))
        elapsed = time.monotonic() - t0
        lat = sorted(stats.request_latency_s)
        return {"created": stats.created, "failed": stats.failed, "retries": stats.retries, "elapsed_s": elapsed,
                "jobs_per_s": stats.created / elapsed, "p50_s": percentile(lat, 50), "p99_s": percentile(lat, 99)}

    def _counters(self) -> dict[str, dict[str, Any]]:
        out = {}
        for n in self.cluster.nodes:
            try:
                g = n.group0()
            except (BenchError, OSError):
                continue
            out[n.name] = {"leader": g["is_leader"], "commit_index": g["commit_index"],
                           "fsyncs": g["journal_fsync"]["count"], "fsync_s": g["journal_fsync"]["time_s_total"]}
        return out

    def _counter_delta(self, before: dict[str, Any], after: dict[str, Any], wall_s: float,
                       node_cpu: dict[str, float]) -> dict[str, Any]:
        """Raft entries/s, journal fdatasyncs/s and their mean, and CPU, per node."""
        out = {}
        for name, b in before.items():
            a = after.get(name)
            if a is None:
                continue
            syncs = a["fsyncs"] - b["fsyncs"]
            entries = a["commit_index"] - b["commit_index"]
            out[name] = {"leader": a["leader"], "entries_per_s": round(entries / wall_s, 1),
                         "fsyncs_per_s": round(syncs / wall_s, 1),
                         "fsync_ms_mean": round(1000 * (a["fsync_s"] - b["fsync_s"]) / syncs, 3) if syncs else None,
                         "cpu_cores": node_cpu.get(name)}
        return out

    def oneoff(self, plan: OneOff, drain_s: float) -> tuple[list[Record], dict[str, Any]]:
        """Feed the plan, wait until every job is acked (or last due + drain_s)."""
        meter = CpuMeter({"server": self.cluster.pids, "clients": lambda: self.pids()["clients"]})
        per_node = CpuMeter({n.name: (lambda n=n: [n.pid] if n.pid else []) for n in self.cluster.nodes})
        counters = self._counters()
        acks_before = self.fleet.ack_lines()
        meter.begin()
        per_node.begin()
        stats = asyncio.run(feed_oneoff(self.cluster.urls, plan, BATCH_MAX, self.in_flight))
        created_at = time.time()
        deadline = max(plan.last_due, created_at) + drain_s
        while time.time() < deadline and not self._all_acked(plan, acks_before):
            time.sleep(0.2)
        wall_s = meter.elapsed_s()
        cpu = meter.end()
        nodes = self._counter_delta(counters, self._counters(), wall_s, per_node.end())
        info = {"created": stats.created, "create_failed": stats.failed, "create_retries": stats.retries,
                "late_creates": stats.late, "created_at": created_at, "cpu_cores": cpu, "nodes": nodes, "wall_s": wall_s,
                "unacked": plan.count - self.fleet.acked_count(plan.prefix)}
        return self.fleet.records(plan.prefix + "-"), info

    def _all_acked(self, plan: OneOff, acks_before: int) -> bool:
        """Whether every job of the plan was acked. The workers' records are read (parsed)
        only once their ack lines could add up to the plan: parsed every 0.2 s from the
        end of the feeding, 60 s of them at 10,000 jobs/s took this process 0.4-0.6 cores
        in the last seconds of due times, when the cluster under test had the most to do,
        and parsed as they come, ~0.05 cores all along."""
        return (self.fleet.ack_lines() - acks_before >= plan.count
                and self.fleet.acked_count(plan.prefix) >= plan.count)

    def cron(self, jobs: int, minutes: int, drain_s: float, prefix: str) -> tuple[list[Record], dict[str, Any]]:
        bodies = [job_body(f"{prefix}-{k}", {"cron": "* * * * *"}) for k in range(jobs)]
        stats = asyncio.run(create_jobs(self.cluster.urls, bodies, BATCH_MAX, self.in_flight))
        created_at = time.time()
        first = first_full_minute(created_at)
        window = {first + 60 * m for m in range(minutes)}
        meter = CpuMeter({"server": self.cluster.pids, "clients": lambda: self.pids()["clients"]})
        meter.begin()
        deadline = max(window) + drain_s
        while time.time() < deadline:
            recs = [r for r in self.fleet.records(prefix + "-") if round(r.due) in window]
            if len(recs) >= jobs * minutes and all(not math.isnan(r.done) for r in recs):
                break
            time.sleep(0.5)
        cpu = meter.end()
        recs = [r for r in self.fleet.records(prefix + "-") if round(r.due) in window]
        return recs, {"created": stats.created, "create_failed": stats.failed, "created_at": created_at,
                      "first_minute": first, "cpu_cores": cpu}


def first_full_minute(created_at: float, margin_s: float = 5.0) -> float:
    """The first minute boundary at least margin_s after every job exists."""
    return math.ceil((created_at + margin_s) / 60) * 60
