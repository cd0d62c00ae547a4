"""Worker SDK against fake nodes that speak /v1/tasks/* from docs/api.md.

The fake nodes run on their own event loop in a background thread and share one
in-memory FakeCluster, the way real nodes share replicated state; the worker
runs `run()` in another thread, so `stop()` is exercised from a foreign thread."""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from schedulerd import timefmt
from schedulerd.sdk.worker import ERROR_BYTES_MAX, Task, Worker
from tests.waiting import wait_until

LOG = "schedulerd.worker"
ROOT = Path(__file__).resolve().parents[2]


class Running:
    """Counts the handlers inside `with running:` at once, and the most ever seen."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def __enter__(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def __exit__(self, *exc: object) -> None:
        self.now -= 1



def iso(dt: datetime) -> str:
    return timefmt.to_iso(timefmt.from_datetime(dt))


class FakeCluster:
    """Run state shared by all fake nodes: queued tasks, leases, and a log of
    every request as (kind, node, body, status)."""

    def __init__(self, lease_s: float = 30.0) -> None:
        self.lease_s = lease_s
        self.any_queue = False  # deliver tasks of queues the poll did not ask for
        self.result_bytes_max = 16 * 1024
        self.lease_batch_max = 500
        self.ack_batch_max = 500
        self.clock_offset_s = 0.0  # the cluster's time minus the worker's (the box's)
        self.members: list[dict[str, str]] | None = None  # what /v1/cluster lists as nodes (None: 404)
        self.ack_delay_s = 0.0  # how long a batch ack takes to commit
        self.lock = threading.Lock()
        self.queued: list[dict[str, Any]] = []
        self.leased: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str, str, dict[str, Any], int]] = []
        self.delivered_by: dict[str, str] = {}
        self.active_polls = 0
        self._ids = itertools.count(1)
        self._fences = itertools.count(4711)

    def add(self, queue: str, payload: Any = None) -> str:
        n = next(self._ids)
        scheduled = datetime(2026, 12, 1, 2, 0, tzinfo=timezone.utc) + timedelta(seconds=n)
        task = {"run_id": f"0-{n}-0", "job_id": f"job-{n}", "queue": queue,
                "scheduled_time": iso(scheduled), "attempt": 0,
                "idempotency_key": f"job-{n}:{iso(scheduled)}", "payload": payload}
        with self.lock:
            self.queued.append(task)
        return task["run_id"]

    def lease(self, node: str, worker_id: str, queues: list[str], n: int) -> list[dict[str, Any]]:
        with self.lock:
            picked = [t for t in self.queued if self.any_queue or t["queue"] in queues][:n]
            for task in picked:
                self.queued.remove(task)
                task.update(attempt=task["attempt"] + 1, fence=next(self._fences),
                            worker_id=worker_id, lease_until=self._lease_until())
                self.leased[task["run_id"]] = task
                self.delivered_by[task["run_id"]] = node
            return [{k: v for k, v in t.items() if k != "worker_id"} for t in picked]

    def holder(self, run_id: str, worker_id: str, fence: int) -> dict[str, Any] | None:
        """The leased task if this worker still holds this fence, else None (stale)."""
        task = self.leased.get(run_id)
        if task is None or task["worker_id"] != worker_id or task["fence"] != fence:
            return None
        if timefmt.from_iso(task["lease_until"]) < timefmt.from_datetime(self.now()):
            return None
        return task

    def extend(self, run_id: str, worker_id: str, fence: int) -> str | None:
        with self.lock:
            task = self.holder(run_id, worker_id, fence)
            if task is None:
                return None
            task["lease_until"] = self._lease_until()
            return task["lease_until"]

    def finish(self, run_id: str, worker_id: str, fence: int) -> bool:
        with self.lock:
            if self.holder(run_id, worker_id, fence) is None:
                return False
            del self.leased[run_id]
            return True

    def revoke(self, run_id: str) -> None:
        """What a lease expiry plus redelivery does to the old holder: a new fence."""
        with self.lock:
            self.leased[run_id]["fence"] = next(self._fences)

    def record(self, kind: str, node: str, body: dict[str, Any], status: int) -> None:
        with self.lock:
            self.events.append((kind, node, body, status))

    def bodies(self, kind: str, status: int = 200) -> list[dict[str, Any]]:
        with self.lock:
            return [b for k, _, b, s in self.events if k == kind and s == status]

    def now(self) -> datetime:
        return datetime.now(timezone.utc) + timedelta(seconds=self.clock_offset_s)

    def _lease_until(self) -> str:
        return iso(self.now() + timedelta(seconds=self.lease_s))


def stale(run_id: str) -> dict[str, Any]:
    return {"code": "stale_fence", "message": f"run {run_id}: lease is not yours"}


class FakeNode:
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.heartbeat_stall_s = 0.0  # a node that holds heartbeat requests this long
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        app = web.Application()
        app.add_routes([
            web.get("/v1/cluster", self.cluster_view),
            web.post("/v1/tasks/poll", self.poll),
            web.post("/v1/tasks/heartbeat", self.heartbeat_batch),
            web.post("/v1/tasks/ack", self.ack_batch),
            web.post("/v1/tasks/{run_id}/heartbeat", self.heartbeat),
            web.post("/v1/tasks/{run_id}/ack", self.settle),
            web.post("/v1/tasks/{run_id}/nack", self.settle),
        ])
        self.runner = web.AppRunner(app, shutdown_timeout=0.5)

    async def start(self) -> None:
        await self.runner.setup()
        await web.SockSite(self.runner, self.sock).start()

    async def stop(self) -> None:
        await self.runner.cleanup()

    def reply(self, kind: str, body: dict[str, Any], status: int, data: dict[str, Any]) -> web.Response:
        self.cluster.record(kind, self.url, body, status)
        return web.json_response(data, status=status)

    async def cluster_view(self, request: web.Request) -> web.Response:
        if self.cluster.members is None:
            return web.json_response({"error": {"code": "not_found", "message": "no route"}}, status=404)
        return web.json_response({"nodes": self.cluster.members})

    async def poll(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not 1 <= body["max_tasks"] <= self.cluster.lease_batch_max:
            return self.reply("poll", body, 400, {"error": {
                "code": "limit_exceeded",
                "message": f"max_tasks={body['max_tasks']} is over lease_batch_max ({self.cluster.lease_batch_max})"}})
        if not 0 <= body["wait_s"] <= 30:
            return self.reply("poll", body, 400, {"error": {"code": "limit_exceeded",
                                                           "message": "wait_s is over long_poll_s_max (30)"}})
        deadline = time.monotonic() + body["wait_s"]
        self.cluster.active_polls += 1
        try:
            while True:
                if request.transport is None or request.transport.is_closing():
                    return self.reply("poll", body, 200, {"tasks": []})  # client gone
                tasks = self.cluster.lease(self.url, body["worker_id"], body["queues"],
                                           body["max_tasks"])
                if tasks or time.monotonic() >= deadline:
                    return self.reply("poll", body, 200, {"tasks": tasks, "now": iso(self.cluster.now())})
                await asyncio.sleep(0.01)
        finally:
            self.cluster.active_polls -= 1

    async def heartbeat(self, request: web.Request) -> web.Response:
        body = await request.json()
        run_id = request.match_info["run_id"]
        until = self.cluster.extend(run_id, body["worker_id"], body["fence"])
        if until is None:
            return self.reply("heartbeat", body, 409, {"error": stale(run_id)})
        return self.reply("heartbeat", body, 200, {"lease_until": until})

    async def heartbeat_batch(self, request: web.Request) -> web.Response:
        body = await request.json()
        stalled_until = time.monotonic() + self.heartbeat_stall_s
        while self.heartbeat_stall_s and time.monotonic() < stalled_until:  # ends early once the test lifts it
            await asyncio.sleep(0.05)
        if len(body["leases"]) > self.cluster.ack_batch_max:
            return self.reply("heartbeat_batch", body, 400, {"error": {
                "code": "limit_exceeded", "message": f"{len(body['leases'])} leases; ack_batch_max is "
                                                     f"{self.cluster.ack_batch_max}"}})
        results = []
        for lease in body["leases"]:
            until = self.cluster.extend(lease["run_id"], body["worker_id"], lease["fence"])
            results.append({"run_id": lease["run_id"], "ok": True, "lease_until": until}
                           if until else
                           {"run_id": lease["run_id"], "ok": False, "error": stale(lease["run_id"])})
        return self.reply("heartbeat_batch", body, 200, {"results": results, "now": iso(self.cluster.now())})

    async def ack_batch(self, request: web.Request) -> web.Response:
        """Like the server: one oversized result refuses the whole request; otherwise
        each item is recorded as if it came alone."""
        body = await request.json()
        await asyncio.sleep(self.cluster.ack_delay_s)
        if any(len(json.dumps(a.get("result"))) > self.cluster.result_bytes_max for a in body["acks"]):
            return self.reply("ack_batch", body, 413, {"error": {"code": "too_large",
                                                                "message": "result_bytes_max is exceeded"}})
        results = []
        for ack in body["acks"]:
            item = {"worker_id": body["worker_id"], "fence": ack["fence"], "result": ack.get("result"),
                    "run_id": ack["run_id"]}
            if self.cluster.finish(ack["run_id"], body["worker_id"], ack["fence"]):
                self.cluster.record("ack", self.url, item, 200)
                results.append({"run_id": ack["run_id"], "ok": True})
            else:
                self.cluster.record("ack", self.url, item, 409)
                results.append({"run_id": ack["run_id"], "ok": False, "error": stale(ack["run_id"])})
        return self.reply("ack_batch", body, 200, {"results": results})

    async def settle(self, request: web.Request) -> web.Response:
        body = await request.json()
        run_id = request.match_info["run_id"]
        kind = request.path.rsplit("/", 1)[1]
        body["run_id"] = run_id
        if kind == "ack" and len(json.dumps(body.get("result"))) > self.cluster.result_bytes_max:
            return self.reply(kind, body, 413, {"error": {"code": "too_large",
                                                          "message": "result_bytes_max is exceeded"}})
        if not self.cluster.finish(run_id, body["worker_id"], body["fence"]):
            return self.reply(kind, body, 409, {"error": stale(run_id)})
        state = "succeeded" if kind == "ack" else "retry_wait"
        return self.reply(kind, body, 200, {"run": {"run_id": run_id, "state": state}})


class Net:
    """Fake nodes on a background event loop; workers in their own threads."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.nodes: list[FakeNode] = []
        self.workers: list[tuple[Worker, threading.Thread]] = []

    def node(self, cluster: FakeCluster) -> FakeNode:
        node = FakeNode(cluster)
        asyncio.run_coroutine_threadsafe(node.start(), self.loop).result(5)
        self.nodes.append(node)
        return node

    def kill(self, node: FakeNode) -> None:
        asyncio.run_coroutine_threadsafe(node.stop(), self.loop).result(5)
        self.nodes.remove(node)

    def run(self, worker: Worker) -> threading.Thread:
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        self.workers.append((worker, thread))
        return thread

    def close(self) -> None:
        for worker, thread in self.workers:
            worker.stop()
            thread.join(5)
            assert not thread.is_alive(), "worker did not stop within 5 s"
        for node in list(self.nodes):
            self.kill(node)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def net():
    net = Net()
    yield net
    net.close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_sync_and_async_handlers_are_acked_with_their_results(net):
    cluster = FakeCluster()
    node = net.node(cluster)
    worker = Worker([node.url], worker_id="w1", wait_s=1.0)
    seen: dict[str, tuple[Task, str]] = {}

    @worker.handler("emails")
    def send(task: Task) -> dict[str, Any]:
        seen["emails"] = (task, threading.current_thread().name)
        return {"sent_to": task.payload["to"]}

    @worker.handler("reports")
    async def report(task: Task) -> list[int]:
        seen["reports"] = (task, threading.current_thread().name)
        return [task.payload, task.attempt]

    class Resizer:  # an object whose __call__ is a coroutine function is awaited too
        async def __call__(self, task: Task) -> str:
            seen["images"] = (task, threading.current_thread().name)
            return "resized"

    worker.handler("images")(Resizer())
    email_run = cluster.add("emails", {"to": "a@example.com"})
    report_run = cluster.add("reports", 7)
    image_run = cluster.add("images", None)
    net.run(worker)
    wait_until(lambda: worker.stats.acked == 3, what="three acks")

    acks = {b["run_id"]: b for b in cluster.bodies("ack")}
    assert acks[email_run]["result"] == {"sent_to": "a@example.com"}
    assert acks[report_run]["result"] == [7, 1]
    assert acks[image_run]["result"] == "resized" and not seen["images"][1].startswith("schedulerd-task")
    assert acks[email_run]["worker_id"] == "w1"
    task, thread_name = seen["emails"]
    assert thread_name.startswith("schedulerd-task")  # sync handlers run off the event loop
    assert not seen["reports"][1].startswith("schedulerd-task")
    assert task.scheduled_time.tzinfo is not None and task.scheduled_time.utcoffset() == timedelta(0)
    assert task.idempotency_key == f"{task.job_id}:{iso(task.scheduled_time)}"
    assert (task.attempt, task.fence) == (1, acks[email_run]["fence"])
    assert task.lease_until > datetime.now(timezone.utc)
    assert sorted(cluster.bodies("poll")[0]["queues"]) == ["emails", "images", "reports"]
    assert worker.stats.polled == 3 and worker.stats.nacked == 0


def test_handler_exception_is_nacked_with_error_text(net, caplog):
    caplog.set_level(logging.INFO, logger=LOG)
    cluster = FakeCluster()
    node = net.node(cluster)
    worker = Worker([node.url], wait_s=1.0)

    @worker.handler("emails")
    def send(task: Task) -> Any:
        if task.payload == "not json":
            return {1, 2}
        if task.payload == "null key":
            return {None: 1}  # json.dumps writes it as "null"; the ack's encoder refuses it
        if task.payload == "exit":
            sys.exit(3)
        raise ValueError(task.payload)

    short = cluster.add("emails", "bad address: nobody@")
    huge = cluster.add("emails", "x" * 20_000)
    not_json = cluster.add("emails", "not json")
    null_key = cluster.add("emails", "null key")
    exits = cluster.add("emails", "exit")
    net.run(worker)
    wait_until(lambda: worker.stats.nacked == 5, what="five nacks")

    nacks = {b["run_id"]: b["error"] for b in cluster.bodies("nack")}
    assert nacks[short].startswith("ValueError: bad address: nobody@\n")
    assert "raise ValueError(task.payload)" in nacks[short]  # the innermost frame survives
    assert len(nacks[huge].encode()) <= ERROR_BYTES_MAX
    assert nacks[huge].startswith("ValueError: xxx")
    assert "raise ValueError(task.payload)" in nacks[huge]
    assert nacks[not_json].startswith("TypeError: ") and "set" in nacks[not_json].splitlines()[0]
    assert nacks[null_key].startswith("TypeError: ")
    assert nacks[exits].startswith("SystemExit: 3\n")  # the task failed; the worker goes on
    assert worker.stats.acked == 0 and not cluster.bodies("ack")
    assert f"task_nacked run_id={short}" in caplog.text


def test_a_file_name_that_is_not_utf8_in_a_result_or_an_error_is_still_acked_or_nacked(net):
    cluster = FakeCluster()
    node = net.node(cluster)
    worker = Worker([node.url], wait_s=1.0)
    name = os.fsdecode(b"report-\xff.csv")  # a lone surrogate: no UTF-8 form

    @worker.handler("files")
    def handle(task: Task) -> dict[str, str]:
        if task.payload == "fail":
            raise FileNotFoundError(f"no such file: {name}")
        return {"wrote": name}

    good, bad = cluster.add("files", "ok"), cluster.add("files", "fail")
    net.run(worker)
    wait_until(lambda: (worker.stats.acked, worker.stats.nacked) == (1, 1), what="one ack and one nack")

    assert [b["result"] for b in cluster.bodies("ack")] == [{"wrote": name}]
    assert cluster.bodies("nack")[0]["run_id"] == bad
    assert cluster.bodies("nack")[0]["error"].startswith("FileNotFoundError: no such file: report-?.csv")
    assert cluster.bodies("ack")[0]["run_id"] == good


def test_slow_handler_is_heartbeated_past_its_lease_before_ack(net):
    cluster = FakeCluster(lease_s=0.9)  # interval max(0.5 s, 0.9 s / 3) = 0.5 s
    node = net.node(cluster)
    worker = Worker([node.url], wait_s=1.0)

    @worker.handler("slow")
    def slow(task: Task) -> str:
        # Outlive the original lease: the ack only succeeds if heartbeats extended it.
        wait_until(lambda: len(cluster.bodies("heartbeat_batch")) >= 2, what="two heartbeats")
        return "done"

    run_id = cluster.add("slow")
    net.run(worker)
    wait_until(lambda: worker.stats.acked == 1, what="ack after heartbeats")

    kinds = [(k, s) for k, _, b, s in cluster.events if k != "poll"]
    assert kinds[:2] == [("heartbeat_batch", 200), ("heartbeat_batch", 200)]
    assert ("ack", 200) in kinds
    leases = cluster.bodies("heartbeat_batch")[0]["leases"]
    assert leases == [{"run_id": run_id, "fence": cluster.bodies("ack")[0]["fence"]}]
    assert worker.stats.lease_lost == 0


def test_heartbeats_of_more_leases_than_one_request_takes_go_in_several(net):
    cluster = FakeCluster(lease_s=0.9)
    cluster.ack_batch_max = 500  # the server's fixed limit, which the SDK's batches keep to
    worker = Worker([net.node(cluster).url], concurrency=600, wait_s=1.0)
    gate = threading.Event()

    @worker.handler("slow")
    async def slow(task: Task) -> None:
        while not gate.is_set():
            await asyncio.sleep(0.05)

    for _ in range(600):
        cluster.add("slow")
    net.run(worker)
    wait_until(lambda: len(cluster.leased) == 600, what="600 leases")
    wait_until(lambda: sum(len(b["leases"]) for b in cluster.bodies("heartbeat_batch")) >= 1200,
               what="two rounds of heartbeats for every lease")
    gate.set()
    wait_until(lambda: worker.stats.acked == 600, what="600 acks")
    assert all(len(b["leases"]) <= 500 for b in cluster.bodies("heartbeat_batch"))
    assert not cluster.bodies("heartbeat_batch", status=400) and worker.stats.lease_lost == 0


def test_a_node_that_holds_its_heartbeats_does_not_hold_up_the_other_nodes_leases(net):
    cluster = FakeCluster(lease_s=1.5)  # heartbeats every 0.5 s
    healthy, stalled = net.node(cluster), net.node(cluster)
    worker = Worker([healthy.url, stalled.url], concurrency=2, wait_s=1.0)
    done = threading.Event()

    @worker.handler("work")
    def work(task: Task) -> None:
        done.wait(10)

    runs = [cluster.add("work"), cluster.add("work")]
    net.run(worker)
    wait_until(lambda: len(cluster.leased) == 2, what="both tasks leased")
    ours = next(r for r in runs if cluster.delivered_by[r] == healthy.url)
    stalled.heartbeat_stall_s = 5.0
    since = len(cluster.events)
    wait_until(lambda: sum(n == healthy.url for k, n, _, s in cluster.events[since:] if k == "heartbeat_batch")
               >= 5, timeout_s=4, what="the healthy node's heartbeats going on, every 0.5 s")
    done.set()
    wait_until(lambda: any(b["run_id"] == ours for b in cluster.bodies("ack")), what="its ack")
    stalled.heartbeat_stall_s = 0.0


@pytest.mark.parametrize("cluster_ahead_s", [-60.0, 60.0])
def test_leases_are_measured_on_the_clusters_clock_not_the_workers(net, cluster_ahead_s):
    """A worker clock a minute ahead saw every lease as over on arrival, and dropped every
    task; a minute behind, it heartbeated after its leases had ended."""
    cluster = FakeCluster(lease_s=1.5)  # heartbeats every 0.5 s
    cluster.clock_offset_s = cluster_ahead_s
    worker = Worker([net.node(cluster).url], wait_s=1.0)

    @worker.handler("work")
    def work(task: Task) -> str:
        wait_until(lambda: len(cluster.bodies("heartbeat_batch")) >= 4, what="four heartbeats")
        return "done"

    cluster.add("work")
    net.run(worker)
    wait_until(lambda: worker.stats.acked == 1, what="the ack")
    assert worker.stats.lease_lost == 0 and len(cluster.bodies("heartbeat_batch")) >= 4


def test_concurrency_limit_holds_across_servers(net):
    cluster = FakeCluster()
    nodes = [net.node(cluster), net.node(cluster)]
    worker = Worker([n.url for n in nodes], concurrency=3, wait_s=1.0)
    running = Running()

    # Async on purpose: sync handlers are also capped by the thread pool's size,
    # which would hide a leak in the worker's own slot accounting.
    @worker.handler("work")
    async def work(task: Task) -> None:
        with running:
            await asyncio.sleep(0.05)  # the work itself; gives the limit a chance to be broken

    for _ in range(15):
        cluster.add("work")
    net.run(worker)
    wait_until(lambda: worker.stats.acked == 15, what="15 acks")

    assert running.peak == 3
    assert all(1 <= b["max_tasks"] <= 3 for b in cluster.bodies("poll"))
    assert {cluster.delivered_by[r] for r in (b["run_id"] for b in cluster.bodies("ack"))} \
        == {n.url for n in nodes}  # both loops did work


def test_a_slot_is_free_again_when_its_handler_returns_not_when_its_ack_commits(net):
    """`concurrency` bounds handlers running at once: with one slot and acks that take
    0.5 s to commit, the next tasks still run while the first ack is on its way."""
    cluster = FakeCluster()
    cluster.ack_delay_s = 0.5
    node = net.node(cluster)
    worker = Worker([node.url], concurrency=1, wait_s=1.0)
    started: list[float] = []
    running = Running()

    @worker.handler("work")
    async def work(task: Task) -> None:
        started.append(time.monotonic())
        with running:
            await asyncio.sleep(0.01)

    for _ in range(3):
        cluster.add("work")
    net.run(worker)
    wait_until(lambda: worker.stats.acked == 3, what="three acks")

    assert running.peak == 1
    assert started[2] - started[0] < cluster.ack_delay_s


def test_a_server_with_a_lower_lease_batch_max_gets_smaller_polls(net, caplog):
    """A server configured below the SDK's poll size answers limit_exceeded: the worker
    halves its polls to that server until they fit, and keeps working."""
    caplog.set_level(logging.WARNING, logger=LOG)
    cluster = FakeCluster()
    cluster.lease_batch_max = 100
    worker = Worker([net.node(cluster).url], concurrency=400, wait_s=1.0)

    @worker.handler("work")
    async def work(task: Task) -> None:
        pass

    for _ in range(150):
        cluster.add("work")
    net.run(worker)
    wait_until(lambda: worker.stats.acked == 150, what="150 acks")

    asked = [(b["max_tasks"], s) for k, _, b, s in cluster.events if k == "poll"]
    assert asked[:3] == [(400, 400), (200, 400), (100, 200)]
    assert all(n <= 100 for n, _ in asked[3:]) and worker.stats.poll_errors == 0
    assert sum("poll_size_lowered" in r.getMessage() for r in caplog.records) == 2


def test_on_settled_hears_each_accepted_ack_and_nack_and_a_failing_hook_spares_the_rest(net, caplog):
    caplog.set_level(logging.INFO, logger=LOG)
    cluster = FakeCluster()
    node = net.node(cluster)
    worker = Worker([node.url], wait_s=1.0)
    heard: list[tuple[str, str, str]] = []

    @worker.handler("work")
    def work(task: Task) -> str:
        if task.payload == "fail":
            raise RuntimeError("no")
        return "done"

    def broken(task: Task, outcome: str) -> None:
        raise KeyError(task.run_id)

    worker.on_settled(broken)
    worker.on_settled(lambda task, outcome: heard.append((task.run_id, outcome, threading.current_thread().name)))
    good, bad = cluster.add("work", "ok"), cluster.add("work", "fail")
    thread = net.run(worker)
    wait_until(lambda: len(heard) == 2, what="two settled runs")

    assert sorted(heard) == sorted([(good, "acked", thread.name), (bad, "nacked", thread.name)])
    assert (worker.stats.acked, worker.stats.nacked) == (1, 1)  # the broken hook undid nothing
    assert caplog.text.count("settled_hook_failed") == 2


def test_dead_server_does_not_stop_the_worker(net, caplog):
    caplog.set_level(logging.INFO, logger=LOG)
    cluster = FakeCluster()
    live = net.node(cluster)
    dead = closed_port_url()
    worker = Worker([dead, live.url], concurrency=2, wait_s=1.0)
    worker.handler("work")(lambda task: task.payload)

    for i in range(6):
        cluster.add("work", i)
    net.run(worker)
    wait_until(lambda: worker.stats.acked == 6, what="6 acks")
    wait_until(lambda: worker.stats.poll_errors >= 2, what="the dead node retried")

    assert sorted(b["result"] for b in cluster.bodies("ack")) == list(range(6))
    assert f"poll_failed server={dead}" in caplog.text


def test_a_worker_follows_the_nodes_the_cluster_lists(net, monkeypatch):
    monkeypatch.setattr("schedulerd.sdk.wire.MEMBERS_EVERY_S", 0.2)
    cluster = FakeCluster()
    first, joined, leaving = net.node(cluster), net.node(cluster), net.node(cluster)

    def listed(*nodes: FakeNode, dead: FakeNode | None = None) -> list[dict[str, str]]:
        out = [{"http": n.url.removeprefix("http://"), "state": "alive"} for n in nodes]
        return out + ([{"http": dead.url.removeprefix("http://"), "state": "dead"}] if dead else [])

    cluster.members = listed(first, leaving)
    worker = Worker([first.url], concurrency=4, wait_s=0.5)
    worker.handler("work")(lambda task: None)
    net.run(worker)
    wait_until(lambda: sorted(worker.servers) == sorted([first.url, leaving.url]), what="the listed nodes")
    cluster.members = listed(first, joined, dead=leaving)  # one joined, one was declared dead
    wait_until(lambda: sorted(worker.servers) == sorted([first.url, joined.url]), what="the new list")
    polled_at = len(cluster.events)
    wait_until(lambda: any(k == "poll" and n == joined.url for k, n, _, _ in cluster.events[polled_at:]),
               what="a poll on the joined node")
    assert leaving.url not in worker._pollers  # its poll loop was stopped
    for i in range(4):
        cluster.add("work", i)
    wait_until(lambda: worker.stats.acked == 4, what="4 acks")


def test_result_the_server_refuses_is_nacked_with_the_reason(net):
    cluster = FakeCluster()
    cluster.result_bytes_max = 50
    node = net.node(cluster)
    worker = Worker([node.url], wait_s=1.0)
    worker.handler("work")(lambda task: "x" * 100)

    run_id = cluster.add("work")
    net.run(worker)
    wait_until(lambda: worker.stats.nacked == 1, what="the fallback nack")

    refused = [a["run_id"] for b in cluster.bodies("ack_batch", status=413) for a in b["acks"]]
    assert refused + [b["run_id"] for b in cluster.bodies("ack", status=413)] == [run_id]
    [nack] = cluster.bodies("nack")
    assert nack["error"].startswith("ResultRejected: ") and "result_bytes_max" in nack["error"]
    assert worker.stats.acked == 0


def test_acks_finishing_together_share_a_request_and_one_refused_result_spares_the_rest(net):
    cluster = FakeCluster()
    cluster.result_bytes_max = 50
    node = net.node(cluster)
    worker = Worker([node.url], concurrency=20, wait_s=1.0)
    gate = threading.Event()

    @worker.handler("work")
    def work(task):
        gate.wait(10)
        return "x" * 100 if task.payload == "big" else task.payload

    big = cluster.add("work", "big")
    small = [cluster.add("work", n) for n in range(9)]
    net.run(worker)
    wait_until(lambda: len(cluster.leased) == 10, what="all ten tasks leased")
    gate.set()
    wait_until(lambda: worker.stats.acked == 9 and worker.stats.nacked == 1, what="nine acks and one nack")

    assert sorted(b["run_id"] for b in cluster.bodies("ack")) == sorted(small)
    assert [b["run_id"] for b in cluster.bodies("nack")] == [big]
    # Far fewer requests than acks: the first went alone, the rest rode together.
    assert len(cluster.bodies("ack_batch")) + len(cluster.bodies("ack_batch", status=413)) < 9


def test_rejected_poll_is_logged_as_error_and_retried(net, caplog):
    caplog.set_level(logging.INFO, logger=LOG)
    node = net.node(FakeCluster())
    worker = Worker([node.url], wait_s=31.0)  # over the fake's long_poll_s_max of 30
    worker.handler("work")(lambda task: None)

    net.run(worker)
    wait_until(lambda: worker.stats.poll_errors >= 2, what="a retried 400")

    errors = [r for r in caplog.records if r.getMessage().startswith("poll_failed")]
    assert errors[0].levelno == logging.ERROR and "LimitExceeded" in errors[0].getMessage()


def test_a_task_with_a_time_without_zone_fails_the_poll_and_runs_nothing(net, caplog):
    caplog.set_level(logging.INFO, logger=LOG)
    cluster = FakeCluster()
    node = net.node(cluster)
    ran: list[Task] = []
    worker = Worker([node.url], wait_s=1.0)
    worker.handler("work")(ran.append)
    run_id = cluster.add("work")
    cluster.queued[0]["scheduled_time"] = "2026-12-01T02:00:01"  # no Z: whose midnight?

    net.run(worker)
    wait_until(lambda: worker.stats.poll_errors >= 1, what="the malformed poll answer")

    errors = [r.getMessage() for r in caplog.records if r.getMessage().startswith("poll_failed")]
    assert "malformed answer" in errors[0] and "scheduled_time" in errors[0], errors
    assert ran == [] and not cluster.bodies("ack") and run_id in cluster.leased


def test_ack_fails_over_when_the_delivering_node_dies(net):
    cluster = FakeCluster()
    nodes = {n.url: n for n in (net.node(cluster), net.node(cluster))}
    worker = Worker(list(nodes), wait_s=1.0)
    started, release = threading.Event(), threading.Event()

    @worker.handler("work")
    def work(task: Task) -> str:
        started.set()
        release.wait(5)
        return "ok"

    run_id = cluster.add("work")
    net.run(worker)
    wait_until(started.is_set, what="handler start")
    delivered_by = cluster.delivered_by[run_id]
    net.kill(nodes[delivered_by])
    release.set()
    wait_until(lambda: worker.stats.acked == 1, what="ack via the surviving node")

    [(_, acked_by, body, _)] = [e for e in cluster.events if e[0] == "ack"]
    assert acked_by != delivered_by and body["result"] == "ok"


def test_stale_fence_on_heartbeat_is_lease_lost_not_a_crash(net, caplog):
    caplog.set_level(logging.INFO, logger=LOG)
    cluster = FakeCluster(lease_s=1.5)  # heartbeat every 0.5 s
    node = net.node(cluster)
    worker = Worker([node.url], wait_s=1.0)
    release = threading.Event()

    @worker.handler("work")
    def work(task: Task) -> str:
        if task.payload == "first":
            release.wait(10)
        return task.payload

    first = cluster.add("work", "first")
    thread = net.run(worker)
    wait_until(lambda: first in cluster.leased, what="delivery")
    fence = cluster.leased[first]["fence"]
    cluster.revoke(first)
    # Well before the handler returns: the heartbeat, not the ack, found the loss.
    wait_until(lambda: worker.stats.lease_lost == 1, timeout_s=3, what="lease_lost")
    assert f"lease_lost run_id={first} fence={fence}" in caplog.text

    release.set()
    wait_until(lambda: cluster.bodies("ack", status=409), what="the rejected ack")
    cluster.add("work", "second")
    wait_until(lambda: worker.stats.acked == 1, what="the next task's ack")

    assert thread.is_alive()
    assert [b["result"] for b in cluster.bodies("ack")] == ["second"]
    assert worker.stats.lease_lost == 1  # the expected 409 on ack is not counted twice


def test_on_lease_lost_hears_a_lease_revoked_while_its_handler_runs_and_nothing_else(net):
    cluster = FakeCluster(lease_s=1.5)  # heartbeat every 0.5 s
    node = net.node(cluster)
    worker = Worker([node.url], wait_s=1.0)
    release = threading.Event()
    heard: list[tuple[str, int]] = []

    @worker.handler("work")
    def work(task: Task) -> str:
        if task.payload == "held":
            release.wait(10)
        return task.payload

    worker.on_lease_lost(lambda task: heard.append((task.run_id, task.fence)))
    worker.on_lease_lost(lambda task: 1 / 0)  # a failing hook spares the others
    net.run(worker)
    done = cluster.add("work", "quick")
    wait_until(lambda: worker.stats.acked == 1, what="the quick task's ack")
    held = cluster.add("work", "held")
    wait_until(lambda: held in cluster.leased, what="delivery")
    fence = cluster.leased[held]["fence"]
    cluster.revoke(held)
    wait_until(lambda: heard, timeout_s=3, what="the hook")
    release.set()
    wait_until(lambda: cluster.bodies("ack", status=409), what="the rejected ack")
    assert heard == [(held, fence)] and done not in [run_id for run_id, _ in heard]
    assert worker.stats.lease_lost == 1


def test_a_lease_not_renewed_in_time_is_lost_while_its_handler_runs(net, caplog):
    """Heartbeats that never come back (a node holding them) let the lease run out: the
    cluster may deliver the run again, so the hook hears it before the handler returns."""
    caplog.set_level(logging.INFO, logger=LOG)
    cluster = FakeCluster(lease_s=1.5)
    node = net.node(cluster)
    node.heartbeat_stall_s = 30.0
    worker = Worker([node.url], wait_s=1.0)
    release = threading.Event()
    heard: list[str] = []

    @worker.handler("work")
    def work(task: Task) -> None:
        release.wait(10)

    worker.on_lease_lost(lambda task: (heard.append(task.run_id), release.set()))
    run_id = cluster.add("work")
    net.run(worker)
    wait_until(lambda: heard, timeout_s=5, what="the hook")
    assert heard == [run_id] and worker.stats.lease_lost == 1
    assert f"lease_lost run_id={run_id}" in caplog.text
    node.heartbeat_stall_s = 0.0


def test_stale_fence_on_ack_counts_as_lease_lost(net, caplog):
    caplog.set_level(logging.INFO, logger=LOG)
    cluster = FakeCluster()
    node = net.node(cluster)
    worker = Worker([node.url], wait_s=1.0, heartbeat_interval_s=30.0)  # too rare to find it first
    released = threading.Event()

    @worker.handler("work")
    def work(task: Task) -> None:
        cluster.revoke(task.run_id)  # the run went to another worker meanwhile
        released.set()

    run_id = cluster.add("work")
    net.run(worker)
    wait_until(lambda: worker.stats.lease_lost == 1, what="lease_lost from the ack")

    assert released.is_set() and not cluster.bodies("heartbeat_batch")
    assert [b["run_id"] for b in cluster.bodies("ack", status=409)] == [run_id]
    assert worker.stats.acked == 0
    assert f"lease_lost run_id={run_id}" in caplog.text


def test_stop_drains_running_handler_then_returns(net):
    cluster = FakeCluster()
    node = net.node(cluster)
    worker = Worker([node.url], concurrency=2, wait_s=5.0)
    started, release = threading.Event(), threading.Event()

    @worker.handler("work")
    async def work(task: Task) -> str:
        started.set()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 5)
        return "drained"

    cluster.add("work")
    thread = net.run(worker)
    wait_until(started.is_set, what="handler start")
    wait_until(lambda: cluster.active_polls == 1, what="the free slot's long-poll")
    worker.stop()
    wait_until(lambda: cluster.active_polls == 0, what="polling to stop")
    late = cluster.add("work")
    thread.join(0.3)
    assert thread.is_alive(), "run() returned before its handler finished"

    release.set()
    thread.join(5)
    assert not thread.is_alive()
    assert [b["result"] for b in cluster.bodies("ack")] == ["drained"]
    assert [t["run_id"] for t in cluster.queued] == [late]


WORKER_SCRIPT = """
import sys, time
from schedulerd.sdk.worker import Worker
worker = Worker([sys.argv[1]], wait_s=1.0)

@worker.handler("work")
def work(task):
    print("started", flush=True)
    time.sleep(float(task.payload))  # still running when the signal arrives
    return "finished"

worker.run()
"""


def test_sigterm_in_the_main_thread_drains_and_exits(net):
    cluster = FakeCluster()
    node = net.node(cluster)
    run_id = cluster.add("work", 0.5)
    proc = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, node.url], cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "started\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(5) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.kill()
        proc.wait()
    assert [(b["run_id"], b["result"]) for b in cluster.bodies("ack")] == [(run_id, "finished")]


def test_task_for_a_queue_without_handler_is_nacked(net):
    cluster = FakeCluster()
    cluster.any_queue = True
    node = net.node(cluster)
    worker = Worker([node.url], worker_id="w9", wait_s=1.0)
    worker.handler("emails")(lambda task: None)

    run_id = cluster.add("nobody")
    net.run(worker)
    wait_until(lambda: worker.stats.nacked == 1, what="nack")

    [nack] = cluster.bodies("nack")
    assert nack["run_id"] == run_id
    assert nack["error"] == "NoHandler: worker w9 has no handler for queue 'nobody'"


@pytest.mark.parametrize("kwargs", [
    {"servers": []}, {"servers": "http://x"}, {"concurrency": 0},
    {"wait_s": -1}, {"heartbeat_interval_s": 0},
])
def test_bad_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        Worker(**{"servers": ["http://127.0.0.1:1"], **kwargs})


def test_a_queue_takes_one_handler():
    worker = Worker(["http://127.0.0.1:1"])
    worker.handler("q")(lambda task: None)
    with pytest.raises(ValueError, match="already has a handler"):
        worker.handler("q")(lambda task: None)


def test_a_task_delivered_after_its_lease_expired_is_not_run(net):
    cluster = FakeCluster(lease_s=-1.0)  # every lease has run out by the time it arrives
    node = net.node(cluster)
    worker = Worker([node.url], worker_id="w1", wait_s=1.0)
    ran: list[Task] = []

    @worker.handler("emails")
    def send(task: Task) -> None:
        ran.append(task)

    cluster.add("emails", {"to": "late@example.com"})
    net.run(worker)
    wait_until(lambda: worker.stats.lease_lost >= 1, what="the expired delivery to be dropped")
    assert ran == [] and cluster.bodies("ack") == []
