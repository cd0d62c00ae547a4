#!/usr/bin/env python3
"""One worker process of a run (started by workers.py inside its own namespace).

It is a plain user of the SDK (`schedulerd.sdk.worker.Worker`). Every execution is
logged to this worker's own JSONL file, flushed and fsynced before the handler
returns — a `begin` line when the handler starts (so a run killed mid-task still
left a trace) and an `exec` line when it ends. The SDK's own log events about
leases (acked, lease lost, heartbeat failed, settle abandoned) go to the same
file: they are the worker's side of the story the checker needs to explain a
redelivery. Handler duration and nack choice derive from the seed and the
delivery (idempotency key, attempt), so a rerun makes the same choices."""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from schedulerd.sdk.worker import Task, Worker  # noqa: E402  (needs the repo root on sys.path)

QUEUE = "jepsen"
NACK_P = 0.03  # a handler that fails now and then exercises the nack/retry path
LONG_P = 0.05  # a handler that outlives one lease: only heartbeats keep it
SDK_EVENTS = ("task_acked", "task_nacked", "lease_lost", "heartbeat_failed", "heartbeat_rejected",
              "task_settle_abandoned", "task_ack_rejected", "task_nack_rejected", "task_ack_failed",
              "task_nack_failed")
_KV = re.compile(r"(\w+)=(\S+)")


class ExecLog:
    """Append-only JSONL, one fsync per line: the line is on disk before the
    handler returns, so a kill -9 right after cannot lose it."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
            os.fsync(self._fd)


class SdkEvents(logging.Handler):
    """Copies the SDK's lease-related log events into the execution log."""

    def __init__(self, out: ExecLog, worker: str) -> None:
        super().__init__(logging.INFO)
        self.out, self.worker = out, worker

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:
            return
        event = msg.split(" ", 1)[0]
        if event not in SDK_EVENTS:
            return
        fields = dict(_KV.findall(msg))
        self.out.write({"ev": "sdk", "event": event, "t": time.time(), "worker": self.worker,
                        "run_id": fields.get("run_id"),
                        "fence": int(fields["fence"]) if fields.get("fence", "").isdigit() else None,
                        "msg": msg[:300]})


def task_fields(task: Task) -> dict[str, Any]:
    return {"job_id": task.job_id, "scheduled_time": task.scheduled_time.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "run_id": task.run_id, "fence": task.fence, "attempt": task.attempt,
            "idempotency_key": task.idempotency_key,
            "lease_until": task.lease_until.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}


def make_handler(out: ExecLog, worker: str, seed: int, lease_s: float):
    def handle(task: Task) -> dict[str, Any]:
        start = time.time()
        fields = task_fields(task)
        out.write({"ev": "begin", **fields, "start": start, "worker": worker})
        rng = random.Random(f"{seed}:{task.idempotency_key}:{task.attempt}")
        roll = rng.random()
        duration = rng.uniform(lease_s * 1.1, lease_s * 1.4) if roll < LONG_P else rng.uniform(0.05, 0.6)
        nack = rng.random() < NACK_P
        time.sleep(duration)
        end = time.time()
        out.write({"ev": "exec", **fields, "start": start, "end": end, "worker": worker,
                   "outcome": "nack" if nack else "ok"})
        if nack:
            raise RuntimeError("jepsen: seeded nack")
        return {"worker": worker}
    return handle


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--id", required=True)
    ap.add_argument("--servers", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--lease-s", type=float, required=True)
    # Well above the workload's rate (~15 jobs/s, 5 % of them holding a slot for a whole
    # lease): a backlog would turn every later occurrence late and drown the fault signal.
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    worker_name = f"{args.id}-{os.getpid()}"  # a restarted worker is a new incarnation
    out = ExecLog(args.out)
    logging.getLogger("schedulerd.worker").addHandler(SdkEvents(out, worker_name))
    worker = Worker(servers=args.servers.split(","), worker_id=worker_name, concurrency=args.concurrency,
                    wait_s=5.0)
    worker.handler(QUEUE)(make_handler(out, worker_name, args.seed, args.lease_s))
    out.write({"ev": "worker_start", "t": time.time(), "worker": worker_name})
    worker.run()
    out.write({"ev": "worker_stop", "t": time.time(), "worker": worker_name})


if __name__ == "__main__":
    main()
