"""What a handler in a child process (`isolation="process"`) costs per task against one in
a thread: one `Worker` with a trivial sync handler runs `--tasks` tasks from the
`sdk_cost` stub server (a separate process), once per isolation. The figures are taken
after `--warmup` tasks, so a child's start (its imports) is reported apart: wall time
per task, and CPU per task of the worker process plus its children (the pool's, read from
/proc: Linux only).

    python -m bench.micro.isolation_cost [--tasks 500] [--warmup 50] [--concurrency 1] [--rounds 5]

The two run in alternated rounds (the box's speed drifts), and each figure is the median.

At concurrency 1 each task waits for the one before it, so the wall time per task is
the round trip a task pays: poll, handler, ack."""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from bench.common import BenchError, die_with_parent, free_ports, uptime_line, wait_until
from bench.micro.sdk_cost import QUEUE, READY_S_MAX
from schedulerd.gctune import tune_gc
from schedulerd.sdk.worker import Task, Worker

US = 1_000_000


def trivial(task: Task) -> None:
    """The handler: nothing, so what is measured is the SDK's and the isolation's cost."""


def _children_cpu_s(root: int, skip: int) -> float:
    """CPU seconds of the processes under `root` (not `skip`, the stub, nor `root`)."""
    parents, ticks = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended while we looked
        parents[int(entry)] = int(fields[1])
        # utime + stime + the same of its collected children (a recycled child, by the forkserver)
        ticks[int(entry)] = sum(int(v) for v in fields[11:15])

    def under_root(pid: int) -> bool:
        while pid in parents and pid not in (0, 1):
            pid = parents[pid]
            if pid == root:
                return True
        return False

    total = sum(t for pid, t in ticks.items() if pid not in (root, skip) and under_root(pid))
    return total / os.sysconf("SC_CLK_TCK")


def measure(url: str, isolation: str, tasks: int, warmup: int, concurrency: int, stub_pid: int) -> dict[str, float]:
    worker = Worker([url], worker_id=f"isolation-cost-{isolation}", concurrency=concurrency, wait_s=1.0,
                    isolation=isolation)
    worker.handler(QUEUE)(trivial)
    marks: list[tuple[float, float, float]] = []  # (wall, worker CPU, children's CPU) at warmup and end
    first: list[float] = []
    began = time.monotonic()

    def mark(_: Task, __: str) -> None:
        if not first:
            first.append(time.monotonic() - began)
        if worker.stats.acked in (warmup, tasks):
            marks.append((time.monotonic(), time.process_time(), _children_cpu_s(os.getpid(), stub_pid)))
        if worker.stats.acked >= tasks:
            worker.stop()

    worker.on_settled(mark)
    worker.run()
    if worker.stats.acked != tasks or len(marks) != 2:
        raise BenchError(f"{isolation}: acked {worker.stats.acked} of {tasks}")
    (wall0, cpu0, kids0), (wall1, cpu1, kids1) = marks
    n = tasks - warmup
    return {"wall_us": (wall1 - wall0) * US / n, "worker_cpu_us": (cpu1 - cpu0) * US / n,
            "children_cpu_us": (kids1 - kids0) * US / n, "first_task_s": first[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=500)
    p.add_argument("--warmup", type=int, default=50, help="tasks run before the figures are taken")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5, help="alternated rounds of each; medians are reported")
    a = p.parse_args(argv)
    if not 0 < a.warmup < a.tasks:
        p.error("--warmup: between 1 and --tasks - 1")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    tune_gc()  # as `schedctl worker` runs the SDK
    print(f"command: python -m bench.micro.isolation_cost {' '.join(argv if argv is not None else sys.argv[1:])}")
    print("uptime before:", uptime_line())
    rounds: dict[str, list[dict[str, float]]] = {"thread": [], "process": []}
    for isolation in [*rounds] * a.rounds:
        port = free_ports(1)[0]
        stub = subprocess.Popen([sys.executable, "-m", "bench.micro.sdk_cost", "--serve", str(port),
                                 "--tasks", str(a.tasks)], preexec_fn=die_with_parent)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until(lambda: urllib.request.urlopen(url + "/ready", timeout=1).read(), READY_S_MAX,
                       f"the stub server at {url}", interval_s=0.05)
            rounds[isolation].append(measure(url, isolation, a.tasks, a.warmup, a.concurrency, stub.pid))
        finally:
            stub.terminate()
            stub.wait(10)
    print("uptime after: ", uptime_line())
    print(f"tasks {a.tasks:,} ({a.warmup} warm-up), concurrency {a.concurrency}, medians of {a.rounds} rounds")
    results = {isolation: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
               for isolation, runs in rounds.items()}
    for isolation, r in results.items():
        print(f"{isolation:>7}: {r['wall_us']:,.0f} µs a task (wall), CPU {r['worker_cpu_us']:,.0f} µs worker + "
              f"{r['children_cpu_us']:,.0f} µs children; first task acked after {r['first_task_s']:.2f} s")
    thread, process = results["thread"], results["process"]
    print(f"process - thread: {process['wall_us'] - thread['wall_us']:,.0f} µs wall, "
          f"{process['worker_cpu_us'] + process['children_cpu_us'] - thread['worker_cpu_us'] - thread['children_cpu_us']:,.0f}"
          f" µs CPU a task")
    return 0


if __name__ == "__main__":
    sys.exit(main())
