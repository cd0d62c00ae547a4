"""Handlers in child processes (`isolation="process"`, schedulerd/sdk/isolation.py) against
the fake nodes of test_worker.py: the kill at the attempt timeout, on a lost lease and at
stop(), children that die or run out of memory, recycling, and one run never running
twice at once in one worker."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from schedulerd.sdk.isolation import BUSY_ERROR
from schedulerd.sdk.worker import Task, Worker
from tests.unit.test_worker import FakeCluster, Net
from tests.waiting import wait_until


@pytest.fixture
def net():
    net = Net()
    yield net
    net.close()


def work(task: Task) -> Any:
    """The process handler of these tests: what it does is in the payload."""
    p = task.payload
    if "log" in p:  # one line per attempt started: "attempt pid"
        with open(p["log"], "a") as log:
            log.write(f"{task.attempt} {os.getpid()}\n")
    if p.get("ignore_term_on_attempt") == task.attempt:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if p.get("sleep_on_attempt", task.attempt) == task.attempt and "sleep_s" in p:
        time.sleep(p["sleep_s"])
    if "exit" in p:
        os._exit(p["exit"])
    if "signal" in p:
        os.kill(os.getpid(), p["signal"])
    if "alloc_bytes" in p:
        return len(bytearray(p["alloc_bytes"]))
    if p.get("raise"):
        raise ValueError(p["raise"])
    if "log" in p and task.attempt > 1:  # were the earlier attempts' children gone when this one began?
        earlier = [int(line.split()[1]) for line in Path(p["log"]).read_text().splitlines()[:-1]]
        return {"earlier_alive": [pid for pid in earlier if alive(pid)]}
    return {"pid": os.getpid()}


def fast(task: Task) -> str:
    return "fast"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def add(cluster: FakeCluster, queue: str, payload: Any, timeout_s: float | None = None) -> str:
    run_id = cluster.add(queue, payload)
    with cluster.lock:
        next(t for t in cluster.queued if t["run_id"] == run_id)["timeout_s"] = timeout_s
    return run_id


def redeliver(cluster: FakeCluster, run_id: str) -> None:
    """What a lease that ran out does: the run is queued again, and its next lease has a new fence."""
    with cluster.lock:
        cluster.queued.append(cluster.leased.pop(run_id))


def settled(cluster: FakeCluster, kind: str, run_id: str, status: int = 200) -> dict[str, Any]:
    return wait_until(lambda: next((b for b in cluster.bodies(kind, status) if b["run_id"] == run_id), None),
                      what=f"the {kind} of {run_id}")


def started_pids(log: Path, count: int) -> list[int]:
    lines = wait_until(lambda: len(log.read_text().splitlines()) >= count and log.read_text().splitlines(),
                       what=f"{count} attempts started")
    return [int(line.split()[1]) for line in lines]


def test_a_process_handler_runs_in_a_child_and_is_acked_or_nacked(net):
    cluster = FakeCluster()
    node = net.node(cluster)
    worker = Worker([node.url], wait_s=1.0, isolation="process")
    worker.handler("work")(work)
    worker.handler("fast", isolation="thread")(fast)
    ok, bad, thread = add(cluster, "work", {}), add(cluster, "work", {"raise": "bad payload"}), add(cluster, "fast", {})
    net.run(worker)

    assert settled(cluster, "ack", ok)["result"]["pid"] != os.getpid()
    assert settled(cluster, "nack", bad)["error"].startswith("ValueError: bad payload\n")
    assert settled(cluster, "ack", thread)["result"] == "fast"


def test_a_handler_past_its_timeout_is_killed_and_its_slot_freed_at_once(net, tmp_path):
    cluster = FakeCluster()
    node = net.node(cluster)
    worker = Worker([node.url], concurrency=1, wait_s=1.0, kill_grace_s=3.0)
    worker.handler("slow", isolation="process")(work)
    worker.handler("fast")(fast)
    log = tmp_path / "attempts"
    net.run(worker)
    settled(cluster, "ack", add(cluster, "slow", {}))  # the child is up: its start is not in the timeout
    slow = add(cluster, "slow", {"log": str(log), "sleep_s": 30, "ignore_term_on_attempt": 1}, timeout_s=1)
    [pid] = started_pids(log, 1)
    began = time.monotonic()
    quick = add(cluster, "fast", {})

    nack = settled(cluster, "nack", slow)
    assert nack["error"] == "timeout: killed after timeout_s=1"
    assert settled(cluster, "ack", quick)["result"] == "fast"
    # The one slot came back at SIGTERM, while the child (ignoring it) still had its grace.
    assert time.monotonic() - began < 2.5 and alive(pid)
    wait_until(lambda: not alive(pid), timeout_s=5, what="the SIGKILL after the grace")


def test_a_lost_lease_kills_the_child(net, tmp_path):
    cluster = FakeCluster(lease_s=1.5)  # heartbeat every 0.5 s
    node = net.node(cluster)
    worker = Worker([node.url], wait_s=1.0, isolation="process")
    worker.handler("work")(work)
    heard: list[str] = []
    worker.on_lease_lost(lambda task: heard.append(task.run_id))
    log = tmp_path / "attempts"
    run_id = add(cluster, "work", {"log": str(log), "sleep_s": 30})
    net.run(worker)
    [pid] = started_pids(log, 1)
    cluster.revoke(run_id)  # a cancel of the run does this too

    wait_until(lambda: not alive(pid), timeout_s=3, what="the child's end")
    assert settled(cluster, "nack", run_id, status=409)["error"] == "killed: lease lost"  # refused: stale
    assert heard == [run_id] and worker.stats.lease_lost == 1


def test_stop_kills_a_stuck_child_after_the_grace_and_returns(net, tmp_path):
    cluster = FakeCluster()
    node = net.node(cluster)
    worker = Worker([node.url], wait_s=1.0, isolation="process", kill_grace_s=0.5)
    worker.handler("work")(work)
    log = tmp_path / "attempts"
    run_id = add(cluster, "work", {"log": str(log), "sleep_s": 30, "ignore_term_on_attempt": 1})
    thread = net.run(worker)
    [pid] = started_pids(log, 1)
    began = time.monotonic()
    worker.stop()
    thread.join(5)

    assert not thread.is_alive()
    assert time.monotonic() - began < 3.0  # the grace to finish, SIGTERM, the grace again, SIGKILL
    assert not alive(pid)
    assert settled(cluster, "nack", run_id)["error"] == "killed: worker stopping"


def test_a_child_that_dies_fails_its_task_and_the_worker_goes_on(net):
    cluster = FakeCluster()
    node = net.node(cluster)
    worker = Worker([node.url], concurrency=1, wait_s=1.0, isolation="process")
    worker.handler("work")(work)
    exits = add(cluster, "work", {"exit": 3})
    segv = add(cluster, "work", {"signal": signal.SIGSEGV})
    killed = add(cluster, "work", {"signal": signal.SIGKILL})
    after = add(cluster, "work", {})
    thread = net.run(worker)

    assert settled(cluster, "nack", exits)["error"] == "exited with status 3 before answering"
    assert settled(cluster, "nack", segv)["error"] == "exited with signal 11 (SIGSEGV)"
    error = settled(cluster, "nack", killed)["error"]
    assert error.startswith("exited with signal 9 (SIGKILL), not sent by the worker") and "out of memory" in error
    assert settled(cluster, "ack", after)["result"]["pid"] != os.getpid()
    assert thread.is_alive()


def test_a_memory_error_in_a_child_is_out_of_memory_and_the_child_is_replaced(net):
    cluster = FakeCluster()
    node = net.node(cluster)
    worker = Worker([node.url], concurrency=1, wait_s=1.0, isolation="process",
                    child_memory_limit_bytes=2 << 30)
    worker.handler("work")(work)
    first = add(cluster, "work", {})
    oom = add(cluster, "work", {"alloc_bytes": 4 << 30})
    then = add(cluster, "work", {})
    net.run(worker)

    pid = settled(cluster, "ack", first)["result"]["pid"]
    assert settled(cluster, "nack", oom)["error"].startswith("out of memory: MemoryError")
    assert settled(cluster, "ack", then)["result"]["pid"] != pid


def test_a_child_is_recycled_after_max_tasks_per_child(net):
    cluster = FakeCluster()
    node = net.node(cluster)
    worker = Worker([node.url], concurrency=1, wait_s=1.0, isolation="process", max_tasks_per_child=2)
    worker.handler("work")(work)
    runs = [add(cluster, "work", {}) for _ in range(3)]
    net.run(worker)

    a, b, c = (settled(cluster, "ack", run_id)["result"]["pid"] for run_id in runs)
    assert a == b != c


def test_a_run_redelivered_while_its_thread_still_runs_is_nacked_busy(net):
    cluster = FakeCluster()
    node = net.node(cluster)
    worker = Worker([node.url], concurrency=2, wait_s=1.0)
    release, calls = threading.Event(), []

    @worker.handler("work")
    def held(task: Task) -> str:
        calls.append(task.fence)
        release.wait(10)
        return "done"

    run_id = cluster.add("work")
    net.run(worker)
    wait_until(lambda: calls, what="the first attempt")
    redeliver(cluster, run_id)

    assert settled(cluster, "nack", run_id)["error"] == BUSY_ERROR
    assert len(calls) == 1 and worker.stats.lease_lost == 1  # the first attempt's fence is dead
    release.set()
    settled(cluster, "ack", run_id, status=409)  # the first attempt's ack: refused, stale
    assert len(calls) == 1


def test_a_run_redelivered_while_its_child_still_runs_kills_the_child_first(net, tmp_path):
    cluster = FakeCluster()
    node = net.node(cluster)
    worker = Worker([node.url], concurrency=2, wait_s=1.0, isolation="process", kill_grace_s=0.5)
    worker.handler("work")(work)
    log = tmp_path / "attempts"
    run_id = add(cluster, "work", {"log": str(log), "sleep_s": 30, "sleep_on_attempt": 1,
                                   "ignore_term_on_attempt": 1})
    net.run(worker)
    started_pids(log, 1)
    redeliver(cluster, run_id)

    # The second attempt began after the first one's child was gone (SIGTERM ignored: SIGKILL).
    assert settled(cluster, "ack", run_id)["result"] == {"earlier_alive": []}
    assert settled(cluster, "nack", run_id, status=409)["error"] == "killed: lease lost"
    assert worker.stats.lease_lost == 1


def not_top_level() -> Any:
    def inner(task: Task) -> None:
        return None
    return inner


@pytest.mark.parametrize("handler", [lambda task: None, not_top_level()])
def test_a_process_handler_a_child_cannot_import_is_refused(handler):
    worker = Worker(["http://127.0.0.1:1"])
    with pytest.raises(ValueError, match="top level of a module"):
        worker.handler("q", isolation="process")(handler)
    worker.handler("q")(handler)  # the queue is still free, and a thread runs it


@pytest.mark.parametrize("kwargs", [
    {"isolation": "fork"}, {"kill_grace_s": -1}, {"max_tasks_per_child": 0}, {"child_memory_limit_bytes": 0},
])
def test_bad_isolation_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        Worker(["http://127.0.0.1:1"], **kwargs)
    with pytest.raises(ValueError, match="isolation"):
        Worker(["http://127.0.0.1:1"]).handler("q", isolation="fork")
