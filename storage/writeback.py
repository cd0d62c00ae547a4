"""Starts the kernel writing back a store's dirty pages every few seconds, so they
reach the disk a little at a time instead of in one burst.

Commits to the store are not synced (storage/bootmark.py). Their pages stay dirty in
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

import ctypes
import logging
import os
import threading
from typing import Callable

log = logging.getLogger("schedulerd.store")

_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>


def _load() -> Callable[[int, int, int, int], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None  # not Linux
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load()


def start_writeback(path: str) -> bool:
    """Ask the kernel to start writing back every dirty page of the file at `path`.
    False if there is no such file (a snapshot restore is replacing it) or no such call."""
    if _sync_file_range is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        if _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE) != 0:
            err = ctypes.get_errno()
            log.warning("store_writeback_failed path=%s error=%s", path, os.strerror(err))
            return False
        return True
    finally:
        os.close(fd)


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


class WritebackPacer:
    """Every `period_s`, from a daemon thread, calls `start_writeback` on one file if
    the box holds at least `dirty_min` dirty bytes.

    Below that, what the kernel writes back at once is too little to stall anyone, and
    pacing would only write the store's hot pages six times as often as the kernel's
    30 s: at 300 jobs/s over a 1,000,000-job store, paced regardless, one side-by-side
    run's p99 was 1.50x the small store's, against 1.18x unpaced (docs/performance.md,
    twenty-ninth round). The file is opened afresh each time: a snapshot restore
    replaces it with another."""

    def __init__(self, path: str, period_s: float, dirty_min: int) -> None:
        self.path = path
        self.period_s = period_s
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
        while not self._stop.wait(self.period_s):
            self.checks += 1
            dirty = dirty_bytes()
            if dirty is None or dirty >= self.dirty_min:
                start_writeback(self.path)
                self.rounds += 1
