"""Peer: Celery 5 with a local Redis broker, ETA tasks (`apply_async(eta=...)`),
one worker (prefork, 2 processes by default = the cores), and celery beat for the
recurring scenario. The bench starts its own `redis-server` on a free 127.0.0.1
port with persistence off (no RDB, no AOF): single node, unreplicated, no fsync.

Every process is started in its own session so teardown can end it and its pool
children by process group id."""
from __future__ import annotations

import glob
import os
import signal
import multiprocessing
import subprocess
import sys
import time
from datetime import datetime, timezone
from typing import Any

from bench.common import (ROOT, BenchError, CpuMeter, Record, descendants, die_with_parent, free_ports, percentile,
                          wait_until)
from bench.plan import OneOff
from bench.sd import first_full_minute

START_S_MAX = 30.0
STOP_S_MAX = 15.0
PUBLISH_S_MAX = 1800.0
FAR_FUTURE_S = 365 * 86_400.0


def _publish_stripe(url: str, items: list[tuple[str, float, float]], keep_latency: bool, results: Any) -> None:
    """One publisher process: apply_async each item at its submit time."""
    from bench import celery_app
    celery_app.app.conf.broker_url = url
    late, latencies, first = 0, [], time.time()
    with celery_app.app.producer_or_acquire() as producer:
        for key, due, submit_at in items:
            wait = submit_at - time.time()
            if wait > 0:
                time.sleep(wait)
            t0 = time.monotonic()
            celery_app.record.apply_async(args=(key, due), eta=datetime.fromtimestamp(due, timezone.utc),
                                          producer=producer)
            if keep_latency:
                latencies.append(time.monotonic() - t0)
            late += time.time() > due
    t = os.times()
    results.put((late, latencies, t.user + t.system, first, time.time()))


def _group_stop(proc: subprocess.Popen | None, sig: int = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(STOP_S_MAX)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(STOP_S_MAX)
    except ProcessLookupError:
        pass


class CelerySystem:
    name = "celery"
    replicated = "1 worker + 1 redis-server, persistence off, no replica"

    def __init__(self, run_dir: str, pool: str = "prefork", concurrency: int = 2, publishers: int = 2) -> None:
        self.dir = os.path.join(run_dir, "celery")
        self.pool, self.concurrency, self.publishers = pool, concurrency, publishers
        self.redis: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        self.beat: subprocess.Popen | None = None
        self.port = 0
        self.env: dict[str, str] = {}
        self.publisher_cpu_s = 0.0  # publisher processes report their CPU before they exit
        self._offsets: dict[str, int] = {}
        self._records: list[Record] = []

    # ---- processes ---------------------------------------------------------------------
    def setup(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        (self.port,) = free_ports(1)
        self.redis = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--logfile", os.path.join(self.dir, "redis.log")],
            start_new_session=True, preexec_fn=die_with_parent, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        import redis
        self.r = redis.Redis(host="127.0.0.1", port=self.port)
        wait_until(self.r.ping, START_S_MAX, "redis-server")
        url = f"redis://127.0.0.1:{self.port}/0"
        self.env = {**os.environ, "BENCH_REDIS_URL": url, "BENCH_OUT_DIR": self.dir}

    def start_worker(self) -> None:
        ready = os.path.join(self.dir, "worker.ready")
        if os.path.exists(ready):
            os.unlink(ready)
        with open(os.path.join(self.dir, "worker.log"), "ab") as log:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker", "-Q", "bench", "-P", self.pool,
                 "-c", str(self.concurrency), "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
                 "--without-heartbeat"],
                cwd=ROOT, env=self.env, start_new_session=True, preexec_fn=die_with_parent, stdout=log,
                stderr=subprocess.STDOUT)
        wait_until(lambda: os.path.exists(ready), START_S_MAX, "celery worker ready")

    def start_beat(self, jobs: int) -> None:
        with open(os.path.join(self.dir, "beat.log"), "ab") as log:
            self.beat = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "bench.celery_app", "beat", "--loglevel", "WARNING",
                 "-s", os.path.join(self.dir, "beat-schedule")],
                cwd=ROOT, env={**self.env, "BENCH_CRON_JOBS": str(jobs)}, start_new_session=True,
                preexec_fn=die_with_parent, stdout=log, stderr=subprocess.STDOUT)

    def teardown(self) -> None:
        try:
            _group_stop(self.beat)
            _group_stop(self.worker)
        finally:
            _group_stop(self.redis)
        self.beat = self.worker = self.redis = None

    def pids(self) -> dict[str, list[int]]:
        server = []
        for p in (self.redis, self.worker, self.beat):
            if p is not None and p.poll() is None:
                server += [p.pid, *descendants(p.pid)]
        clients = [os.getpid(), *(p.pid for p in getattr(self, "_publisher_procs", []) if p.pid)]
        return {"server": server, "clients": clients}

    def _meter(self) -> CpuMeter:
        self.publisher_cpu_s = 0.0
        return CpuMeter({"server": lambda: self.pids()["server"], "clients": lambda: self.pids()["clients"]})

    def _cpu(self, meter: CpuMeter) -> dict[str, float]:
        wall = meter.elapsed_s()
        cpu = meter.end()
        extra = round(self.publisher_cpu_s / max(wall, 1e-6), 2)
        return {**cpu, "clients": round(cpu["clients"] + extra, 2), "other": round(max(0.0, cpu["other"] - extra), 2)}

    # ---- records -------------------------------------------------------------------------
    def records(self, prefix: str) -> list[Record]:
        """Every record so far whose key starts with prefix (files are read incrementally)."""
        for path in glob.glob(os.path.join(self.dir, "celery-*.tsv")):
            with open(path) as f:
                f.seek(self._offsets.get(path, 0))
                chunk = f.read()
            end = chunk.rfind("\n") + 1
            self._offsets[path] = self._offsets.get(path, 0) + len(chunk[:end].encode())
            for line in chunk[:end].splitlines():
                parts = line.split("\t")
                if len(parts) == 4:
                    self._records.append(Record(parts[0], float(parts[1]), float(parts[2]), float(parts[3])))
        return [r for r in self._records if r.key.startswith(prefix)]

    def count(self, prefix: str) -> int:
        self.records("\0")  # read new lines only
        return sum(1 for r in self._records if r.key.startswith(prefix))

    # ---- workloads -----------------------------------------------------------------------
    def _publish(self, keys_dues: list[tuple[str, float, float]], latencies: list[float] | None = None) -> int:
        """Publish (key, due, submit_at) in order from `publishers` processes (a thread
        pool would be GIL-bound below 1,000 publishes/s here); returns late publishes."""
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=_publish_stripe, args=(self.env["BENCH_REDIS_URL"], keys_dues[t::self.publishers],
                                                           latencies is not None, results), daemon=True)
                 for t in range(self.publishers)]
        self._publisher_procs = procs
        for proc in procs:
            proc.start()
        late, self.publish_window = 0, (float("inf"), 0.0)
        for _ in procs:
            n_late, lat, cpu_s, first, last = results.get(timeout=PUBLISH_S_MAX)
            late += n_late
            self.publisher_cpu_s += cpu_s
            self.publish_window = (min(self.publish_window[0], first), max(self.publish_window[1], last))
            if latencies is not None:
                latencies.extend(lat)
        for proc in procs:
            proc.join(STOP_S_MAX)
        self._publisher_procs = []
        return late

    def create(self, count: int, concurrency: int, prefix: str) -> dict[str, Any]:
        """ETA tasks published with no worker running: what 'accepted' means for Celery."""
        self.publishers = concurrency
        far = time.time() + FAR_FUTURE_S
        latencies: list[float] = []
        self._publish([(f"{prefix}-{k}", far, 0.0) for k in range(count)], latencies)
        elapsed = self.publish_window[1] - self.publish_window[0]  # without the processes' start-up
        self.r.flushall()
        latencies.sort()
        return {"created": len(latencies), "elapsed_s": elapsed, "jobs_per_s": len(latencies) / elapsed,
                "p50_s": percentile(latencies, 50), "p99_s": percentile(latencies, 99)}

    def oneoff(self, plan: OneOff, drain_s: float) -> tuple[list[Record], dict[str, Any]]:
        if self.worker is None:
            self.start_worker()
        meter = self._meter()
        meter.begin()
        late = self._publish([(plan.job_id(k), plan.due(k), plan.submit_at(k)) for k in range(plan.count)])
        created_at = time.time()
        deadline = max(plan.last_due, created_at) + drain_s
        while time.time() < deadline and len(self.records(plan.prefix + "-")) < plan.count:
            time.sleep(0.2)
        cpu = self._cpu(meter)
        return self.records(plan.prefix + "-"), {"late_creates": late, "created_at": created_at, "cpu_cores": cpu}

    def cron(self, jobs: int, minutes: int, drain_s: float, prefix: str) -> tuple[list[Record], dict[str, Any]]:
        """celery beat with `jobs` crontab() entries; its first minute must come after beat is up."""
        if self.worker is None:
            self.start_worker()
        self.start_beat(jobs)
        time.sleep(3.0)  # beat imports the app and builds its schedule
        if self.beat is None or self.beat.poll() is not None:
            raise BenchError("celery beat exited; see beat.log")
        created_at = time.time()
        first = first_full_minute(created_at)
        window = {first + 60 * m for m in range(minutes)}
        meter = self._meter()
        meter.begin()
        deadline = max(window) + drain_s
        while time.time() < deadline:
            if sum(1 for r in self.records("k") if round(r.due) in window) >= jobs * minutes:
                break
            time.sleep(0.5)
        cpu = meter.end()
        recs = [r for r in self.records("k") if round(r.due) in window]
        return recs, {"created_at": created_at, "first_minute": first, "cpu_cores": cpu}
