"""CI smoke of bench/: the scenarios keep running end to end (a real 3-node cluster,
the feeder, SDK worker processes, the report), and so do the micro-benchmarks.
Figures are the benchmark's business, never asserted here; only that every job ran
once and every phase reported."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest


pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_bench(tmp_path: pathlib.Path, args: list[str], timeout_s: float) -> tuple[str, dict]:
    """`python -m bench ARGS` with its JSON written under tmp_path: its stdout and its raw report."""
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "bench", *args, "--json", str(out), "--data-root", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())["report"]


@pytest.mark.parametrize("scenario, args", [
    ("steady", ["--rate", "50", "--duration", "3", "--workers", "1"]),
    ("spike", ["--jobs", "500", "--workers", "1"]),
])
def test_bench_scenario_runs_every_job_once(tmp_path: pathlib.Path, scenario: str, args: list[str]) -> None:
    stdout, report = run_bench(tmp_path, [scenario, *args], 240)
    stats = report["stats"]["schedulerd"]
    assert stats["expected"] > 0 and stats["ran"] == stats["expected"], stats
    assert stats["missing"] == 0 and stats["duplicates"] == 0, stats
    assert "## " + scenario in stdout
    assert "| box slowdown over the window" in stdout


@pytest.mark.soak  # 21 s of the default suite's budget; bench/retention.py is run by hand for its figures
def test_retention_samples_the_store_and_the_ttl_deletes(tmp_path: pathlib.Path) -> None:
    """An 8 s run with a 2 s TTL, its first 4 s of jobs a backlog expiring together and
    the nodes' sweep entries made small: every job runs once, every node is sampled,
    and the sweep has deleted finished jobs by the end."""
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "retention", "--rate", "50", "--duration", "8",
                           "--finished-ttl", "2s", "--sample-s", "2", "--tail-s", "3", "--workers", "1",
                           "--backlog-s", "4", "--limit", "sweep_batch_max=10",
                           "--json", str(out), "--data-root", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = json.loads(out.read_text())["report"]["runs"]
    stats = run["stats"]
    assert stats["expected"] == 400 and stats["ran"] == stats["expected"] and stats["duplicates"] == 0, stats
    samples = run["samples"]
    assert len(samples) >= 5, len(samples)
    for sample in samples:
        assert [n["node"] for n in sample["nodes"]] == ["n0", "n1", "n2"]
        assert all(n["data_mdb_bytes"] and n["rss_bytes"] for n in sample["nodes"]), sample
    last = samples[-1]["nodes"]
    assert all("scrape_error" not in n for n in last), last
    assert max(n["deleted_jobs"] for n in last) > 0, last
    assert any(s.get("window", {}).get("due") for s in samples)
    assert "## retention" in proc.stdout and "### --finished-ttl 2s: every sample" in proc.stdout
    assert "backlog: the 200 jobs due" in proc.stdout and "--limit sweep_batch_max=10" in proc.stdout


def test_apply_cost_runs_every_phase(tmp_path: pathlib.Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.micro.apply_cost", "--jobs", "300",
                           "--data-root", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for phase in ("create", "claim", "lease", "ack", "total"):
        assert f"  {phase} " in proc.stdout


def test_sdk_cost_acks_every_task() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.micro.sdk_cost", "--tasks", "2000", "--log-info"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "worker CPU per task:" in proc.stdout


def test_isolation_cost_runs_a_thread_and_a_process_handler() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.micro.isolation_cost", "--tasks", "60", "--warmup", "10",
                           "--rounds", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " thread: " in proc.stdout and "process: " in proc.stdout and "process - thread:" in proc.stdout


@pytest.mark.soak  # 27 s of the default suite's budget; bench/scale.py is run by hand for its figures
def test_scale_side_by_side_runs_every_window_on_both_clusters(tmp_path: pathlib.Path) -> None:
    _, report = run_bench(tmp_path, ["scale", "--live", "2000", "--baseline-live", "500", "--rate", "30",
                                     "--duration", "2", "--workers", "1", "--side-by-side", "1"], 300)
    assert [w["system"] for w in report["windows"]] == ["500 live", "2,000 live"]
    for stats in report["stats"].values():
        assert stats["ran"] == stats["expected"] > 0 and stats["duplicates"] == 0, stats
    assert report["wiped"]["digest_match"] and report["restart"]["digest_match"]


def test_scale_cost_compares_both_stores(tmp_path: pathlib.Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.micro.scale_cost", "--live", "3000",
                           "--baseline-live", "300", "--rounds", "2", "--jobs-per-round", "200", "--scans", "2", "--data-root", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for row in ("apply µs/job", "due scan ms"):
        assert f"  {row}" in proc.stdout


def test_snapshot_cost_times_each_copy_and_the_journal_beside_it(tmp_path: pathlib.Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.micro.snapshot_cost", "--live", "3000", "--rounds", "2",
                           "--idle-s", "0.2", "--data-root", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "  no copy (0.2 s): journal fdatasync p50" in proc.stdout
    assert "  round 1: " in proc.stdout and "  median: " in proc.stdout


def test_topology_grows_a_cluster_under_load_and_runs_every_job_once(tmp_path: pathlib.Path) -> None:
    stdout, report = run_bench(tmp_path, ["topology", "--rate", "40", "--duration", "12", "--groups", "2",
                                          "--join", "1", "--join-after", "3", "--workers", "1"], 300)
    stats = report["stats"]
    assert stats["ran"] == stats["expected"] > 0 and stats["missing"] == 0 and stats["duplicates"] == 0, stats
    assert len(report["after"]["groups_per_node"]) == 4, report["after"]
    assert "| time from the joins until balanced (s)" in stdout
