"""How fast the box itself runs, sampled through a whole bench invocation.

The shared 2-core VMs this bench runs on change speed on their own: a fixed piece of
pure-Python work costs up to 1.6x the CPU in some stretches of seconds as in others, on
an idle box as much as under load. A run that
falls in a slow stretch takes up to 1.6x as long for the same work, so each figure that
is a wall time is reported beside the box's speed over its window.

The probe is a thread of the bench process: every INTERVAL_S it times WORK in CPU time
of its own thread (time.thread_time), which counts neither waiting for a core nor for the
GIL, so a busy box does not read as a slow one. It costs ~0.5% of one core."""
from __future__ import annotations

import statistics
import threading
import time

INTERVAL_S = 0.5


def _work() -> None:
    d: dict[int, str] = {}
    for i in range(20_000):
        d[i & 1023] = str(i)


class SpeedProbe(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True, name="speed-probe")
        self.samples: list[tuple[float, float]] = []  # (epoch s, CPU ms of one WORK)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(INTERVAL_S):
            started = time.thread_time()
            _work()
            self.samples.append((time.time(), (time.thread_time() - started) * 1e3))

    def stop(self) -> None:
        self._halt.set()

    def slowdown(self, t0: float, t1: float) -> float | None:
        """Median CPU cost of WORK within [t0, t1] over its cheapest in the whole invocation:
        1.0 is the box at its fastest, 1.6 a stretch where everything takes 1.6x the CPU."""
        window = [ms for at, ms in self.samples if t0 <= at <= t1]
        if not window:
            return None
        return round(statistics.median(window) / min(ms for _, ms in self.samples), 2)


PROBE = SpeedProbe()
