"""What a batch create costs outside the Raft path, per job, in CPU of one process:
the serving node validating each job (`jobspec.parse_job`), its answer with each
job's view (the default) and with `Prefer: return=minimal` (outcomes only), and
the bench feeder building the request body. No network, no cluster.

    python -m bench.answer_cost [--jobs 100000]

The nodes, the workers and the feeder share the box's two cores, so a µs here is
a µs the cluster under test does not get."""
from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import msgspec

from bench.common import iso_us, uptime_line
from bench.feeder import job_body
from schedulerd import views
from schedulerd.config import Limits
from schedulerd.jobspec import JOB_DEFAULTS, parse_job
from storage import queries

BATCH = 100  # create_batch_max
NOW_US = 1_800_000_000_000_000


def _per_job_us(jobs: int, run: Callable[[int], Any]) -> float:
    """CPU µs per job of run(lo) over batches of BATCH jobs starting at lo."""
    started = time.process_time()
    for lo in range(0, jobs, BATCH):
        run(lo)
    return (time.process_time() - started) * 1e6 / jobs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.answer_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=100_000)
    args = p.parse_args(argv)
    limits = Limits()
    bodies = [job_body(f"steady-{k:08d}", {"at": iso_us(NOW_US / 1e6 + 5 + k * 1e-4)}) for k in range(BATCH)]
    stored = [dict(JOB_DEFAULTS, **parse_job(body, NOW_US, limits), state="completed", shard=0, next_fire_us=None,
                   created_us=NOW_US, updated_us=NOW_US, raft_index=1) for body in bodies]

    def feeder_body(lo: int) -> None:
        msgspec.json.encode({"jobs": [job_body(f"steady-{k:08d}", {"at": iso_us(NOW_US / 1e6 + k * 1e-4)})
                                      for k in range(lo, lo + BATCH)]})

    def parse(lo: int) -> None:
        for body in bodies:
            parse_job(body, NOW_US, limits)

    def answer_full(lo: int) -> None:
        views.respond({"results": [{"job_id": rec["job_id"], "ok": True,
                                    "job": views.job(queries.as_seen(rec, NOW_US))} for rec in stored]})

    def answer_minimal(lo: int) -> None:
        views.respond({"results": [{"job_id": rec["job_id"], "ok": True} for rec in stored]})

    print(f"bench.answer_cost: {args.jobs:,} jobs in batches of {BATCH}; {uptime_line()}")
    for name, run in (("feeder: request body", feeder_body), ("node: validate (parse_job)", parse),
                      ("node: answer with views", answer_full), ("node: answer, return=minimal", answer_minimal)):
        print(f"  {name:<30} {_per_job_us(args.jobs, run):6.2f} µs/job")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
