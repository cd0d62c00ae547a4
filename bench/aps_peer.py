"""Peer: APScheduler 3.x in one process — BackgroundScheduler, SQLAlchemy job store
on a SQLite file, ThreadPoolExecutor — running the same plans as schedulerd.

The parent (`ApsSystem`) starts this module as a subprocess per run:

    python -m bench.aps_peer create --db F --out F.json --count N --adders C
    python -m bench.aps_peer oneoff --db F --out F.json --plan JSON --deadline EPOCH
    python -m bench.aps_peer cron   --db F --out F.json --jobs K --first-minute EPOCH --minutes 2 --deadline EPOCH

Jobs call `record`/`record_cron` here, which note (key, due, start, done); due is the
plan's time for one-offs and the minute boundary for cron jobs (lateness < 60 s).
`misfire_grace_time=None` so a late job runs late instead of being dropped (APScheduler's
default of 1 s would silently skip it), `coalesce=False`."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from datetime import datetime, timezone
from typing import Any

from bench.common import ROOT, CpuMeter, Record, die_with_parent, percentile
from bench.plan import OneOff

_records: deque[tuple[str, float, float, float]] = deque()
FAR_FUTURE_S = 365 * 86_400.0
THREADS = 10  # APScheduler's default thread pool size
CREATE_TIMEOUT_S = 600.0
# Only to place the cron window after the adds (each add is one SQLite commit);
# a run that still adds when the window opens says so in its output.
APS_CRON_ADDS_PER_S_GUESS = 300.0


def record(key: str, due: float) -> None:
    start = time.time()
    _records.append((key, due, start, time.time()))


def record_cron(key: str) -> None:
    start = time.time()
    due = (start // 60) * 60
    _records.append((f"{key}@{due:.0f}", due, start, time.time()))


def _scheduler(db: str, threads: int) -> Any:
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.schedulers.background import BackgroundScheduler
    sched = BackgroundScheduler(
        jobstores={"default": SQLAlchemyJobStore(url=f"sqlite:///{db}")},
        executors={"default": ThreadPoolExecutor(threads)},
        job_defaults={"misfire_grace_time": None, "coalesce": False, "max_instances": 1},
        timezone="UTC")
    sched.start()
    return sched


def _at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc)


def _wait_records(expected: int, deadline: float) -> None:
    while len(_records) < expected and time.time() < deadline:
        time.sleep(0.05)


def run_create(a: argparse.Namespace) -> dict[str, Any]:
    sched = _scheduler(a.db, THREADS)
    latencies: list[float] = []
    far = _at(time.time() + FAR_FUTURE_S)

    def adder(t: int) -> None:
        for k in range(t, a.count, a.adders):
            t0 = time.monotonic()
            sched.add_job(record, "date", run_date=far, args=(f"c-{k}", 0.0), id=f"c-{k}")
            latencies.append(time.monotonic() - t0)

    t0 = time.monotonic()
    threads = [threading.Thread(target=adder, args=(t,)) for t in range(a.adders)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.monotonic() - t0
    sched.shutdown(wait=False)
    latencies.sort()
    return {"created": len(latencies), "elapsed_s": elapsed, "jobs_per_s": len(latencies) / elapsed,
            "p50_s": percentile(latencies, 50), "p99_s": percentile(latencies, 99)}


def run_oneoff(a: argparse.Namespace) -> dict[str, Any]:
    plan = OneOff(**json.loads(a.plan))
    sched = _scheduler(a.db, a.threads)
    late_creates, added = 0, 0
    for k in range(plan.count):
        wait = plan.submit_at(k) - time.time()
        if wait > 0:
            time.sleep(wait)
        if time.time() > a.deadline:  # adds cannot keep up: stop, and report what ran
            break
        due = plan.due(k)
        sched.add_job(record, "date", run_date=_at(due), args=(plan.job_id(k), due), id=plan.job_id(k))
        late_creates += time.time() > due
        added += 1
    created_s = time.time()
    _wait_records(plan.count, a.deadline)
    sched.shutdown(wait=False)
    return {"late_creates": late_creates, "created_at": created_s, "not_created": plan.count - added}


def run_cron(a: argparse.Namespace) -> dict[str, Any]:
    sched = _scheduler(a.db, a.threads)
    for k in range(a.jobs):
        sched.add_job(record_cron, "cron", minute="*", args=(f"k{k}",), id=f"k{k}")
    created_s = time.time()
    window = {a.first_minute + 60 * m for m in range(a.minutes)}
    while time.time() < a.deadline:
        if sum(1 for r in list(_records) if r[1] in window) >= a.jobs * a.minutes:
            break
        time.sleep(0.2)
    sched.shutdown(wait=False)
    return {"created_at": created_s}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["create", "oneoff", "cron"])
    p.add_argument("--db", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=THREADS, help="the executor's pool size")
    p.add_argument("--adders", type=int, default=1, help="create: threads calling add_job")
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--plan")
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--first-minute", type=float, default=0)
    p.add_argument("--minutes", type=int, default=2)
    p.add_argument("--deadline", type=float, default=0)
    a = p.parse_args(argv)
    info = {"create": run_create, "oneoff": run_oneoff, "cron": run_cron}[a.mode](a)
    info["records"] = list(_records)
    t = os.times()
    info["process_cpu_s"] = t.user + t.system  # the parent cannot read a dead process's CPU
    with open(a.out, "w") as f:
        json.dump(info, f)
    os._exit(0)  # the scheduler's pool threads may still be parked; the results are written


class ApsSystem:
    name = "apscheduler"
    replicated = "1 process, SQLite file (synchronous=FULL), no replica"

    def __init__(self, run_dir: str, threads: int = THREADS) -> None:
        self.dir = os.path.join(run_dir, "apscheduler")
        self.threads = threads
        self.proc: subprocess.Popen | None = None
        self.seq = 0

    def setup(self) -> None:
        os.makedirs(self.dir, exist_ok=True)

    def teardown(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def pids(self) -> dict[str, list[int]]:
        live = [self.proc.pid] if self.proc is not None and self.proc.poll() is None else []
        return {"server": live, "clients": []}

    def _start(self, mode: str, *args: str) -> str:
        self.seq += 1
        base = os.path.join(self.dir, str(self.seq))
        cmd = [sys.executable, "-m", "bench.aps_peer", mode, "--db", base + ".sqlite", "--out", base + ".json",
               "--threads", str(self.threads), *args]
        with open(base + ".log", "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=die_with_parent)
        return base + ".json"

    def _finish(self, out: str, timeout_s: float) -> dict[str, Any]:
        assert self.proc is not None
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.teardown()
            return {"error": f"timed out after {timeout_s:g} s", "records": []}
        self.proc = None
        with open(out) as f:
            return json.load(f)

    def _meter(self) -> CpuMeter:
        return CpuMeter({})

    @staticmethod
    def _cpu(meter: CpuMeter, info: dict[str, Any]) -> dict[str, float]:
        """The machine's busy cores over the window, split into this process and the rest."""
        wall = meter.elapsed_s()
        total = meter.end()["other"]
        server = round(info.get("process_cpu_s", 0.0) / max(wall, 1e-6), 2)
        return {"server": server, "clients": 0.0, "other": round(max(0.0, total - server), 2)}

    def create(self, count: int, concurrency: int, prefix: str) -> dict[str, Any]:
        out = self._start("create", "--count", str(count), "--adders", str(concurrency))
        return self._finish(out, CREATE_TIMEOUT_S)

    def oneoff(self, plan: OneOff, drain_s: float) -> tuple[list[Record], dict[str, Any]]:
        deadline = plan.last_due + drain_s
        out = self._start("oneoff", "--plan", json.dumps(plan.to_json()), "--deadline", str(deadline))
        meter = self._meter()
        meter.begin()
        info = self._finish(out, deadline - time.time() + 60)
        info["cpu_cores"] = self._cpu(meter, info)
        return _records_of(info), info

    def cron(self, jobs: int, minutes: int, drain_s: float, prefix: str) -> tuple[list[Record], dict[str, Any]]:
        # The process adds the jobs, then waits for the window; pick the window after adding.
        from bench.sd import first_full_minute
        est_add_s = 5.0 + jobs / APS_CRON_ADDS_PER_S_GUESS
        first = first_full_minute(time.time() + est_add_s)
        deadline = first + 60 * (minutes - 1) + drain_s
        out = self._start("cron", "--jobs", str(jobs), "--first-minute", str(first), "--minutes", str(minutes),
                          "--deadline", str(deadline))
        meter = self._meter()
        meter.begin()
        info = self._finish(out, deadline - time.time() + 60)
        info["cpu_cores"] = self._cpu(meter, info)
        info["first_minute"] = first
        if info.get("created_at", 0) > first:
            info["warning"] = "jobs were still being added when the first measured minute began"
        window = {first + 60 * m for m in range(minutes)}
        return [r for r in _records_of(info) if round(r.due) in window], info


def _records_of(info: dict[str, Any]) -> list[Record]:
    return [Record(k, due, start, done) for k, due, start, done in info.pop("records", [])]


if __name__ == "__main__":
    sys.exit(main())
