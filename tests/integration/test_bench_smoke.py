"""CI smoke of bench/: the issue-5 benchmark must keep running end to end (a real
3-node cluster, the feeder, SDK worker processes, the report). Figures are the
benchmark's business, never asserted here; only that every job ran once."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("scenario, args", [
    ("steady", ["--rate", "50", "--duration", "3", "--workers", "1"]),
    ("spike", ["--jobs", "500", "--workers", "1"]),
])
def test_bench_scenario_runs_every_job_once(tmp_path: pathlib.Path, scenario: str, args: list[str]) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "bench", scenario, *args, "--json", str(out),
                           "--data-root", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stats = json.loads(out.read_text())["report"]["stats"]["schedulerd"]
    assert stats["expected"] > 0 and stats["ran"] == stats["expected"], stats
    assert stats["missing"] == 0 and stats["duplicates"] == 0, stats
    assert "## " + scenario in proc.stdout
    assert "| box slowdown over the window" in proc.stdout


def test_apply_cost_runs_every_phase(tmp_path: pathlib.Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.apply_cost", "--jobs", "300", "--data-root", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for phase in ("create", "claim", "lease", "ack", "total"):
        assert f"  {phase} " in proc.stdout


def test_sdk_cost_acks_every_task() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.sdk_cost", "--tasks", "2000", "--log-info"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "worker CPU per task:" in proc.stdout
