"""One run's cancel, the cancel_other and buffer_all overlap policies and pause_on_failure,
through a real node and the worker SDK: what a user sees in the API and in the handler."""
from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Any, Iterator

import pytest

from schedulerd.sdk.worker import Task, Worker
from tests.integration.harness import wait_until

pytestmark = pytest.mark.integration


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


class Blocking:
    """A worker whose handler holds each task until its lease is lost (or the test ends)."""

    def __init__(self, urls: list[str]) -> None:
        self.started: list[Task] = []
        self.lost: list[str] = []
        self.released = threading.Event()
        self.worker = Worker(servers=urls, concurrency=4, wait_s=1, heartbeat_interval_s=0.3)
        self.worker.handler("slow")(self._handle)
        self.worker.on_lease_lost(lambda task: self.lost.append(task.run_id))
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def _handle(self, task: Task) -> None:
        self.started.append(task)
        wait_until(lambda: task.run_id in self.lost or self.released.is_set(), 30, "the lease lost")


@pytest.fixture
def blocking(make_cluster) -> Iterator[tuple[Any, Blocking]]:
    node = make_cluster(1).nodes[0]
    worker = Blocking([node.url])
    worker.thread.start()
    try:
        yield node, worker
    finally:
        worker.released.set()
        worker.worker.stop()
        worker.thread.join(15)


def test_cancelling_a_running_run_revokes_its_lease_and_its_worker_hears_it(blocking) -> None:
    node, worker = blocking
    assert node.post("/v1/jobs", {"job_id": "once", "schedule": {"at": _now_iso()}, "queue": "slow"})[0] == 201
    wait_until(lambda: worker.started, 15, "the run started")
    run_id = worker.started[0].run_id
    status, body = node.post(f"/v1/runs/{run_id}/cancel", {})
    assert status == 200, body
    assert body["run"]["state"] == "cancelled" and body["run"]["reason"] == "run_cancelled"
    wait_until(lambda: run_id in worker.lost, 10, "the SDK's lease-lost hook for the cancelled run")
    # The handler returned after the hook: its ack was refused, and the run stays cancelled.
    wait_until(lambda: worker.worker.stats.lease_lost >= 1, 5, "the worker counted the lost lease")
    assert node.get(f"/v1/runs/{run_id}")[1]["state"] == "cancelled"
    assert worker.worker.stats.acked == 0
    # A second cancel (a caller that lost the answer) is answered as the first; a finished run is refused.
    status, again = node.post(f"/v1/runs/{run_id}/cancel", {})
    assert status == 200 and again["run"]["finished_at"] == body["run"]["finished_at"]
    status, err = node.post("/v1/runs/0-999999-0/cancel", {})
    assert status == 404 and err["error"]["code"] == "not_found"


def test_cancel_other_replaces_the_running_run_with_the_new_occurrence(blocking) -> None:
    node, worker = blocking
    status, job = node.post("/v1/jobs", {"job_id": "tick", "schedule": {"every": "2s"}, "queue": "slow",
                                         "overlap_policy": "cancel_other"})
    assert status == 201 and job["overlap_policy"] == "cancel_other", job
    wait_until(lambda: len(worker.started) >= 2, 20, "a second occurrence started")
    first = worker.started[0].run_id
    wait_until(lambda: first in worker.lost, 10, "the first run's worker heard it was replaced")
    run = node.get(f"/v1/runs/{first}")[1]
    assert run["state"] == "cancelled" and run["reason"] == "overlap"
    runs = node.get("/v1/jobs/tick/runs")[1]["runs"]
    assert sum(r["state"] == "running" for r in runs) <= 1


def test_buffer_all_queues_each_occurrence_behind_the_running_one(blocking) -> None:
    node, worker = blocking
    assert node.post("/v1/jobs", {"job_id": "tick", "schedule": {"every": "1s"}, "queue": "slow",
                                  "overlap_policy": "buffer_all"})[0] == 201

    def runs() -> list[dict[str, Any]]:
        return node.get("/v1/jobs/tick/runs")[1]["runs"]

    wait_until(lambda: sum(r["buffered"] for r in runs()) >= 2, 20, "two occurrences buffered")
    assert len(worker.started) == 1 and sum(r["state"] == "running" for r in runs()) == 1
    oldest = min((r for r in runs() if r["buffered"]), key=lambda r: r["scheduled_time"])
    # The running one ends (cancelled here): the oldest buffered one runs next, alone.
    assert node.post(f"/v1/runs/{worker.started[0].run_id}/cancel", {})[0] == 200
    wait_until(lambda: len(worker.started) == 2, 10, "the oldest buffered run started")
    assert worker.started[1].run_id == oldest["run_id"]
    assert sum(r["state"] == "running" for r in runs()) == 1


def test_pause_on_failure_pauses_the_job_and_says_which_run(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    status, job = node.post("/v1/jobs", {"job_id": "fragile", "schedule": {"every": "1s"}, "queue": "q",
                                         "max_attempts": 1, "pause_on_failure": True})
    assert status == 201 and job["pause_on_failure"] is True and job["pause_cause"] is None
    status, body = node.post("/v1/tasks/poll", {"worker_id": "w", "queues": ["q"], "wait_s": 5})
    task = body["tasks"][0]
    status, nacked = node.post(f"/v1/tasks/{task['run_id']}/nack", {"worker_id": "w", "fence": task["fence"],
                                                                   "error": "boom"})
    assert status == 200 and nacked["run"]["state"] == "dead_letter"
    view = node.get("/v1/jobs/fragile")[1]
    assert view["state"] == "paused"
    assert view["pause_cause"]["reason"] == "run_dead_lettered" and view["pause_cause"]["run_id"] == task["run_id"]
    status, resumed = node.post("/v1/jobs/fragile/resume", {})
    assert status == 200 and resumed["state"] == "scheduled" and resumed["pause_cause"] is None
    status, err = node.post("/v1/jobs", {"job_id": "bad", "schedule": {"every": "1s"}, "pause_on_failure": "yes"})
    assert status == 400 and "pause_on_failure must be true or false" in err["error"]["message"]
