"""Worker processes of a run, one per namespace (sdj-wI), so the nemesis can
kill -9 one mid-task or cut it off the network; and the reader of their files."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import net
from history import History

HERE = os.path.dirname(os.path.abspath(__file__))
STOP_WAIT_S = 30.0  # a SIGTERMed worker drains: running handlers finish and ack


class WorkerPool:
    def __init__(self, n: int, out_dir: str, servers: list[str], seed: int, lease_s: float,
                 history: History, repo_root: str) -> None:
        self.n, self.servers, self.seed, self.lease_s = n, servers, seed, lease_s
        self.history, self.repo_root = history, repo_root
        self.dir = os.path.join(out_dir, "workers")
        os.makedirs(self.dir, exist_ok=True)
        self.procs: list[subprocess.Popen | None] = [None] * n

    def exec_path(self, i: int) -> str:
        return os.path.join(self.dir, f"w{i}.jsonl")

    def start(self, i: int) -> None:
        args = ["ip", "netns", "exec", net.worker_ns(i), sys.executable, os.path.join(HERE, "worker_proc.py"),
                "--id", f"w{i}", "--servers", ",".join(self.servers), "--out", self.exec_path(i),
                "--seed", str(self.seed), "--lease-s", str(self.lease_s)]
        log = open(os.path.join(self.dir, f"w{i}.log"), "ab")
        self.procs[i] = subprocess.Popen(args, cwd=self.repo_root, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        log.close()
        self.history.add("worker", worker=i, event="start", pid=self.procs[i].pid)

    def start_all(self) -> None:
        for i in range(self.n):
            self.start(i)

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is None:
            return
        proc.send_signal(signal.SIGKILL)
        proc.wait(STOP_WAIT_S)
        self.history.add("worker", worker=i, event="kill", pid=proc.pid)
        self.procs[i] = None

    def busy(self, i: int) -> bool:
        """True when the worker's file shows a `begin` without its `exec`: a task is
        in its handler right now (what 'kill -9 mid-task' needs to aim at)."""
        open_runs: set[tuple[str, int]] = set()
        for rec in read_exec_file(self.exec_path(i)):
            if rec.get("ev") == "begin":
                open_runs.add((rec["run_id"], rec["fence"]))
            elif rec.get("ev") == "exec":
                open_runs.discard((rec["run_id"], rec["fence"]))
            elif rec.get("ev") == "worker_start":
                open_runs.clear()  # a new incarnation: the old one's open runs died with it
        return bool(open_runs)

    def ensure_running(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc is None or proc.poll() is not None:
                if proc is not None:
                    self.history.add("worker", worker=i, event="died", rc=proc.returncode, pid=proc.pid)
                self.start(i)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        for i, proc in enumerate(self.procs):
            if proc is None:
                continue
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_WAIT_S)
                self.history.add("worker", worker=i, event="stop_timeout_killed", pid=proc.pid)
            self.procs[i] = None


def read_exec_file(path: str) -> list[dict[str, Any]]:
    """Every line of one worker file. A kill -9 can tear only the last line of a
    file (each line is one write); any torn line is reported, not guessed at."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path, "rb") as f:
        for n, line in enumerate(f):
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"ev": "torn", "line": n, "path": path})
    return out


def read_all(pool_dir: str, n: int) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for i in range(n):
        for rec in read_exec_file(os.path.join(pool_dir, f"w{i}.jsonl")):
            rec["slot"] = i
            records.append(rec)
    return records
