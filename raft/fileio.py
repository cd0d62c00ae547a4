"""Small durable-file steps shared by the journal's segments and the snapshots."""
from __future__ import annotations

import os


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of data at offset (os.pwrite may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def fsync_dir(path: str) -> None:
    """Make a rename, creation or removal of `path` durable."""
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
