import os
import time

from schedulerd.clock import Clock
from tests.integration.harness import wait_until


def test_offset_file_shifts_the_clock_and_is_reread(tmp_path) -> None:
    path = tmp_path / "offset"
    clock = Clock(offset_file=str(path))
    assert abs(clock.now_us() - time.time_ns() // 1000) < 100_000
    path.write_text("30.5")
    wait_until(lambda: abs(clock.now_us() - time.time_ns() // 1000 - 30_500_000) < 100_000, 2, "offset +30.5 s")
    path.write_text("-2")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1))
    wait_until(lambda: abs(clock.now_us() - time.time_ns() // 1000 + 2_000_000) < 100_000, 2, "offset -2 s")
    path.unlink()
    wait_until(lambda: abs(clock.now_us() - time.time_ns() // 1000) < 100_000, 2, "no offset")
