"""Worker SDK: long-poll every server for due tasks, run them under a
heartbeated lease, ack or nack. At-least-once: a task whose ack is lost comes
back after its lease, so handlers dedupe on `Task.idempotency_key`."""
from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import secrets
import signal
import socket
import ssl
import threading
import traceback
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated, Any, Awaitable, Callable, Iterator, Sequence
from urllib.parse import quote

import aiohttp
import msgspec
import uvloop

from schedulerd.errors import (Conflict, InvalidRequest, LimitExceeded, SchedulerError, StaleFence, TooLarge,
                               Unavailable)
from schedulerd.sdk import tracing, wire
from schedulerd.sdk.acks import ACK_BATCH_MAX, AckBatcher
from schedulerd.sdk.isolation import (BUSY_ERROR, ISOLATIONS, KILL_GRACE_S, LEASE_LOST, MAX_TASKS_PER_CHILD, STOPPING,
                                      ProcessPool, handler_ref)

log = logging.getLogger("schedulerd.worker")

# The server's default lease_batch_max: most tasks one poll asks for. A server
# configured lower answers limit_exceeded, and the poll size for it is halved.
LEASE_BATCH_MAX = wire.SERVER_LIMITS.lease_batch_max
ERROR_BYTES_MAX = wire.SERVER_LIMITS.error_chars_max  # nack error text, head line plus innermost frames
_ERROR_HEAD_BYTES_MAX = 1024  # so a huge message cannot crowd out the traceback
_TRACEBACK_FRAMES_MAX = 8
HEARTBEAT_INTERVAL_S_MIN = 0.5
_REQUEST_TIMEOUT_S = 10.0  # ack/nack/heartbeat; a poll gets wait_s on top
_CONNECT_TIMEOUT_S = 3.0  # a black-holed node must not pin a poll loop's slots
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Failures that say "this node, right now" rather than "this request": retry elsewhere.
_TRANSIENT = (aiohttp.ClientError, asyncio.TimeoutError, Unavailable)
# msgspec reads and writes the JSON of polls and acks (hundreds of tasks each) ~2x
# faster than json; the SDK spent a fifth of its CPU there in a spike (bench/micro/sdk_cost.py).
_JSON_ENCODER = msgspec.json.Encoder()
_JSON_BODY = {"Content-Type": "application/json"}

Handler = Callable[["Task"], Any]
_ZonedTime = Annotated[datetime, msgspec.Meta(tz=True)]  # the servers write UTC with a Z
# Told of each run this worker settled: the task and "acked" or "nacked".
Settled = Callable[["Task", str], None]
# Told of each task whose lease was lost while its handler still ran.
LeaseLost = Callable[["Task"], None]


@dataclass(frozen=True)
class Task:
    """One delivery of a run. `fence` identifies this lease; `idempotency_key`
    (`job_id:scheduled_time`) is the same on every redelivery of the occurrence."""

    run_id: str
    job_id: str
    queue: str
    scheduled_time: _ZonedTime
    attempt: int
    fence: int
    idempotency_key: str
    lease_until: _ZonedTime
    payload: Any
    target: dict[str, Any] | None = None  # a job's built-in executor target (schedulerd/targets.py)
    timeout_s: float | None = None  # the job's per-attempt timeout, if it has one
    # The W3C trace context the job was created in (servers before it, and jobs without one: None);
    # with OpenTelemetry configured, the handler's span links to it (schedulerd/sdk/tracing.py).
    traceparent: str | None = None
    tracestate: str | None = None


class _PollAnswer(msgspec.Struct):
    tasks: list[Task]
    now: _ZonedTime | None = None  # the cluster's time lease_until is on (servers before it: none)


# A poll's answer, read straight into Tasks (times with their zone required): 2.4 µs
# a task against 8.2 for a dict and then the Task built from it.
_POLL_ANSWER = msgspec.json.Decoder(_PollAnswer)


@dataclass
class WorkerStats:
    polled: int = 0  # tasks received from polls
    acked: int = 0  # acks a server accepted
    nacked: int = 0  # nacks a server accepted
    lease_lost: int = 0  # runs whose lease went stale while we held it
    poll_errors: int = 0  # failed poll requests, any server


@dataclass
class _Lease:
    task: Task
    server: str  # the node that delivered it: first choice for heartbeat, ack, nack
    interval_s: float
    next_due: float  # loop.time() of the next heartbeat
    deadline: float  # loop.time() when the lease runs out, from the latest lease_until
    lost: bool = False


class _Slots:
    """The worker's task slots. A poll takes at once as many free slots as it may fill;
    each task gives its one back when its handler returns. A count and an event rather
    than an asyncio.Semaphore taken and given one slot at a time: 9.6% fewer instructions
    per task."""

    def __init__(self, count: int) -> None:
        self.free = count
        self._freed = asyncio.Event()

    async def take(self, most: int) -> int:
        """Wait for a free slot, then take up to `most` of those free: the tasks a poll
        returns start at once, none waits locally on its lease."""
        while not self.free:
            self._freed.clear()
            await self._freed.wait()
        taken = min(most, self.free)
        self.free -= taken
        return taken

    def give(self, count: int = 1) -> None:
        self.free += count
        self._freed.set()


class Worker:
    def __init__(self, servers: Sequence[str], worker_id: str | None = None, concurrency: int = 4,
                 wait_s: float = 20.0, heartbeat_interval_s: float | None = None,
                 token: str | None = None, ca_file: str | None = None, namespace: str | None = None,
                 isolation: str = "thread", kill_grace_s: float = KILL_GRACE_S,
                 max_tasks_per_child: int = MAX_TASKS_PER_CHILD, child_memory_limit_bytes: int | None = None) -> None:
        """`isolation` is every handler's default (`handler(queue, isolation=...)` overrides it):
        "thread" runs a sync handler in the thread pool and an async one on the loop; "process"
        runs it in a child process (schedulerd/sdk/isolation.py), killed at the task's timeout_s,
        when its lease is lost and at stop(): SIGTERM, then SIGKILL `kill_grace_s` later.
        A child runs `max_tasks_per_child` tasks, then a new one takes its place;
        `child_memory_limit_bytes` caps each child's address space (RLIMIT_AS)."""
        if isinstance(servers, str) or not servers:
            raise ValueError("servers: give a non-empty list of base URLs")
        if concurrency < 1:
            raise ValueError(f"concurrency: must be >= 1, got {concurrency}")
        if wait_s < 0:
            raise ValueError(f"wait_s: must be >= 0, got {wait_s}")
        if heartbeat_interval_s is not None and heartbeat_interval_s <= 0:
            raise ValueError(f"heartbeat_interval_s: must be > 0, got {heartbeat_interval_s}")
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation: one of {', '.join(ISOLATIONS)}, got {isolation!r}")
        if kill_grace_s < 0:
            raise ValueError(f"kill_grace_s: must be >= 0, got {kill_grace_s}")
        if max_tasks_per_child < 1:
            raise ValueError(f"max_tasks_per_child: must be >= 1, got {max_tasks_per_child}")
        if child_memory_limit_bytes is not None and child_memory_limit_bytes <= 0:
            raise ValueError(f"child_memory_limit_bytes: must be > 0, got {child_memory_limit_bytes}")
        self.servers = [s.rstrip("/") for s in servers]
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.concurrency = concurrency
        self.wait_s = wait_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.stats = WorkerStats()
        self._token = token
        self._ca_file = ca_file  # https servers: verify against these CAs instead of the system's
        self._namespace = namespace  # the queues' namespace (X-Namespace), default: "default"
        self._handlers: dict[str, Handler] = {}
        self._async_queues: set[str] = set()  # queues whose handler is a coroutine function
        self._isolation = isolation
        self._kill_grace_s = kill_grace_s
        self._max_tasks_per_child = max_tasks_per_child
        self._child_memory_limit_bytes = child_memory_limit_bytes
        self._process_refs: dict[str, str] = {}  # queue -> module:qualname, for handlers in a child process
        self._pool: ProcessPool | None = None  # made in run_async when a handler runs in a child
        # Split the slots between the servers so one idle node's long-poll cannot hold
        # them all while another node has work; a loop whose poll returns re-reserves.
        share = max(1, min(LEASE_BATCH_MAX, concurrency // len(self.servers)))
        self._poll_max = {server: share for server in self.servers}
        self._pollers: dict[str, asyncio.Task[None]] = {}
        self._crashed: asyncio.Future[None] | None = None
        self._server_ahead_s: dict[str, float] = {}  # per server: its time minus ours, last seen
        self._lock = threading.Lock()  # guards _loop/_stop_requested against stop() from threads
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = False
        self._started = False
        self._leases: dict[str, _Lease] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._acks = AckBatcher(self._post_any, self.worker_id)
        self._cleanups: list[Callable[[], Awaitable[None]]] = []
        self._settled_hooks: list[Settled] = []
        self._lost_hooks: list[LeaseLost] = []

    def handler(self, queue: str, isolation: str | None = None) -> Callable[[Handler], Handler]:
        """Register the function that runs tasks of `queue` (sync or async). `isolation`
        ("thread" or "process", default: the Worker's) says where it runs; a process handler
        must be a function at the top level of a module the child process can import."""
        isolation = isolation or self._isolation
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation: one of {', '.join(ISOLATIONS)}, got {isolation!r}")

        def register(fn: Handler) -> Handler:
            if queue in self._handlers:
                raise ValueError(f"queue {queue!r} already has a handler")
            if isolation == "process":
                self._process_refs[queue] = handler_ref(fn)  # raises before anything is registered
            self._handlers[queue] = fn
            if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__")):
                self._async_queues.add(queue)  # decided once, not per task (bench.micro.sdk_cost)
            return fn

        return register

    def on_stopped(self, cleanup: Callable[[], Awaitable[None]]) -> None:
        """Await `cleanup` in the worker's loop once every handler has returned (close a client, say)."""
        self._cleanups.append(cleanup)

    def on_settled(self, hook: Settled) -> None:
        """Call `hook(task, "acked" | "nacked")` in the worker's loop each time a server
        accepts this worker's ack or nack: for counters and timings without parsing logs.
        It must return quickly; an exception from it is logged and does not undo the ack."""
        self._settled_hooks.append(hook)

    def on_lease_lost(self, hook: LeaseLost) -> None:
        """Call `hook(task)` in the worker's loop when the lease of a task whose handler still
        runs is lost: a heartbeat was answered stale_fence, the run was delivered again, or
        the lease ran out unrenewed (heartbeats failing), after which the cluster may hand
        the run to another worker. The SDK cannot stop a sync handler's thread (it kills a
        process handler's child); the hook is where to stop its work (`schedctl worker`
        stops its command). It must return quickly; an exception from it is logged."""
        self._lost_hooks.append(hook)

    def run(self) -> None:
        """Block until stop() (or SIGINT/SIGTERM in the main thread) and the drain end."""
        if threading.current_thread() is threading.main_thread():
            uvloop.run(self._run_with_signals())
        else:
            uvloop.run(self.run_async())

    def stop(self) -> None:
        """Stop polling; running handlers finish and are acked, then run() returns (a process
        handler has kill_grace_s to finish, then is killed and nacked "killed: worker stopping").
        Safe from any thread and from handlers; does not wait for the drain."""
        with self._lock:
            self._stop_requested = True
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._stop_event.set)

    async def run_async(self) -> None:
        if not self._handlers:
            raise RuntimeError("register a handler before running the worker")
        if self._started:
            raise RuntimeError("a Worker runs once; create a new one")
        self._started = True
        self._stop_event = asyncio.Event()
        self._leases_changed = asyncio.Event()
        self._slots = _Slots(self.concurrency)
        self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="schedulerd-task")
        if self._process_refs:
            self._pool = ProcessPool(self.concurrency, self._max_tasks_per_child, self._kill_grace_s,
                                     self._child_memory_limit_bytes)
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        if self._namespace:
            headers["X-Namespace"] = self._namespace
        tls = ssl.create_default_context(cafile=self._ca_file)
        self._session = aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(ssl=tls))
        with self._lock:
            self._loop = asyncio.get_running_loop()
            if self._stop_requested:
                self._stop_event.set()
        log.info("worker_started worker_id=%s servers=%s queues=%s concurrency=%d",
                 self.worker_id, ",".join(self.servers), ",".join(self._handlers), self.concurrency)
        stop_wait = asyncio.create_task(self._stop_event.wait())
        heartbeat = asyncio.create_task(self._heartbeat_loop())
        self._crashed = asyncio.get_running_loop().create_future()
        for server in self.servers:
            self._start_poller(server)
        members = asyncio.create_task(self._follow_members())
        try:
            done, _ = await asyncio.wait([stop_wait, heartbeat, members, self._crashed],
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            members.cancel()
            await asyncio.gather(members, return_exceptions=True)
            await self._shutdown(stop_wait, heartbeat, list(self._pollers.values()))
        for finished in done:
            finished.result()  # the loops never return: one that did crashed, so re-raise

    async def _run_with_signals(self) -> None:
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            # A second signal gets the default behaviour: the way out of a hung handler.
            for sig in _SIGNALS:
                loop.remove_signal_handler(sig)
            self.stop()

        for sig in _SIGNALS:
            loop.add_signal_handler(sig, on_signal)
        try:
            await self.run_async()
        finally:
            for sig in _SIGNALS:
                loop.remove_signal_handler(sig)

    async def _shutdown(self, stop_wait: asyncio.Task, heartbeat: asyncio.Task,
                        pollers: list[asyncio.Task]) -> None:
        log.info("worker_stopping worker_id=%s running=%d", self.worker_id, len(self._running))
        # Cancelling an in-flight poll may strand tasks the server just leased; they
        # come back when that lease expires, which beats waiting out a long-poll.
        for t in (stop_wait, *pollers):
            t.cancel()
        await asyncio.gather(stop_wait, *pollers, return_exceptions=True)
        if self._pool is not None and self._pool.busy:
            # Children get the grace to finish (and be acked), then are killed and nacked.
            await asyncio.wait(list(self._running), timeout=self._kill_grace_s)
            self._pool.stop_all(STOPPING)
        while self._running:  # heartbeats keep running until every ack is settled
            await asyncio.gather(*self._running, return_exceptions=True)
        heartbeat.cancel()
        await asyncio.gather(heartbeat, return_exceptions=True)
        await self._session.close()
        self._executor.shutdown(wait=False)  # every handler has returned by now
        if self._pool is not None:
            await self._pool.close()
        for cleanup in self._cleanups:
            await cleanup()
        with self._lock:
            self._loop = None
        log.info("worker_stopped worker_id=%s stats=%s", self.worker_id, self.stats)

    async def _follow_members(self) -> None:
        """Poll every node that serves: the cluster's nodes, read from `/v1/cluster` every
        wire.MEMBERS_EVERY_S, replace the servers given (a node holds only some groups, and a poll
        leases from the groups where it lands). A cluster that cannot say keeps the list."""
        while True:
            await asyncio.sleep(wire.MEMBERS_EVERY_S)
            found = await self._members()
            if found and set(found) != set(self.servers):
                self._set_servers(found)

    async def _members(self) -> list[str]:
        for server in list(self.servers):
            try:
                async with self._session.get(server + "/v1/cluster",
                                             timeout=aiohttp.ClientTimeout(total=_REQUEST_TIMEOUT_S)) as resp:
                    if resp.status != 200:
                        continue
                    body = msgspec.json.decode(await resp.read())
            except (*_TRANSIENT, ValueError):
                continue
            serving = wire.serving_urls(body, server.split("://", 1)[0])
            if serving is not None:
                return serving
        return []

    def _set_servers(self, servers: list[str]) -> None:
        log.info("servers_changed worker_id=%s servers=%s", self.worker_id, ",".join(servers))
        for gone in set(self.servers) - set(servers):
            self._pollers.pop(gone).cancel()  # a lease it holds is still acked through the others
        self.servers = servers
        share = max(1, min(LEASE_BATCH_MAX, self.concurrency // len(servers)))
        self._poll_max = {server: share for server in servers}
        for server in servers:
            if server not in self._pollers:
                self._start_poller(server)

    def _start_poller(self, server: str) -> None:
        """A poll loop never returns: one that did crashed, and the worker stops with its error."""
        crashed = self._crashed
        assert crashed is not None, "pollers start in run_async"

        def ended(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and not crashed.done():
                crashed.set_exception(task.exception() or RuntimeError(f"poll loop of {server} returned"))

        task = asyncio.create_task(self._poll_loop(server))
        task.add_done_callback(ended)
        self._pollers[server] = task

    async def _poll_loop(self, server: str) -> None:
        backoff = wire.backoff_s()
        while True:
            held = await self._slots.take(self._poll_max[server])
            try:
                tasks = await self._poll(server, held)
            except LimitExceeded as exc:
                self._slots.give(held)
                if held > 1 and "lease_batch_max" in exc.message:
                    self._poll_max[server] = held // 2
                    log.warning("poll_size_lowered server=%s max_tasks=%d error=%s",
                                server, held // 2, _describe(exc))
                    continue
                log.error("poll_failed server=%s error=%s", server, _describe(exc))
                self.stats.poll_errors += 1  # logged before counted, as in _lose
                await asyncio.sleep(next(backoff))
                continue
            except (*_TRANSIENT, SchedulerError) as exc:
                self._slots.give(held)
                # A 4xx means this SDK and the server disagree on the contract: a bug, not weather.
                level = logging.WARNING if isinstance(exc, _TRANSIENT) else logging.ERROR
                log.log(level, "poll_failed server=%s error=%s", server, _describe(exc))
                self.stats.poll_errors += 1
                await asyncio.sleep(next(backoff))
                continue
            except asyncio.CancelledError:
                self._slots.give(held)
                raise
            backoff = wire.backoff_s()
            self._slots.give(held - self._start_tasks(server, tasks, held))

    async def _poll(self, server: str, max_tasks: int) -> list[Task]:
        body = {"worker_id": self.worker_id, "queues": list(self._handlers),
                "max_tasks": max_tasks, "wait_s": self.wait_s}
        answer = await self._request(server, "/v1/tasks/poll", body,
                                     timeout_s=self.wait_s + _REQUEST_TIMEOUT_S, answer=_POLL_ANSWER)
        self.stats.polled += len(answer.tasks)
        self._note_server_time(server, answer.now)
        return answer.tasks

    def _note_server_time(self, server: str, now: datetime | None) -> None:
        """How far the server's time is ahead of ours: leases are measured on its clock, so
        a worker whose clock is off by a lease or more neither drops every task as expired
        on arrival nor heartbeats after its lease has ended. The answer's time in transit
        counts as skew, which only makes a lease look shorter by it."""
        if now is not None:
            self._server_ahead_s[server] = (now - datetime.now(timezone.utc)).total_seconds()

    def _lease_left_s(self, server: str, lease_until: datetime, now_wall: datetime) -> float:
        """Seconds left at `now_wall` (our clock, read once per answer) on a lease measured
        on `server`'s clock."""
        return (lease_until - now_wall).total_seconds() - self._server_ahead_s.get(server, 0.0)

    def _start_tasks(self, server: str, tasks: list[Task], held: int) -> int:
        """Spawn a runner per task, each owning one held slot; returns slots used."""
        if len(tasks) > held:  # breaks the contract; the extras return when their lease expires
            log.error("poll_overflow server=%s tasks=%d max_tasks=%d", server, len(tasks), held)
        loop = asyncio.get_running_loop()
        # Each lease's time left is read as the answer arrived, with one clock read for all
        # of its tasks rather than one per task as each runner starts.
        now, now_wall = loop.time(), datetime.now(timezone.utc)
        for task in tasks[:held]:
            left_s = self._lease_left_s(server, task.lease_until, now_wall)
            runner = loop.create_task(self._run_task(server, task, now, left_s))
            self._running.add(runner)
            runner.add_done_callback(self._runner_done)
        return min(len(tasks), held)

    def _runner_done(self, runner: asyncio.Task[None]) -> None:
        _forget(runner, self._running, "task_crashed")

    def _new_lease(self, server: str, task: Task, now: float, left_s: float) -> _Lease:
        interval_s = self.heartbeat_interval_s or max(HEARTBEAT_INTERVAL_S_MIN, left_s / 3)
        return _Lease(task, server, interval_s, now + interval_s, now + left_s)

    async def _run_task(self, server: str, task: Task, now: float, left_s: float) -> None:
        """Run one task in the slot its poll reserved. The slot is given back when the
        handler returns, not when its ack is settled: `concurrency` bounds handlers
        running at once, and an ack waiting on its commit runs nothing (held, it made
        the worker's throughput follow the server's commit latency). `left_s` is the
        lease's time left at `now`, the loop's time when the poll's answer arrived."""
        try:
            if left_s <= 0:
                # Delivered after its lease ran out (the answer was held up in the
                # network): the run is someone else's by now, so running it would
                # only be a needless duplicate.
                log.warning("task_expired_on_arrival run_id=%s fence=%d", task.run_id, task.fence)
                self.stats.lease_lost += 1
                return
            lease = self._new_lease(server, task, now, left_s)
            verb, value = await self._attempt(lease, now)
        finally:
            self._slots.give()
        await self._finish(lease, verb, value)

    async def _attempt(self, lease: _Lease, started: float) -> tuple[str, Any]:
        """Run one attempt under its lease, never beside an earlier attempt of its run."""
        task = lease.task
        older = self._leases.get(task.run_id)
        if older is not None:  # redelivered to us while we still run it: the old fence is dead
            self._lose(older)
            if older.task.queue not in self._process_refs:
                # A thread cannot be stopped: this attempt would overlap the earlier one, and
                # each redelivery of a stuck run would take one more slot. Back to the cluster,
                # which retries it after its backoff, maybe elsewhere.
                log.warning("task_busy run_id=%s fence=%d held_fence=%d",
                            task.run_id, task.fence, older.task.fence)
                return "nack", BUSY_ERROR
        self._leases[task.run_id] = lease
        self._leases_changed.set()
        try:
            if older is not None and self._pool is not None:
                await self._pool.stop_run(task.run_id, LEASE_LOST)  # its child ends before this one starts
            log.info("task_started run_id=%s queue=%s attempt=%d fence=%d",
                     task.run_id, task.queue, task.attempt, task.fence)
            return await self._call(task, started)
        finally:
            if self._leases.get(task.run_id) is lease:
                del self._leases[task.run_id]

    async def _call(self, task: Task, started: float) -> tuple[str, Any]:
        """Run the handler; ("ack", result) or ("nack", error text). `started` is the loop's
        time the task arrived: a process handler is killed task.timeout_s after it."""
        handler = self._handlers.get(task.queue)
        if handler is None:
            return "nack", (f"NoHandler: worker {self.worker_id} has no handler for "
                            f"queue {task.queue!r}")
        ref = self._process_refs.get(task.queue)
        if ref is not None:
            assert self._pool is not None, "made in run_async for process handlers"
            loop = asyncio.get_running_loop()
            wait_s = None if task.timeout_s is None else max(0.0, started + task.timeout_s - loop.time())
            # The span is the parent's, around the child's run: the child gets the traceparent in its task.
            with tracing.handler_span(task) as span:
                verb, value = await self._pool.run(ref, task, wait_s)
                if verb == "nack":
                    tracing.failed(span, value)
            return verb, value
        try:
            if task.queue in self._async_queues:
                with tracing.handler_span(task):
                    result = await handler(task)
            else:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(self._executor, _in_span, handler, task)
            if result is not None:
                # A JSON value (json refuses a set, which the ack's encoder would send as a
                # list) that the ack's encoder can carry (it refuses a dict keyed by None,
                # which json writes as "null"): else this task fails as a nack, rather than
                # every ack of the batch it would join.
                json.dumps(result)
                _encode(result)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # sys.exit() in a handler fails its task, not the worker
            return "nack", _error_text(exc)
        return "ack", result

    async def _finish(self, lease: _Lease, verb: str, value: Any) -> None:
        task = lease.task
        if verb == "ack":
            def send() -> Awaitable[Any]:
                return self._acks.ack(lease.server, task.run_id, task.fence, value)
        else:
            path = f"/v1/tasks/{quote(task.run_id, safe='')}/nack"
            body = {"worker_id": self.worker_id, "fence": task.fence, "error": value}

            def send() -> Awaitable[Any]:
                return self._post_any(lease.server, path, body)
        try:
            settled = await self._settle(lease, verb, send)
        except Conflict as exc:
            # Expected after a heartbeat found the lease lost; otherwise news worth a warning.
            expected = isinstance(exc, StaleFence) and lease.lost
            log.log(logging.INFO if expected else logging.WARNING,
                    "task_%s_rejected run_id=%s fence=%d error=%s",
                    verb, task.run_id, task.fence, _describe(exc))
            if isinstance(exc, StaleFence):
                self._lose(lease)
            return
        except SchedulerError as exc:
            if verb == "ack" and isinstance(exc, (InvalidRequest, TooLarge)):
                # The result itself was refused (say, over result_bytes_max): nack, so the run
                # retries and dead-letters with the reason instead of timing out in silence.
                await self._finish(lease, "nack", _clip(f"ResultRejected: {exc.message}", ERROR_BYTES_MAX))
                return
            log.error("task_%s_failed run_id=%s error=%s", verb, task.run_id, _describe(exc))
            return
        if not settled:
            return
        if verb == "ack":
            self.stats.acked += 1
            log.info("task_acked run_id=%s fence=%d", task.run_id, task.fence)
        else:
            self.stats.nacked += 1
            log.info("task_nacked run_id=%s fence=%d error=%s",
                     task.run_id, task.fence, str(value).splitlines()[0])
        for hook in self._settled_hooks:
            try:
                hook(task, f"{verb}ed")
            except Exception:
                log.exception("settled_hook_failed run_id=%s", task.run_id)

    async def _settle(self, lease: _Lease, verb: str, send: Callable[[], Awaitable[Any]]) -> bool:
        """Send to the delivering node, failing over to the others, until the lease
        would have expired (after that the run is redelivered and our fence is stale)."""
        backoff: Iterator[float] | None = None  # made on the first failure: most sends land at once
        while True:
            try:
                await send()
                return True
            except _TRANSIENT as exc:
                if asyncio.get_running_loop().time() >= lease.deadline:
                    log.error("task_settle_abandoned run_id=%s verb=%s error=%s",
                              lease.task.run_id, verb, _describe(exc))
                    return False
            backoff = backoff or wire.backoff_s()
            await asyncio.sleep(next(backoff))

    def _lose(self, lease: _Lease) -> None:
        if lease.lost:
            return
        lease.lost = True
        # Logged before counted: whoever waits on the count finds the line written.
        log.warning("lease_lost run_id=%s fence=%d", lease.task.run_id, lease.task.fence)
        self.stats.lease_lost += 1
        if self._leases.get(lease.task.run_id) is not lease:
            return  # its handler has returned: nothing left to stop
        if self._pool is not None:
            self._pool.stop(lease.task.run_id, lease.task.fence, LEASE_LOST)
        for hook in self._lost_hooks:
            try:
                hook(lease.task)
            except Exception:
                log.exception("lease_lost_hook_failed run_id=%s", lease.task.run_id)

    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        # Each server's heartbeats go out on their own: a node that holds a request until
        # it times out must not hold up the next round for the leases of the others.
        beats: set[asyncio.Task[None]] = set()
        try:
            await self._beat_rounds(loop, beats)
        finally:
            for beat in beats:
                beat.cancel()
            await asyncio.gather(*beats, return_exceptions=True)

    async def _beat_rounds(self, loop: asyncio.AbstractEventLoop, beats: set[asyncio.Task[None]]) -> None:
        while True:
            now = loop.time()
            live = []
            for lease in list(self._leases.values()):
                if not lease.lost and lease.deadline <= now:
                    self._lose(lease)  # not renewed in time: the cluster may deliver the run again
                if not lease.lost:
                    live.append(lease)
            wake_at = min((min(lease.next_due, lease.deadline) for lease in live), default=None)
            if wake_at is None or wake_at > now:
                self._leases_changed.clear()
                timeout = None if wake_at is None else wake_at - now
                try:
                    await asyncio.wait_for(self._leases_changed.wait(), timeout)
                except asyncio.TimeoutError:
                    pass  # the earliest heartbeat is due
                continue
            # Take along leases due within half their interval: one request per
            # server per round rather than one per lease.
            due = [lease for lease in live if lease.next_due - lease.interval_s / 2 <= now]
            by_server: dict[str, list[_Lease]] = defaultdict(list)
            for lease in due:
                lease.next_due = now + lease.interval_s  # before sending: a failure must not spin
                by_server[lease.server].append(lease)
            for server, leases in by_server.items():
                beat = loop.create_task(self._heartbeat(server, leases))
                beats.add(beat)
                beat.add_done_callback(lambda done: _forget(done, beats, "heartbeat_crashed"))

    async def _heartbeat(self, server: str, leases: list[_Lease]) -> None:
        """Extend the leases through `server`, in requests the server's ack_batch_max allows."""
        await asyncio.gather(*(self._heartbeat_batch(server, leases[lo:lo + ACK_BATCH_MAX])
                               for lo in range(0, len(leases), ACK_BATCH_MAX)))

    async def _heartbeat_batch(self, server: str, leases: list[_Lease]) -> None:
        body = {"worker_id": self.worker_id,
                "leases": [{"run_id": l.task.run_id, "fence": l.task.fence} for l in leases]}
        try:
            data = await self._post_any(server, "/v1/tasks/heartbeat", body)
        except (*_TRANSIENT, SchedulerError) as exc:
            # The next round retries; the ack finds out whether the lease survived.
            log.warning("heartbeat_failed server=%s leases=%d error=%s",
                        server, len(leases), _describe(exc))
            return
        self._apply_heartbeat_results(server, leases, data)

    def _apply_heartbeat_results(self, server: str, leases: list[_Lease], data: dict[str, Any]) -> None:
        try:
            self._note_server_time(server, _parse_time(data["now"]) if isinstance(data.get("now"), str) else None)
        except ValueError:
            log.warning("heartbeat_time_unreadable server=%s now=%r", server, data.get("now"))
        by_run = {lease.task.run_id: lease for lease in leases}
        now, now_wall = asyncio.get_running_loop().time(), datetime.now(timezone.utc)
        for item in data.get("results") or []:
            lease = by_run.get(item.get("run_id"))
            if lease is None:
                continue
            if item.get("ok"):
                lease.deadline = now + self._lease_left_s(server, _parse_time(item["lease_until"]), now_wall)
            elif (item.get("error") or {}).get("code") == StaleFence.code:
                self._lose(lease)
            else:
                log.warning("heartbeat_rejected run_id=%s error=%s",
                            lease.task.run_id, item.get("error"))

    async def _post_any(self, first: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to `first`, then to the other nodes while the failure is the node's
        (down, leaderless, 5xx) rather than the request's."""
        for server in [first, *(s for s in self.servers if s != first)]:
            try:
                return await self._request(server, path, body)
            except _TRANSIENT as exc:
                error = exc
        raise error

    async def _request(self, server: str, path: str, body: dict[str, Any],
                       timeout_s: float = _REQUEST_TIMEOUT_S, answer: msgspec.json.Decoder | None = None) -> Any:
        """POST JSON; the reply's dict (or, given `answer`, what that decoder reads from it),
        or the typed error it carries (5xx -> Unavailable)."""
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=_CONNECT_TIMEOUT_S)
        async with self._session.post(server + path, data=_encode(body), headers=_JSON_BODY,
                                      timeout=timeout) as resp:
            raw = await resp.read()
            status = resp.status
        if answer is not None and status < 400:
            try:
                return answer.decode(raw)
            except msgspec.DecodeError as exc:
                raise SchedulerError(f"{server}{path}: malformed answer: {exc}") from exc
        if status < 400:
            try:
                data = msgspec.json.decode(raw) if raw else {}
            except ValueError:
                data = None
            if isinstance(data, dict):
                return data
            raise SchedulerError(f"{server}{path}: HTTP {status}: not a JSON object: {wire.short_text(raw)}")
        exc = wire.error_from(status, raw, f"{server}{path}")
        # A 5xx is this node's failure, not the request's: another node is tried.
        raise exc if 400 <= status < 500 or isinstance(exc, Unavailable) else Unavailable(exc.message)


def _forget(done: asyncio.Task[None], tracked: set[asyncio.Task[None]], event: str) -> None:
    """Drop a finished task from the set that kept it alive, logging what escaped it."""
    tracked.discard(done)
    if not done.cancelled() and done.exception() is not None:
        log.error(event, exc_info=done.exception())


def _in_span(handler: Handler, task: Task) -> Any:
    """A thread handler's call, inside its span (current in the executor's thread)."""
    with tracing.handler_span(task):
        return handler(task)


def _encode(body: dict[str, Any]) -> bytes:
    try:
        return _JSON_ENCODER.encode(body)
    except UnicodeEncodeError:
        # A lone surrogate (a result or error text built from os.fsdecode, say) has no
        # UTF-8 form; json writes it as a \u escape, which the server reads back as it was.
        return json.dumps(body).encode()


def _parse_time(text: str) -> datetime:
    when = datetime.fromisoformat(text)  # the servers write UTC with a Z, which 3.11 reads
    if when.tzinfo is None:
        raise ValueError(f"time {text!r} has no zone")
    return when


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _error_text(exc: BaseException) -> str:
    """`ExcType: message` plus the innermost frames, at most ERROR_BYTES_MAX bytes.
    Cuts are by bytes; errors="ignore" drops a character a cut split in two."""
    head = _clip(f"{type(exc).__name__}: {exc}", _ERROR_HEAD_BYTES_MAX)
    frames = "".join(traceback.format_tb(exc.__traceback__)[-_TRACEBACK_FRAMES_MAX:])
    if not frames:
        return head
    lead = f"{head}\nTraceback (innermost last):\n"
    budget = ERROR_BYTES_MAX - len(lead.encode())  # > 0: the head is capped well below
    return lead + frames.encode(errors="replace")[-budget:].decode(errors="ignore")


def _clip(text: str, bytes_max: int) -> str:
    # "replace": a lone surrogate (a file name from os.fsdecode, say) becomes "?" instead of failing the nack.
    return text.encode(errors="replace")[:bytes_max].decode(errors="ignore")
