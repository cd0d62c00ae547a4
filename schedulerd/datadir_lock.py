"""One process per data dir: the daemon holds an flock on `<data dir>/schedulerd.lock` for
as long as it runs, with its pid and command line in it for whoever finds it taken. The
kernel drops the lock when the process ends, kill -9 included, so a stale file never
keeps a node from starting."""
from __future__ import annotations

import fcntl
import os
import sys

FILE = "schedulerd.lock"


class DataDirInUse(Exception):
    """Another live process holds the data dir."""


def hold(data_dir: str) -> int:
    """Take the data dir for this process; the returned fd must stay open while it runs."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        raise DataDirInUse(f"data dir {data_dir} is in use by {holder}: stop that process, or give this one "
                           "another --data-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"process {os.getpid()} ({' '.join(sys.argv)})\n".encode(), 0)
    return fd
