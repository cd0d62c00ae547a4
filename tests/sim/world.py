"""The simulated world every node lives in: one clock, one event loop on that clock, one
seeded source of randomness, and the patches that route the daemon's time, entropy,
background threads and process exits through them.

Nothing here copies daemon code: the nodes run schedulerd's own modules, and the
patches only replace what the operating system would otherwise decide (what time it
is, which bytes urandom returns, when a thread runs, what os._exit does)."""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import logging
import os
import random
import secrets
import selectors
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable, Iterator

import pysyncobj.syncobj
import pysyncobj.tcp_connection
import pysyncobj.transport

from schedulerd.raft import bootmark, segments, snapshot_writer

# Where simulated time starts: a fixed instant, so a seed replays the same dates.
EPOCH_S = 1_800_000_000.0
MONOTONIC_START_S = 10_000.0

# The node whose code is running: set while one of its replicas ticks, and carried into
# every task and callback its code creates (contextvars follow asyncio's scheduling).
current_node: contextvars.ContextVar[str | None] = contextvars.ContextVar("sim_node", default=None)


class Stopped(BaseException):
    """Raised where a node's process would have exited (os._exit); a BaseException so the
    daemon's `except Exception` handlers do not swallow it."""

    def __init__(self, node: str | None, code: int) -> None:
        super().__init__(f"node {node} exited with code {code}")
        self.node = node
        self.code = code


class Deadlock(Exception):
    """The loop has nothing scheduled and nothing ready: simulated time cannot move."""


class SimClock:
    def __init__(self) -> None:
        self.elapsed_s = 0.0

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self.elapsed_s += seconds

    def wall(self) -> float:
        return EPOCH_S + self.elapsed_s

    def monotonic(self) -> float:
        return MONOTONIC_START_S + self.elapsed_s


class _SimSelector(selectors.BaseSelector):
    """The loop's selector: the loop's own self-pipe is real (call_soon_threadsafe writes to
    it), and instead of waiting for I/O the selector moves the clock to the next timer."""

    def __init__(self, clock: SimClock) -> None:
        self._real = selectors.DefaultSelector()
        self._clock = clock

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready:
            return ready
        if timeout is None:
            raise Deadlock("nothing is scheduled: simulated time cannot move")
        self._clock.advance(timeout)
        return []

    def close(self) -> None:
        self._real.close()


class SimThread:
    """Stands in for threading.Thread in modules whose threads run beside the tick thread
    (snapshot copies, segment removal): the target runs on the loop, in the starting node's
    context, after a delay the world draws (how long the work takes)."""

    world: "World"

    def __init__(self, target: Callable[..., Any], args: tuple[Any, ...] = (), name: str = "",
                 daemon: bool = True) -> None:
        self._target, self._args, self.name = target, args, name
        self._handle: asyncio.TimerHandle | None = None
        self._done = False

    def start(self) -> None:
        world = SimThread.world
        delay = world.thread_delay_s(self.name)
        self._handle = world.loop.call_later(delay, self.run)
        world.note_thread(self)

    def run(self) -> None:
        if self._done:
            return
        self._done = True
        if self._handle is not None:
            self._handle.cancel()
        self._target(*self._args)

    def cancel(self) -> None:
        """The node crashed: the work never finishes."""
        self._done = True
        if self._handle is not None:
            self._handle.cancel()

    def is_alive(self) -> bool:
        return not self._done

    def join(self, timeout: float | None = None) -> None:
        self.run()


class SimEvent:
    """threading.Event whose wait never blocks: the delay it stood for is the SimThread's."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        return self._set


class _SimThreading:
    """What `threading` is to the modules that start background work."""
    Thread = SimThread
    Event = SimEvent
    Lock = threading.Lock


class World:
    """The clock, the loop and the seeded randomness of one simulation run."""

    def __init__(self, seed: int) -> None:
        self.clock = SimClock()
        self.rng = random.Random(seed)  # the simulator's own draws (faults, network, workload)
        self.loop = asyncio.SelectorEventLoop(_SimSelector(self.clock))  # type: ignore[arg-type]
        self.loop.set_task_factory(self._task_factory)
        self.loop.set_exception_handler(self._loop_exception)
        self.on_stop: Callable[[Stopped], None] = lambda stop: None
        # By node, in creation order (a set would cancel them in address order, which differs run to run).
        self.tasks: dict[str, dict[asyncio.Task[Any], None]] = {}
        self.threads: dict[str, list[SimThread]] = {}
        self.boot_ids: dict[str, int] = {}
        self.loop_errors: list[str] = []
        self.log_tail: deque[str] = deque(maxlen=400)
        self.full_disks: set[str] = set()  # nodes whose disk is full: writes fail with ENOSPC
        self.low_disks: set[str] = set()  # nodes whose free space is under the guard's minimum
        self.data_roots: dict[str, str] = {}  # node -> its data dir

    # --- the loop ---

    def _task_factory(self, loop: asyncio.AbstractEventLoop, coro: Any, context: Any = None) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, context=context)
        node = (context.get(current_node) if context is not None else current_node.get())
        if node is not None:
            tasks = self.tasks.setdefault(node, {})
            tasks[task] = None
            task.add_done_callback(lambda done: tasks.pop(done, None))
        return task

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, Stopped):
            self.stopped(exc)
            return
        if isinstance(exc, asyncio.CancelledError):
            return
        self.loop_errors.append(f"{context.get('message')}: {exc!r}")

    def run_in(self, node: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call fn as node's code (its context: tasks it creates are the node's)."""
        token = current_node.set(node)
        try:
            return fn(*args)
        finally:
            current_node.reset(token)

    def thread_delay_s(self, name: str) -> float:
        # A snapshot copy takes a while (so one can be in flight when faults strike); the rest at once.
        return self.rng.uniform(0.05, 4.0) if name == "snapshot-writer" else 0.0

    def note_thread(self, thread: SimThread) -> None:
        node = current_node.get()
        if node is not None:
            threads = self.threads.setdefault(node, [])
            threads[:] = [t for t in threads if t.is_alive()]
            threads.append(thread)

    def kill_node_work(self, node: str) -> None:
        """The node's process is gone: none of its tasks or background work runs again."""
        for task in list(self.tasks.pop(node, {})):
            task.cancel()
        for thread in self.threads.pop(node, []):
            thread.cancel()

    # --- what the patches answer ---

    def node_of_path(self, path: str) -> str | None:
        for node, root in self.data_roots.items():
            if path.startswith(root + os.sep):
                return node
        return None

    def boot_id(self) -> str | None:
        node = current_node.get()
        return None if node is None else f"sim-boot-{node}-{self.boot_ids.get(node, 0)}"

    def stopped(self, stop: Stopped) -> None:
        """A node's process ended (os._exit, or a tick that raised): the simulation crashes it."""
        self.loop.call_soon(self.on_stop, stop)

    def exit(self, code: int) -> None:
        stop = Stopped(current_node.get(), code)
        self.stopped(stop)
        raise stop

    @contextlib.contextmanager
    def installed(self, more: Callable[[Callable[[Any, str, Any], None]], None]) -> Iterator["World"]:
        """Route the process's time, entropy, background threads and exits through this
        world for the body; everything is put back after."""
        clock, saved = self.clock, []
        entropy = random.Random(self.rng.getrandbits(64))

        def patch(owner: Any, name: str, value: Any) -> None:
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)

        def statvfs(path: Any) -> Any:
            real = _real_statvfs(path)
            node = self.node_of_path(os.path.abspath(os.fspath(path)) + os.sep)
            if node in self.low_disks or node in self.full_disks:
                return os.statvfs_result((real.f_bsize, real.f_frsize, real.f_blocks, 0, 0, *real[5:]))
            return real

        _real_statvfs = os.statvfs
        patch(time, "time", clock.wall)
        patch(time, "time_ns", lambda: int(clock.wall() * 1e9))
        patch(time, "monotonic", clock.monotonic)
        patch(time, "monotonic_ns", lambda: int(clock.monotonic() * 1e9))
        patch(time, "perf_counter", clock.monotonic)
        patch(time, "sleep", lambda seconds: None)
        for module in (pysyncobj.syncobj, pysyncobj.tcp_connection, pysyncobj.transport):
            patch(module, "monotonicTime", clock.monotonic)
        patch(os, "_exit", self.exit)
        patch(os, "urandom", lambda n: entropy.getrandbits(8 * n).to_bytes(n, "little") if n else b"")
        patch(os, "statvfs", statvfs)
        patch(secrets, "token_hex", lambda n=32: entropy.getrandbits(8 * n).to_bytes(n, "little").hex())
        patch(uuid, "uuid4", lambda: uuid.UUID(int=entropy.getrandbits(128), version=4))
        patch(logging, "shutdown", lambda *a, **k: None)
        patch(bootmark, "current_boot", self.boot_id)
        patch(snapshot_writer, "threading", _SimThreading)
        patch(segments, "threading", _SimThreading)
        SimThread.world = self
        more(patch)
        state = random.getstate()
        random.seed(self.rng.getrandbits(64))  # pysyncobj's election timeouts, the topology's shuffles
        handler = _TailHandler(self)
        root = logging.getLogger("schedulerd")
        old_level, old_propagate = root.level, root.propagate
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
        try:
            yield self
        finally:
            root.removeHandler(handler)
            root.setLevel(old_level)
            root.propagate = old_propagate
            random.setstate(state)
            for owner, name, value in reversed(saved):
                setattr(owner, name, value)
            with contextlib.suppress(Exception):
                self.loop.close()


class _TailHandler(logging.Handler):
    """Keeps the daemon's last log lines, stamped with simulated time and node, for a failure's trace."""

    def __init__(self, world: World) -> None:
        super().__init__(logging.INFO)
        self.world = world

    def emit(self, record: logging.LogRecord) -> None:
        self.world.log_tail.append(f"{self.world.clock.elapsed_s:12.3f} {current_node.get() or '-':<4} "
                                   f"{record.levelname:<7} {record.getMessage()}")


def enospc(path: str) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
