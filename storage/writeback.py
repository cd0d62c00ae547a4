"""Starts the kernel writing back a store's dirty pages every few seconds, so they
reach the disk a little at a time instead of in one burst.

Commits to the store are not synced (storage/bootmark.py). Their pages stay dirty in
the page cache until the kernel's flusher takes them, by Linux's defaults once they are
~30 s old (`vm.dirty_expire_centisecs`): at 10,000 jobs/s, 230–600 MB of a box's three
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


class WritebackPacer:
    """Calls `start_writeback` on one file every `period_s`, from a daemon thread.

    The file is opened afresh each time: a snapshot restore replaces it with another."""

    def __init__(self, path: str, period_s: float) -> None:
        self.path = path
        self.period_s = period_s
        self.rounds = 0
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
            start_writeback(self.path)
            self.rounds += 1
