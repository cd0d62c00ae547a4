"""schedctl against a real node: create --file, runs --follow, top."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
from datetime import datetime, timezone

import pytest

from schedulerd.sdk.worker import Worker
from tests.integration.harness import running, wait_until

pytestmark = pytest.mark.integration


def schedctl(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedulerd.cli.main", "--server", url, *args],
                          capture_output=True, text=True, timeout=60)


def test_create_from_a_yaml_file_in_batches_and_point_at_a_bad_job(make_cluster, tmp_path: pathlib.Path) -> None:
    node = make_cluster(1).nodes[0]
    good = tmp_path / "jobs.yaml"
    good.write_text("jobs:\n" + "".join(
        f"  - job_id: report-{i}\n    schedule: {{cron: '0 {i % 24} * * *', timezone: Europe/Berlin}}\n"
        f"    queue: reports\n    payload: {{n: {i}}}\n" for i in range(150))
        + "  - job_id: new-year\n    schedule: {at: 2027-01-01T00:00:00Z}\n")
    result = schedctl(node.url, "create", "--file", str(good))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("created 151 of 151 jobs")
    assert node.get("/v1/jobs/report-149")[1]["payload"] == {"n": 149}
    assert node.get("/v1/jobs/new-year")[1]["next_fire_time"] == "2027-01-01T00:00:00Z"

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"job_id": f"b{i}", "schedule": {"every": "1h"}} for i in range(103)]
                              + [{"job_id": "oops", "schedule": {"cron": "61 * * * *"}}]))
    result = schedctl(node.url, "create", "--file", str(bad))
    assert result.returncode == 1
    assert "batch jobs[100..103]" in result.stderr and "jobs[3] (job_id 'oops')" in result.stderr
    assert "(100 jobs created before this batch)" in result.stderr
    assert node.get("/v1/jobs/b99")[0] == 200 and node.get("/v1/jobs/b100")[0] == 404

    again = schedctl(node.url, "create", "--file", str(good), "--queue", "x")
    assert again.returncode == 2 and "drop --queue" in again.stderr


def test_runs_follow_prints_each_change_and_top_shows_queues(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    now = datetime.now(timezone.utc).isoformat()
    assert node.post("/v1/jobs", {"job_id": "watched", "schedule": {"at": now}, "queue": "later"})[0] == 201
    # Ctrl-C is what stops --follow; a suite started in the background (`cmd &` without
    # job control) passes SIGINT down ignored, so give the child the terminal's default.
    follow = subprocess.Popen([sys.executable, "-m", "schedulerd.cli.main", "--server", node.url, "runs", "watched",
                               "--follow", "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(follow.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any(" queued " in line for line in lines), 15, "the queued run")

        frame = json.loads(schedctl(node.url, "--json", "top", "--once").stdout)
        assert frame["groups"][0]["is_leader"] is True
        [queue] = frame["queues"]
        assert queue["queue"] == "later" and queue["ready"] == 1
        assert frame["events"]["claimed"] == 1
        text = schedctl(node.url, "top", "--once").stdout
        assert "QUEUE" in text and "later" in text and "dispatch lateness" in text

        worker = Worker([node.url], wait_s=1)
        worker.handler("later")(lambda task: "fine")
        with running(worker):
            wait_until(lambda: any(" succeeded " in line for line in lines), 15, "the succeeded run")
    finally:
        follow.send_signal(signal.SIGINT)
        follow.wait(10)
    assert follow.returncode == 0, follow.stderr.read()
    states = [line.split()[2] for line in lines]
    assert states[0] == "queued" and states[-1] == "succeeded", lines  # "running" shows if polled in time
    assert all(" attempt " in line for line in lines), lines
