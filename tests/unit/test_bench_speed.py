"""bench/speed.py: the box's speed over a window, as the bench reports it beside each wall time."""
from __future__ import annotations

import time

from bench.speed import SpeedProbe


def test_slowdown_is_the_window_median_over_the_fastest_sample_of_the_invocation() -> None:
    probe = SpeedProbe()
    probe.samples = [(100.0, 7.5), (101.0, 7.6), (102.0, 12.0), (103.0, 11.8), (104.0, 12.3), (105.0, 7.5)]
    assert probe.slowdown(102.0, 104.0) == 1.6
    assert probe.slowdown(100.0, 101.0) == 1.01
    assert probe.slowdown(200.0, 300.0) is None, "no sample in the window"


def test_the_probe_samples_until_stopped() -> None:
    probe = SpeedProbe()
    probe.start()
    deadline = time.monotonic() + 10
    while len(probe.samples) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    probe.stop()
    probe.join(5)
    assert len(probe.samples) >= 2 and not probe.is_alive()
    assert all(ms > 0 for _, ms in probe.samples)
