"""The Celery app of the Celery+Redis peer (bench/celery_peer.py starts the worker
and beat with `-A bench.celery_app`). Configured from the environment so the same
module serves the worker, beat and the publishing parent:

    BENCH_REDIS_URL   broker URL (a redis-server the bench started on 127.0.0.1)
    BENCH_OUT_DIR     where each worker process appends celery-PID.tsv records
    BENCH_CRON_JOBS   beat only: this many entries on crontab() (every minute)

Each task appends (key, due, start, done) to its process's file, one write per task
(line-buffered) so nothing is lost when the pool's children exit."""
from __future__ import annotations

import os
import time

from celery import Celery
from celery.schedules import crontab
from celery.signals import worker_ready

QUEUE = "bench"
OUT_DIR = os.environ.get("BENCH_OUT_DIR", ".")

app = Celery("bench", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_ignore_result=True,  # no result backend: the peer does the least it can
    task_default_queue=QUEUE,
    worker_hijack_root_logger=False,
    worker_send_task_events=False,
    broker_connection_retry_on_startup=True,
    timezone="UTC",
    enable_utc=True,
)

_out: tuple[int, object] | None = None


def _file():
    global _out
    if _out is None or _out[0] != os.getpid():  # prefork children each get their own file
        _out = (os.getpid(), open(os.path.join(OUT_DIR, f"celery-{os.getpid()}.tsv"), "a", buffering=1))
    return _out[1]


@app.task(name="bench.record")
def record(key: str, due: float) -> None:
    start = time.time()
    _file().write(f"{key}\t{due:.6f}\t{start:.6f}\t{time.time():.6f}\n")


@app.task(name="bench.record_cron")
def record_cron(key: str) -> None:
    start = time.time()
    due = (start // 60) * 60  # the minute it fired for, while lateness stays under 60 s
    _file().write(f"{key}@{due:.0f}\t{due:.6f}\t{start:.6f}\t{time.time():.6f}\n")


_cron_jobs = int(os.environ.get("BENCH_CRON_JOBS", "0"))
if _cron_jobs:
    app.conf.beat_schedule = {f"k{k}": {"task": "bench.record_cron", "schedule": crontab(), "args": (f"k{k}",)}
                              for k in range(_cron_jobs)}


@worker_ready.connect
def _ready(**_: object) -> None:
    open(os.path.join(OUT_DIR, "worker.ready"), "w").close()
