"""One schedulerd worker process for the bench: the SDK's `Worker` with a no-op
async handler that records (run_id, job_id, scheduled time, start time), and
the time each ack was accepted (the SDK's `on_settled` hook). The SDK logs at
WARNING, as a busy production worker would: two INFO lines per task were a
third of this process's CPU (bench/micro/sdk_cost.py), paid for nothing but measuring.

    python -m bench.sdworker --servers URL,URL,URL --queue bench --out PREFIX
        [--concurrency 1500] [--lifetime-s 900]

Writes PREFIX.starts.tsv (run_id, job_id, scheduled_s, start_s) and PREFIX.acks.tsv
(run_id, ack_s), appended every FLUSH_S so the parent can follow progress.
Stops on SIGTERM (the SDK drains: running tasks are acked) or after --lifetime-s."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections import deque

from bench.common import WORKER_SLOTS
from schedulerd.gctune import tune_gc
from schedulerd.sdk.worker import Task, Worker

FLUSH_S = 0.25
HARD_EXIT_AFTER_STOP_S = 15.0  # the drain must not keep a bench run alive


class Flusher(threading.Thread):
    def __init__(self, prefix: str, starts: deque, acks: deque) -> None:
        super().__init__(daemon=True)
        self.starts, self.acks = starts, acks
        self.files = (open(prefix + ".starts.tsv", "a"), open(prefix + ".acks.tsv", "a"))
        self.stopped = threading.Event()

    def flush(self) -> None:
        # deque.popleft is atomic: the event-loop thread may append meanwhile.
        starts = [self.starts.popleft() for _ in range(len(self.starts))]
        acks = [self.acks.popleft() for _ in range(len(self.acks))]
        if starts:
            self.files[0].write("".join(f"{r}\t{j}\t{s:.6f}\t{t:.6f}\n" for r, j, s, t in starts))
            self.files[0].flush()
        if acks:
            self.files[1].write("".join(f"{r}\t{t:.6f}\n" for r, t in acks))
            self.files[1].flush()

    def run(self) -> None:
        while not self.stopped.wait(FLUSH_S):
            self.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--servers", required=True)
    p.add_argument("--queue", default="bench")
    p.add_argument("--out", required=True, help="file prefix")
    p.add_argument("--concurrency", type=int, default=WORKER_SLOTS)
    p.add_argument("--wait-s", type=float, default=5.0)
    p.add_argument("--lifetime-s", type=float, default=900.0)
    a = p.parse_args(argv)

    starts: deque[tuple[str, str, float, float]] = deque()
    acks: deque[tuple[str, float]] = deque()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    worker = Worker(a.servers.split(","), worker_id=f"bench-{os.getpid()}", concurrency=a.concurrency,
                    wait_s=a.wait_s)

    @worker.handler(a.queue)
    async def record(task: Task) -> None:
        starts.append((task.run_id, task.job_id, task.scheduled_time.timestamp(), time.time()))

    def on_settled(task: Task, outcome: str) -> None:
        if outcome == "acked":
            acks.append((task.run_id, time.time()))

    worker.on_settled(on_settled)

    flusher = Flusher(a.out, starts, acks)
    flusher.start()
    tune_gc()  # as the SDK's docs advise a busy worker process

    def lifetime() -> None:
        time.sleep(a.lifetime_s)
        worker.stop()
        time.sleep(HARD_EXIT_AFTER_STOP_S)
        flusher.flush()
        os._exit(3)

    threading.Thread(target=lifetime, daemon=True).start()
    try:
        worker.run()
    finally:
        flusher.stopped.set()
        flusher.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
