"""Starts the kernel writing back a store's dirty pages every few seconds, so they
reach the disk a little at a time instead of in one burst.

Commits to the store are not synced (raft/bootmark.py). Their pages stay dirty in
the page cache until the kernel's flusher takes them, by Linux's defaults once they are
~30 s old (`vm.dirty_expire_centisecs`): at 10,000 jobs/s, 0.6–1 GB of a box's three
stores at once. Every journal fdatasync on that disk then queues behind the burst, and
each node's commits stall together (docs/decisions.md, "The store's writeback is paced").

`sync_file_range(SYNC_FILE_RANGE_WRITE)` starts writing the file's dirty pages that are
not already being written and returns: it waits for none of them and flushes no device
cache. It changes when pages reach the disk, not whether a commit is durable; the Raft
journal is what makes an entry durable. It runs in a thread of its own because the
call can still block while the device's queue is full."""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from typing import Any, Callable, Iterator

log = logging.getLogger("schedulerd.store")

_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>


def _libc(name: str, argtypes: list[Any] | None, restype: Any) -> Callable[..., int] | None:
    """A C library function, or None where there is none (not Linux)."""
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (AttributeError, OSError):
        return None
    if argtypes is not None:
        fn.argtypes = argtypes
    fn.restype = restype
    return fn


_sync_file_range = _libc("sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint],
                         ctypes.c_int)
_syscall = _libc("syscall", None, ctypes.c_long)


class _CacheRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _CacheStat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in
                ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


_CACHESTAT = 451  # the same number on every Linux architecture (Linux >= 6.5)
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def _opened(path: str) -> Iterator[int | None]:
    """The file at `path` opened read-only, or None while there is none (a snapshot
    restore is replacing it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def start_writeback(path: str) -> bool:
    """Ask the kernel to start writing back every dirty page of the file at `path`.
    False if there is no such file or no such call."""
    if _sync_file_range is None:
        return False
    with _opened(path) as fd:
        if fd is None:
            return False
        if _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE) != 0:
            err = ctypes.get_errno()
            log.warning("store_writeback_failed path=%s error=%s", path, os.strerror(err))
            return False
        return True


def dirty_bytes() -> int | None:
    """Bytes of the page cache waiting to be written back, box-wide (/proc/meminfo)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"Dirty:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def file_dirty_bytes(path: str) -> int | None:
    """Bytes of the file at `path` dirty in the page cache (cachestat(2), Linux >= 6.5);
    None where the kernel cannot say, or there is no such file."""
    if _syscall is None:
        return None
    with _opened(path) as fd:
        stat = _CacheStat()
        if fd is None or _syscall(_CACHESTAT, fd, ctypes.byref(_CacheRange(0, 0)), ctypes.byref(stat), 0) != 0:
            return None
        return stat.nr_dirty * _PAGE_BYTES


# A check asks for writeback only once the store's file has gained this many dirty
# bytes: at 10,000 jobs/s a store dirties 50-70 MB per 5 s and the kernel's 30 s burst
# stalls the journals; at 300 jobs/s it dirties ~2 MB, a burst too small to matter, and
# pacing would only write its hot pages six times as often.
GROWTH_MIN_BYTES = 16 << 20
# Where the kernel cannot tell a file's dirty bytes (no cachestat, Linux < 6.5): pace
# only while the whole box holds this many dirty bytes.
DIRTY_MIN_BYTES = 64 << 20


class WritebackPacer:
    """Every `period_s`, from a daemon thread, calls `start_writeback` on one file when
    it dirtied `growth_min` bytes or more since its previous call; where the kernel cannot
    tell a file's dirty bytes, when the box holds `dirty_min` or more. The file is opened
    afresh each time: a snapshot restore replaces it."""

    def __init__(self, path: str, period_s: float, growth_min: int = GROWTH_MIN_BYTES,
                 dirty_min: int = DIRTY_MIN_BYTES) -> None:
        self.path = path
        self.period_s = period_s
        self.growth_min = growth_min
        self.dirty_min = dirty_min
        self.checks = 0
        self.rounds = 0  # of writeback asked for
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-writeback", daemon=True)

    def start(self) -> None:
        if _sync_file_range is None:
            log.info("store_writeback_unpaced reason=no_sync_file_range path=%s", self.path)
            return
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        # After a call to start writeback, read again, once the pages it started are no
        # longer dirty: the next reading's excess is what commits dirtied since. A flush by
        # the kernel in between reads as no growth, and that check asks for none.
        last = file_dirty_bytes(self.path)
        while not self._stop.wait(self.period_s):
            self.checks += 1
            now = file_dirty_bytes(self.path)
            if self._due(now, last):
                start_writeback(self.path)
                self.rounds += 1
                now = file_dirty_bytes(self.path)
            last = now

    def _due(self, now: int | None, last: int | None) -> bool:
        if now is not None and last is not None:
            return now - last >= self.growth_min
        dirty = dirty_bytes()
        return dirty is None or dirty >= self.dirty_min
