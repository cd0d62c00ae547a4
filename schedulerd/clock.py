"""The daemon's only source of time. storage/ never reads a clock: the node
stamps `now` into each command from here, and tests or the fault harness swap
in a clock of their own (or shift this one)."""
from __future__ import annotations

import time


class Clock:
    """Wall-clock microseconds plus an adjustable offset (for clock-skew tests)."""

    def __init__(self, offset_us: int = 0) -> None:
        self.offset_us = offset_us

    def now_us(self) -> int:
        return time.time_ns() // 1000 + self.offset_us
