"""Handlers in child processes (`isolation="process"`).

A bounded pool of long-lived children, each running one task at a time over a pipe, so
that a handler past its attempt timeout, whose lease is lost, or still running when the
worker stops can be stopped (SIGTERM, then SIGKILL `kill_grace_s` later), and a handler
that crashes or leaks takes down its child, not the worker. A child is replaced on the
next task after it was killed or crashed, and retired after `max_tasks_per_child` tasks.

Children start by forkserver (spawn where there is none), never by fork: the worker runs
threads and an event loop. Messages are JSON, not pickle: in `[handler_ref, task]`, out
`["ok", result]`, `["error", text]` or `["oom", text]` (a MemoryError; the child then exits)."""
from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import logging
import multiprocessing
import os
import signal
import sys
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, Callable

import msgspec

if TYPE_CHECKING:
    from schedulerd.sdk.worker import Task

log = logging.getLogger("schedulerd.worker")

ISOLATIONS = ("thread", "process")  # thread: sync handlers in the thread pool, async ones on the loop
KILL_GRACE_S = 5.0  # SIGTERM to SIGKILL; also how long stop() lets a running child finish first
MAX_TASKS_PER_CHILD = 1000
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
_CLOSE_S = 1.0  # an idle child whose pipe closed exits at once; after this it is killed
BUSY_ERROR = "busy: an earlier attempt of this run still runs in this worker"
LEASE_LOST = "killed: lease lost"
STOPPING = "killed: worker stopping"


def handler_ref(fn: Callable[..., Any]) -> str:
    """The `module:qualname` a child imports `fn` by; ValueError when it could not."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not inspect.isfunction(fn) or not module or "<" in qualname:
        raise ValueError(f"isolation='process' needs a function defined at the top level of a module, "
                         f"which the child process imports; {fn!r} is not one (a lambda, a closure or "
                         f"another callable object: move it to module level)")
    if module == "__main__" and not getattr(sys.modules["__main__"], "__file__", None):
        raise ValueError(f"isolation='process': {qualname} is defined in a __main__ without a file "
                         f"(python -c, a REPL), which a child process cannot import")
    try:
        found = _resolve(module, qualname)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"isolation='process': cannot import {module}:{qualname}: {exc}") from None
    if found is not fn:
        raise ValueError(f"isolation='process': {module}:{qualname} names another object than the handler")
    return f"{module}:{qualname}"


def _resolve(module: str, qualname: str) -> Any:
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


@dataclass
class _Child:
    proc: BaseProcess
    conn: Connection  # the worker's end of the pipe
    tasks_done: int = 0


@dataclass
class _Busy:
    """A child running one attempt."""

    child: _Child
    stop: asyncio.Future[str]  # set to the reason the attempt is to be killed
    gone: asyncio.Event = field(default_factory=asyncio.Event)  # the attempt's child stopped running it


class ProcessPool:
    """At most `size` children running tasks (one per worker slot), started on demand."""

    def __init__(self, size: int, max_tasks_per_child: int, kill_grace_s: float,
                 memory_limit_bytes: int | None) -> None:
        self._size = size
        self._max_tasks = max_tasks_per_child
        self._grace_s = kill_grace_s
        self._memory_limit = memory_limit_bytes
        self._ctx = multiprocessing.get_context(START_METHOD)
        if START_METHOD == "forkserver":
            # Children fork with the SDK imported: a child's start (each recycle) 0.06 s, not 0.19
            # (bench.micro.isolation_cost). Replaces a preload list set before; no effect on a
            # forkserver already running.
            self._ctx.set_forkserver_preload(["schedulerd.sdk.worker"])
        self._idle: list[_Child] = []
        self._busy: dict[tuple[str, int], _Busy] = {}  # by (run_id, fence)
        self._reapers: set[asyncio.Task[None]] = set()

    @property
    def busy(self) -> int:
        return len(self._busy)

    async def run(self, ref: str, task: Task, wait_s: float | None) -> tuple[str, Any]:
        """Run `task` in a child: ("ack", result) or ("nack", reason). Returns at once
        when the attempt is stopped (timeout after `wait_s`, stop()), its child then killed
        in the background."""
        try:
            child = self._take()
        except OSError as exc:  # out of processes or descriptors: this task fails, not the worker
            return "nack", f"ChildStartFailed: {type(exc).__name__}: {exc}"
        loop = asyncio.get_running_loop()
        busy = _Busy(child, loop.create_future())
        key = (task.run_id, task.fence)
        self._busy[key] = busy
        answered = loop.create_future()
        fds = (child.conn.fileno(), child.proc.sentinel)  # an answer, or the child's end
        for fd in fds:
            loop.add_reader(fd, _set_once, answered, None)
        try:
            try:
                child.conn.send_bytes(msgspec.json.encode((ref, task)))
            except OSError:
                pass  # the child has just died: its sentinel says how, below
            done, _ = await asyncio.wait({answered, busy.stop}, timeout=wait_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._reap(child, signal.SIGTERM, busy.gone)  # not left running a task nobody awaits
            raise
        finally:
            for fd in fds:
                loop.remove_reader(fd)
            del self._busy[key]
        if answered in done:
            outcome = await self._outcome(child)
            busy.gone.set()
            return outcome
        reason = busy.stop.result() if busy.stop.done() else f"timeout: killed after timeout_s={task.timeout_s:g}"
        log.warning("child_killed run_id=%s fence=%d pid=%s reason=%s", task.run_id, task.fence,
                    child.proc.pid, reason)
        self._reap(child, signal.SIGTERM, busy.gone)
        return "nack", reason

    def stop(self, run_id: str, fence: int, reason: str) -> None:
        """Kill the child running this attempt, if one is."""
        busy = self._busy.get((run_id, fence))
        if busy is not None:
            _set_once(busy.stop, reason)

    async def stop_run(self, run_id: str, reason: str) -> None:
        """Kill every attempt of `run_id` running here; return once their children have ended."""
        held = [busy for (run, _), busy in self._busy.items() if run == run_id]
        for busy in held:
            _set_once(busy.stop, reason)
        for busy in held:
            await busy.gone.wait()

    def stop_all(self, reason: str) -> None:
        for busy in self._busy.values():
            _set_once(busy.stop, reason)

    async def close(self) -> None:
        """End the idle children and wait for every child being killed."""
        for child in self._idle:
            child.conn.close()  # the child reads EOF and exits
            self._reap(child, None, None)
        self._idle.clear()
        while self._reapers:
            await asyncio.gather(*self._reapers)

    def _take(self) -> _Child:
        while self._idle:
            child = self._idle.pop()
            if child.proc.is_alive():
                return child
            self._reap(child, None, None)  # died idle (killed from outside): replace it
        assert len(self._busy) < self._size, "a child per slot at most"
        ours, theirs = self._ctx.Pipe()
        proc = self._ctx.Process(target=_child_main, args=(theirs, self._memory_limit),
                                 name="schedulerd-child", daemon=True)
        try:
            proc.start()
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()  # the child has its own copy
        return _Child(proc, ours)

    async def _outcome(self, child: _Child) -> tuple[str, Any]:
        try:
            kind, value = json.loads(child.conn.recv_bytes())
        except (EOFError, OSError):  # no answer: the child ended
            await _ended(child.proc, _CLOSE_S)
            reason = _exit_reason(child.proc.exitcode)
            log.warning("child_died pid=%s reason=%s", child.proc.pid, reason)
            self._reap(child, signal.SIGKILL, None)
            return "nack", reason
        child.tasks_done += 1
        if kind == "oom" or child.tasks_done >= self._max_tasks:
            child.conn.close()  # exits on EOF (an "oom" child exits by itself)
            self._reap(child, None, None)
        else:
            self._idle.append(child)
        return ("ack", value) if kind == "ok" else ("nack", value)

    def _reap(self, child: _Child, sig: signal.Signals | None, gone: asyncio.Event | None) -> None:
        """Send `sig` now, SIGKILL if the child still runs after the grace, then collect it."""
        reaper = asyncio.get_running_loop().create_task(self._end(child, sig, gone))
        self._reapers.add(reaper)
        reaper.add_done_callback(self._reapers.discard)

    async def _end(self, child: _Child, sig: signal.Signals | None, gone: asyncio.Event | None) -> None:
        try:
            if sig is not None:
                _signal(child.proc, sig)
            ended = await _ended(child.proc, self._grace_s if sig is not None else _CLOSE_S)
            if sig is not None or not ended:
                _signal(child.proc, signal.SIGKILL)  # and what the child started, if it has ended
                await _ended(child.proc, None)
            child.proc.join(0)
            child.conn.close()
        finally:
            if gone is not None:
                gone.set()


def _signal(proc: BaseProcess, sig: signal.Signals) -> None:
    """`sig` to the child's process group: what the handler started goes with it."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:  # no such group: everyone in it has exited, or the child has not made it yet
        if proc.exitcode is None:
            with contextlib.suppress(ProcessLookupError):  # it ended since
                os.kill(proc.pid, sig)


async def _ended(proc: BaseProcess, timeout_s: float | None) -> bool:
    """Wait up to `timeout_s` for the child to end; whether it has."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    loop.add_reader(proc.sentinel, _set_once, ended, None)
    try:
        done, _ = await asyncio.wait({ended}, timeout=timeout_s)
    finally:
        loop.remove_reader(proc.sentinel)
    return bool(done)


def _set_once(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "exited: the child closed its pipe without answering"
    if code >= 0:
        return f"exited with status {code} before answering"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "unknown"
    reason = f"exited with signal {-code} ({name})"
    if -code == signal.SIGKILL:
        # Not ours (a kill we send has its own reason): on Linux, nearly always the OOM killer.
        reason += ", not sent by the worker: most likely out of memory (the kernel's OOM killer)"
    return reason


def _child_main(conn: Connection, memory_limit_bytes: int | None) -> None:
    """A child's life: run the tasks the pipe brings until it closes."""
    os.setpgid(0, 0)  # a group of its own, so a kill reaches what the handler starts
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a worker's Ctrl-C is its own to act on
    if memory_limit_bytes is not None:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    # Imported here, not at the top: the worker module imports this one.
    from schedulerd.sdk.worker import Task, _encode, _error_text
    requests = msgspec.json.Decoder(tuple[str, Task])
    handlers: dict[str, Any] = {}
    while True:
        try:
            ref, task = requests.decode(conn.recv_bytes())
        except EOFError:
            return
        try:
            if ref not in handlers:
                handlers[ref] = _resolve(*ref.split(":", 1))
            result = handlers[ref](task)
            if inspect.iscoroutine(result):
                result = asyncio.run(result)
            json.dumps(result)  # what the worker checks of a thread's result (worker._call)
            _encode(result)
            answer = ["ok", result]
        except MemoryError as exc:
            answer = ["oom", f"out of memory: {_error_text(exc)}"]
        except BaseException as exc:  # sys.exit() in a handler fails its task, as in a thread
            answer = ["error", _error_text(exc)]
        conn.send_bytes(_encode(answer))
        if answer[0] == "oom":
            return  # its heap may be in pieces: the next task gets a fresh child
