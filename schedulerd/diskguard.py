"""Refuse writes before the disk is full, not after.

A node that runs out of space mid-write must stop (a journal or LMDB write
that failed cannot be trusted), so the API turns writes away with a 503 while
free space on the data directory is below `disk_free_bytes_min`, and accepts
them again as soon as space returns."""
from __future__ import annotations

import os
import time

from schedulerd.errors import Unavailable

RECHECK_S = 0.5


class DiskGuard:
    def __init__(self, path: str, free_bytes_min: int) -> None:
        self.path = path
        self.free_bytes_min = free_bytes_min
        self.refusals = 0
        self._free_bytes = free_bytes_min
        self._checked_at = float("-inf")

    def free_bytes(self) -> int:
        now = time.monotonic()
        if now - self._checked_at >= RECHECK_S:
            st = os.statvfs(self.path)
            self._free_bytes = st.f_bavail * st.f_frsize
            self._checked_at = now
        return self._free_bytes

    def low(self) -> bool:
        return self.free_bytes() < self.free_bytes_min

    def check(self) -> None:
        free = self.free_bytes()
        if free < self.free_bytes_min:
            self.refusals += 1
            raise Unavailable(f"disk nearly full: {free} bytes free under {self.path}; "
                              f"disk_free_bytes_min is {self.free_bytes_min}; writes resume when space returns")
