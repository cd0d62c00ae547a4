"""What the worker SDK costs per task, with no cluster: one `schedulerd.sdk.worker.Worker`
with a no-op async handler polls a stub server (a separate process) that hands
out N tasks shaped like the daemon's, as fast as asked, and accepts every ack and
heartbeat. The figure is the worker process's CPU per task acked.

    python -m bench.micro.sdk_cost [--tasks 100000] [--concurrency 1500] [--log-info] [--gc-default] [--profile 25]

In a spike the four bench worker processes use about a third of the box's two
cores; this isolates that share from the cluster's, so a change to the SDK is
measured by itself."""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import os
import pstats
import subprocess
import sys
import time
import urllib.request

from aiohttp import web

from bench.common import WORKER_SLOTS, BenchError, die_with_parent, free_ports, uptime_line, wait_until
from schedulerd.gctune import tune_gc
from schedulerd.sdk.worker import Task, Worker
from schedulerd.timefmt import to_iso

US = 1_000_000
QUEUE = "bench"
READY_S_MAX = 20.0


def _task_json(n: int, now_us: int) -> str:
    return json.dumps({
        "run_id": f"r-{n:012d}", "job_id": f"bench-{n:08d}", "queue": QUEUE,
        "scheduled_time": to_iso(now_us - US), "attempt": 1, "fence": n + 1,
        "idempotency_key": f"bench-{n:08d}:{to_iso(now_us - US)}", "lease_until": to_iso(now_us + 60 * US),
        "target": None, "timeout_s": None, "payload": {"n": 1}}, separators=(",", ":"))


def serve(port: int, tasks: int) -> None:
    """The stub: answers polls with the next tasks (all due), acks and heartbeats with ok."""
    handed = 0

    async def poll(request: web.Request) -> web.Response:
        nonlocal handed
        body = await request.json()
        n = min(int(body["max_tasks"]), tasks - handed)
        if n <= 0:
            await asyncio.sleep(float(body.get("wait_s", 0)))
            return web.Response(text='{"tasks":[]}', content_type="application/json")
        now_us = time.time_ns() // 1000
        items = ",".join(_task_json(handed + i, now_us) for i in range(n))
        handed += n
        return web.Response(text='{"tasks":[' + items + "]}", content_type="application/json")

    async def settle(request: web.Request, key: str) -> web.Response:
        body = await request.json()
        lease_until = to_iso(time.time_ns() // 1000 + 60 * US)
        return web.json_response({"results": [{"run_id": i["run_id"], "ok": True, "lease_until": lease_until}
                                              for i in body[key]]})

    async def ack(request: web.Request) -> web.Response:
        return await settle(request, "acks")

    async def heartbeat(request: web.Request) -> web.Response:
        return await settle(request, "leases")

    async def ready(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=64 << 20)
    app.add_routes([web.post("/v1/tasks/poll", poll), web.post("/v1/tasks/ack", ack),
                    web.post("/v1/tasks/heartbeat", heartbeat), web.get("/ready", ready)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def measure(url: str, tasks: int, concurrency: int, profile: int, log_info: bool, gc_default: bool) -> dict[str, float]:
    worker = Worker([url], worker_id="sdk-cost", concurrency=concurrency, wait_s=1.0)
    seen = 0

    @worker.handler(QUEUE)
    async def noop(task: Task) -> None:
        nonlocal seen
        seen += 1

    def stop_when_all_acked(_: Task, __: str) -> None:
        if worker.stats.acked >= tasks:
            worker.stop()

    worker.on_settled(stop_when_all_acked)
    logging.basicConfig(level=logging.INFO if log_info else logging.WARNING, format="%(message)s",
                        stream=open(os.devnull, "w") if log_info else sys.stderr)
    if not gc_default:
        tune_gc()  # as bench/sdworker.py and `schedctl worker run` run the SDK
    profiler = cProfile.Profile() if profile else None
    cpu0, wall0 = time.process_time(), time.monotonic()
    if profiler:
        profiler.enable()
    worker.run()
    if profiler:
        profiler.disable()
    cpu_s, wall_s = time.process_time() - cpu0, time.monotonic() - wall0
    if worker.stats.acked != tasks or seen != tasks:
        raise BenchError(f"acked {worker.stats.acked}, ran {seen}, of {tasks}")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(profile)
    return {"cpu_us_per_task": cpu_s * US / tasks, "tasks_per_s": tasks / wall_s, "cpu_cores": cpu_s / wall_s}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=100_000)
    p.add_argument("--concurrency", type=int, default=WORKER_SLOTS)
    p.add_argument("--log-info", action="store_true",
                   help="enable the SDK's INFO lines (two per task), written to /dev/null")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile the worker; print the top N")
    p.add_argument("--gc-default", action="store_true",
                   help="leave the cyclic GC at CPython's defaults (schedulerd.gctune not applied)")
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve:
        serve(a.serve, a.tasks)
        return 0
    port = free_ports(1)[0]
    stub = subprocess.Popen([sys.executable, "-m", "bench.micro.sdk_cost", "--serve", str(port), "--tasks", str(a.tasks)],
                            preexec_fn=die_with_parent)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: urllib.request.urlopen(url + "/ready", timeout=1).read(), READY_S_MAX,
                   f"the stub server at {url}", interval_s=0.05)
        print(f"command: python -m bench.micro.sdk_cost {' '.join(argv if argv is not None else sys.argv[1:])}")
        print("uptime before:", uptime_line())
        r = measure(url, a.tasks, a.concurrency, a.profile, a.log_info, a.gc_default)
        print("uptime after: ", uptime_line())
    finally:
        stub.terminate()
        stub.wait(10)
    print(f"tasks {a.tasks:,}, concurrency {a.concurrency}, pid {os.getpid()}")
    print(f"worker CPU per task: {r['cpu_us_per_task']:.1f} µs; {r['tasks_per_s']:,.0f} tasks/s at "
          f"{r['cpu_cores']:.2f} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
