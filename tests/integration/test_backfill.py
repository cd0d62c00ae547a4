"""A backfill through a real node and schedctl: the dry run lists exactly what the real one
makes, each occurrence runs once with its own idempotency key, and a repeat makes nothing."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from schedulerd.timefmt import to_iso
from tests.integration.harness import wait_until
from tests.integration.test_cli_live import schedctl

pytestmark = pytest.mark.integration


def _iso(dt: datetime) -> str:
    return to_iso(int(dt.timestamp()) * 1_000_000)


def test_backfill_a_paused_jobs_missed_minutes_dry_then_for_real(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    start, end = now - timedelta(minutes=10), now - timedelta(minutes=4)
    status, job = node.post("/v1/jobs", {"job_id": "rollup", "schedule": {"cron": "* * * * *"}, "queue": "q",
                                         "starting_deadline_s": 30, "overlap_policy": "skip"})
    assert status == 201, job
    assert node.post("/v1/jobs/rollup/pause", {})[0] == 200

    status, dry = node.post("/v1/jobs/rollup/backfill", {"start": _iso(start), "end": _iso(end), "dry_run": True})
    assert status == 200, dry
    wanted = [_iso(start + timedelta(minutes=k)) for k in range(6)]
    assert [o["scheduled_time"] for o in dry["occurrences"]] == wanted and dry["would_create"] == 6
    assert node.get("/v1/jobs/rollup/runs")[1]["runs"] == []  # a dry run changes nothing

    # The job's overlap policy would skip all but the first; the request runs them all.
    result = schedctl(node.url, "--json", "backfill", "rollup", "--start", _iso(start), "--end", _iso(end),
                      "--overlap", "allow")
    assert result.returncode == 0, result.stderr
    done = json.loads(result.stdout)
    assert done["created"] == 6 and all(o["state"] == "queued" for o in done["occurrences"])
    tasks: list[dict] = []

    def polled() -> bool:  # released a little apart, as a catch-up is
        tasks.extend(node.post("/v1/tasks/poll", {"worker_id": "w", "queues": ["q"], "wait_s": 1,
                                                  "max_tasks": 10})[1]["tasks"])
        return len(tasks) >= 6

    wait_until(polled, 15, "the six backfilled runs leased")
    assert sorted(t["idempotency_key"] for t in tasks) == [f"rollup:{t}" for t in wanted]  # late, not skipped

    again = schedctl(node.url, "backfill", "rollup", "--start", _iso(start), "--end", _iso(end))
    assert again.returncode == 0 and "created 0 runs; 6 occurrences already had one" in again.stdout

    status, err = node.post("/v1/jobs/rollup/backfill", {"start": _iso(end), "end": _iso(start)})
    assert status == 400 and "must be after start" in err["error"]["message"]
    status, err = node.post("/v1/jobs/rollup/backfill", {"start": _iso(start), "end": _iso(now + timedelta(hours=1))})
    assert status == 400 and "in the future" in err["error"]["message"]
    status, err = node.post("/v1/jobs/rollup/backfill", {"start": _iso(now - timedelta(days=1)), "end": _iso(now)})
    assert status == 400 and "backfill_occurrences_max (1000)" in err["error"]["message"]
