"""One run, phase by phase: set up, warm up, faults, heal, quiesce, final reads,
check, report. Teardown is idempotent and removes everything the run made."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import checker
import cluster as cluster_mod
import finalreads
import history as history_mod
import nemesis
import report
import workers as workers_mod
from cluster import Cluster
from facts import Facts
from history import History
from monitor import Monitor
from net import Net
from wire import parse_us
from workload import Workload

READY_WAIT_S = 120.0  # a loaded 2-core box can take long to start three Python daemons
HEAL_S = 5.0  # clients keep writing after the last heal: recovery shows in the figures
QUIESCE_MARGIN_S = 1.0  # past the last due time; settle then waits for the work itself
SETTLE_WAIT_S = 120.0
CONVERGE_WAIT_S = 90.0
NEMESIS_OVERRUN_S = 240.0  # the plan may run past --duration (leader waits, every kind once)


class Run:
    def __init__(self, args: argparse.Namespace, out: str, repo: str) -> None:
        self.args, self.out, self.repo = args, out, repo
        self.history = History(os.path.join(out, "history.jsonl"))
        self.net = Net(args.nodes + args.spare, args.workers)
        self.cluster = Cluster(args.nodes, args.spare, args.groups, out, args.lease_s, self.history, repo)
        self.workers = workers_mod.WorkerPool(args.workers, out, self.cluster.urls, args.seed, args.lease_s,
                                              self.history, repo)
        self.workload = Workload(self.cluster.urls, self.history, args.seed, args.clients,
                                 lambda i: self.cluster.nodes[i].incarnation, args.groups)
        self.nemesis: nemesis.Nemesis | None = None
        self.monitor = Monitor(self.cluster, self.history)
        self.meta: dict[str, Any] = {"seed": args.seed, "duration_s": args.duration, "faults": args.faults,
                                     "lease_s": args.lease_s, "out": out, "nodes": args.nodes, "spare": args.spare,
                                     "groups": args.groups}
        self._torn_down = False

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
        self.history.add("phase", name=msg)

    def execute(self) -> int:
        a = self.args
        warmup_s = min(10.0, max(5.0, 0.1 * a.duration))
        faults = nemesis.plan(a.seed, a.faults, max(0.0, a.duration - warmup_s), a.lease_s) if a.faults else []
        with open(os.path.join(self.out, "plan.json"), "w") as fh:
            json.dump([f.__dict__ for f in faults], fh, indent=2)
        self.log(f"seed {a.seed}: {len(faults)} faults planned: "
                 + ", ".join(f"{f.kind}/{f.variant}" for f in faults) + f"; output in {self.out}")
        cluster_mod.cleanup_mounts()
        self.net.setup()
        self.cluster.start_all()
        if not self.cluster.wait_ready(READY_WAIT_S):
            self.log("cluster never became ready")
            return 2
        self.workers.start_all()
        self.monitor.start()
        self.meta["workload_start"] = time.time()
        self.log("warm-up")
        self.workload.create_recurring()
        self.workload.start()
        time.sleep(warmup_s)  # pacing only: correctness never waits on this
        self.log("faults")
        if not self._fault_phase(faults, a.duration - warmup_s):
            return 2
        self.log("heal")
        time.sleep(HEAL_S)
        self.workload.stop()
        self.workload.cancel_recurring(deadline_s=60.0)
        self.meta["workload_end"] = time.time()
        return self._finish()

    def _fault_phase(self, faults: list[nemesis.Fault], phase_s: float) -> bool:
        self.nemesis = nemesis.Nemesis(faults, self.cluster, self.workers, self.net, self.history, self.args.lease_s)
        end = time.monotonic() + phase_s
        self.nemesis.start()
        self.nemesis.join(phase_s + NEMESIS_OVERRUN_S)
        if self.nemesis.thread.is_alive():
            self.log("nemesis overran its plan by far; stopping it")
            self.nemesis.stop_event.set()
            self.nemesis.join(60)
        self.nemesis.heal()
        if self.nemesis.error is not None:
            self.log(f"nemesis failed: {self.nemesis.error!r}")
            return False
        while time.monotonic() < end:
            time.sleep(min(1.0, end - time.monotonic()))
        if self.cluster.wait_leader(60) is None:
            self.log("no leader 60 s after the final heal")  # the checkers will show what it cost
        return True

    def _finish(self) -> int:
        self.log("quiesce")
        last_due = max((parse_us(c["schedule"]["at"]) / 1e6 for c in self.history.of("create")
                        if "at" in c["schedule"]), default=time.time())
        until = last_due + QUIESCE_MARGIN_S
        while time.time() < until:
            time.sleep(min(1.0, until - time.time()))
        self.meta["settle"] = finalreads.settle(self.cluster, SETTLE_WAIT_S)
        self.log(f"settled: {self.meta['settle']}; stopping workers")
        self.workers.stop_all()
        convergence = finalreads.wait_converged(self.cluster, CONVERGE_WAIT_S)
        self.log(f"convergence: converged={convergence['converged']} after {convergence['waited_s']}s; final reads")
        reads = finalreads.read_all(self.cluster)
        self.monitor.stop()
        with open(os.path.join(self.out, "reads.json"), "w") as fh:
            json.dump({"reads": reads, "convergence": convergence}, fh)
        self.cluster.stop_all()
        self.history.add("phase", name="done")
        return self._check(reads, convergence)

    def _check(self, reads: list[dict[str, Any]], convergence: dict[str, Any]) -> int:
        self.meta["workers"] = self.args.workers
        with open(os.path.join(self.out, "meta.json"), "w") as fh:
            json.dump(self.meta, fh)
        return check_dir(self.out, list(self.history), reads, convergence, self.meta)

    def teardown(self) -> None:
        """Idempotent; runs from finally and from atexit. Each step is tried even if
        an earlier one failed: a leaked namespace or DROP rule outlives the run."""
        if self._torn_down:
            return
        self._torn_down = True
        steps = [lambda: self.nemesis and self.nemesis.stop_event.set(),
                 lambda: self.workload.stop_event.set(), self.monitor.stop_event.set,
                 self.workers.stop_all, self.cluster.stop_all, cluster_mod.cleanup_mounts,
                 self.net.teardown, self.history.close]
        for step in steps:
            try:
                step()
            except Exception as exc:  # keep going: the next step still has to run
                print(f"teardown step failed: {exc!r}", file=sys.stderr)



def check_dir(out: str, events: list[dict[str, Any]], reads: list[dict[str, Any]], convergence: dict[str, Any],
              meta: dict[str, Any]) -> int:
    """Checkers and figures over one run's record; 0 when every checker passed."""
    facts = Facts.build(meta["lease_s"], events, workers_mod.read_all(os.path.join(out, "workers"), meta["workers"]),
                        reads, convergence)
    results = checker.run_all(facts)
    figs = report.figures(facts, results, meta)
    report.write(os.path.join(out, "figures.json"), figs, results["violations"])
    print(report.render(figs, results["violations"]), flush=True)
    return 0 if figs["verdict"] == "PASS" else 1


def recheck(out: str) -> int:
    """Run the checkers again over a finished run's files (no cluster needed)."""
    with open(os.path.join(out, "meta.json")) as fh:
        meta = json.load(fh)
    with open(os.path.join(out, "reads.json")) as fh:
        saved = json.load(fh)
    events = history_mod.load(os.path.join(out, "history.jsonl"))
    return check_dir(out, events, saved["reads"], saved["convergence"], meta)
