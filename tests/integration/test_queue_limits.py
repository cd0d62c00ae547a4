"""Queue limits through real nodes: PUT and GET /v1/queues/{name}, max_running holding runs back
until a place frees, the max_starts_per_s bucket pacing leases, schedctl queue set|get|list,
and, across a leader's kill -9 with three groups, never more runs leased than the limit."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any

import pytest

from schedulerd.sdk.worker import Task, Worker
from tests.integration.harness import ROOT, http, wait_until

pytestmark = pytest.mark.integration


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _jobs_due_now(node: Any, prefix: str, n: int, queue: str) -> None:
    status, body = node.post("/v1/jobs:batch", {"jobs": [{"job_id": f"{prefix}{i}", "schedule": {"at": _now_iso()},
                                                          "queue": queue} for i in range(n)]})
    assert status in (200, 201), body


def _poll(node: Any, queue: str, max_tasks: int, wait_s: float = 0.5) -> list[dict[str, Any]]:
    status, body = node.post("/v1/tasks/poll", {"worker_id": "w", "queues": [queue], "max_tasks": max_tasks,
                                                "wait_s": wait_s})
    assert status == 200, body
    return body["tasks"]


def _ack(node: Any, task: dict[str, Any]) -> None:
    status, body = node.post(f"/v1/tasks/{task['run_id']}/ack", {"worker_id": "w", "fence": task["fence"]})
    assert status == 200, body


def _listed(node: Any, queue: str) -> dict[str, Any]:
    status, body = node.get("/v1/queues")
    assert status == 200, body
    return next(q for q in body["queues"] if q["queue"] == queue)


def _schedctl(server: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedulerd.cli.main", "--server", server, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_max_running_holds_runs_back_until_a_place_frees(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    put = lambda body: http("PUT", f"{node.url}/v1/queues/lim", body)  # noqa: E731
    for bad, words in (({"max_running": 0}, "from 1 to"), ({"max_running": "2"}, "whole number"),
                       ({"max_running": True}, "whole number"), ({"max_starts_per_s": 0}, "from 0.01"),
                       ({"max_starts_per_s": -1.5}, "from 0.01"), ({"max_runing": 2}, "unknown field")):
        status, body = put(bad)
        assert status == 400 and words in body["error"]["message"], (bad, body)
    status, body = node.get("/v1/queues/lim")
    assert status == 200 and body["max_running"] is None and body["max_starts_per_s"] is None, body

    status, body = put({"max_running": 2})
    assert status == 200 and body["max_running"] == 2 and body["max_running_per_group"] == [2], body
    _jobs_due_now(node, "j", 6, "lim")
    wait_until(lambda: _listed(node, "lim")["ready"] == 6, 15, "six runs ready")
    first = _poll(node, "lim", 10)
    assert len(first) == 2
    assert _poll(node, "lim", 10) == []
    listed = _listed(node, "lim")
    assert (listed["running"], listed["ready"], listed["max_running"]) == (2, 4, 2), listed

    # An ack frees a place: a poll waiting on the queue gets the next run at once.
    got: list[list[dict[str, Any]]] = []
    waiter = threading.Thread(target=lambda: got.append(_poll(node, "lim", 10, wait_s=10)))
    waiter.start()
    time.sleep(0.3)  # the poll is waiting (nothing can be observed of it from outside)
    started = time.monotonic()
    _ack(node, first[0])
    waiter.join(15)
    assert len(got[0]) == 1 and time.monotonic() - started < 2, got

    status, body = put({})  # lifted
    assert status == 200 and body["max_running"] is None, body
    assert len(_poll(node, "lim", 10)) == 3


def test_max_starts_per_s_paces_the_leases(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    status, body = http("PUT", f"{node.url}/v1/queues/slow", {"max_starts_per_s": 4})
    assert status == 200 and body["max_starts_per_s"] == 4, body
    _jobs_due_now(node, "s", 40, "slow")
    wait_until(lambda: _listed(node, "slow")["ready"] == 40, 15, "forty runs ready")
    started = time.monotonic()
    leased = 0
    while time.monotonic() - started < 3:
        for task in _poll(node, "slow", 40, wait_s=1):
            _ack(node, task)
            leased += 1
    elapsed = time.monotonic() - started
    # A full bucket (a second's worth) at once, then 4 a second: never more.
    assert 4 + 4 * 3 * 0.6 <= leased <= 4 + 4 * elapsed + 1, (leased, elapsed)


def test_schedctl_queue(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    out = _schedctl(node.url, "queue", "set", "payments", "--max-running", "20")
    assert out.returncode == 0, out.stderr
    assert "max_running" in out.stdout and "20" in out.stdout
    out = _schedctl(node.url, "queue", "set", "payments", "--max-starts-per-s", "5.5")
    assert out.returncode == 0, out.stderr
    out = _schedctl(node.url, "--json", "queue", "get", "payments")
    assert out.returncode == 0, out.stderr
    assert '"max_running": 20' in out.stdout and '"max_starts_per_s": 5.5' in out.stdout  # the first set kept
    out = _schedctl(node.url, "queue", "list")
    assert out.returncode == 0 and "payments" in out.stdout and "5.5" in out.stdout, out
    out = _schedctl(node.url, "queue", "set", "payments", "--max-running", "none", "--max-starts-per-s", "none")
    assert out.returncode == 0, out.stderr
    out = _schedctl(node.url, "queue", "set", "payments", "--max-running", "lots")
    assert out.returncode != 0 and "whole number" in out.stderr
    out = _schedctl(node.url, "queue", "set", "payments", "--max-running", "0")
    assert out.returncode != 0 and "from 1 to" in out.stderr
    assert http("GET", f"{node.url}/v1/queues/payments")[1]["max_running"] is None


class Overlap:
    """Each run's handler interval, as its worker saw it: within the lease the cluster granted."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.done: set[str] = set()

    def handle(self, task: Task) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.4)
        with self.lock:
            self.now -= 1
            self.done.add(task.job_id)


def test_no_failover_runs_more_of_a_queue_than_its_limit(make_cluster) -> None:
    """Three groups on three nodes, max_running 3 (a share of 1 each), twelve worker slots, and
    the leader of group 0 killed part-way: every run ran, and never more than 3 at once."""
    cluster = make_cluster(3, groups=3)
    node = cluster.nodes[0]
    # Until each group has heard every voter say which entry versions it reads, it writes the oldest.
    status, body = wait_until(lambda: (answer := http("PUT", f"{node.url}/v1/queues/capped", {"max_running": 3}))[0]
                              != 409 and answer, 15, "every voter known to read version 21")
    assert status == 200 and body["max_running_per_group"] == [1, 1, 1], body
    overlap = Overlap()
    sampled: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        """Every 50 ms, the running count as the first node that answers gives it (the one
        killed may be asked as it dies: the next is asked then)."""
        while not stop.is_set():
            for n in cluster.nodes:
                try:
                    status, body = n.get("/v1/queues")
                except (OSError, ValueError):  # refused, timed out, or cut off mid-answer
                    continue
                if status == 200:
                    sampled.extend(q["running"] for q in body["queues"] if q["queue"] == "capped")
                    break
            time.sleep(0.05)

    workers = [Worker(servers=cluster.urls, concurrency=4, wait_s=1) for _ in range(3)]
    for worker in workers:
        worker.handler("capped")(overlap.handle)
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    sampler = threading.Thread(target=sample, daemon=True)
    _jobs_due_now(node, "c", 45, "capped")
    for thread in (*threads, sampler):
        thread.start()
    try:
        wait_until(lambda: len(overlap.done) >= 10, 60, "ten runs done")
        cluster.leader().kill9()
        killed_at = len(sampled)
        wait_until(lambda: len(overlap.done) == 45, 120, "all 45 runs done")
    finally:
        stop.set()
        for worker in workers:
            worker.stop()
        for thread in (*threads, sampler):
            thread.join(15)
    assert overlap.most == 3, f"at most {overlap.most} at once: the limit of 3 was {'passed' if overlap.most > 3 else 'never reached'}"
    assert len(sampled) > killed_at and max(sampled) <= 3, sampled  # sampled after the kill too
