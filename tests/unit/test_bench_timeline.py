"""bench/timeline.py: one line per step, with the disk and page-cache figures."""
from __future__ import annotations

import pytest

from bench import timeline


def test_each_step_prints_the_box_and_the_disk(capsys: pytest.CaptureFixture[str]) -> None:
    assert timeline.main(["0.2", "--step-s", "0.1", "--disk", "no-such-disk"]) == 0
    steps = capsys.readouterr().out.splitlines()[1:]
    assert len(steps) >= 2
    assert all(" box " in s and "disk 0 MB/s, dirty " in s for s in steps)
