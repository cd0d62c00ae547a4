"""The daemon's only source of time. storage/ never reads a clock: the node
stamps `now` into each command from here, and tests or the fault harness shift
it (clock skew) without touching the machine's clock."""
from __future__ import annotations

import os
import time

from schedulerd.units import US_PER_S

OFFSET_RECHECK_S = 0.05


class Clock:
    """Wall-clock microseconds plus an offset.

    With `offset_file`, the offset (seconds, a float, e.g. `-2.5`) is read from that
    file, and re-read when it changes: the fault harness skews a running daemon by
    writing to it. A missing or empty file means no offset."""

    def __init__(self, offset_us: int = 0, offset_file: str | None = None) -> None:
        self.offset_us = offset_us
        self._offset_file = offset_file
        self._file_offset_us = 0
        self._checked_at = float("-inf")
        self._mtime_ns: int | None = None

    def now_us(self) -> int:
        if self._offset_file is not None:
            self._refresh()
        return time.time_ns() // 1000 + self.offset_us + self._file_offset_us

    def _refresh(self) -> None:
        mono = time.monotonic()
        if mono - self._checked_at < OFFSET_RECHECK_S:
            return
        self._checked_at = mono
        try:
            mtime = os.stat(self._offset_file).st_mtime_ns
        except FileNotFoundError:
            self._file_offset_us, self._mtime_ns = 0, None
            return
        if mtime == self._mtime_ns:
            return
        self._mtime_ns = mtime
        with open(self._offset_file) as f:
            text = f.read().strip()
        try:
            self._file_offset_us = int(float(text) * US_PER_S) if text else 0
        except ValueError:
            self._file_offset_us = 0
