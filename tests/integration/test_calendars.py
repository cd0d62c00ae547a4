"""Holiday calendars through a real node: PUT, GET, list and DELETE (refused while a job
names the calendar), a job whose occurrences on a listed day are skipped with reason
calendar, a calendar changed taking effect from the next claim, the preview, and schedctl."""
from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests.integration.harness import ROOT, http, wait_until

pytestmark = pytest.mark.integration


def _days_around_today() -> dict[str, str]:
    """Yesterday to tomorrow (UTC): today's every-second occurrences fall in it even across midnight."""
    today = datetime.now(timezone.utc).date()
    return {"from": (today - timedelta(days=1)).isoformat(), "to": (today + timedelta(days=1)).isoformat()}


def _runs(node: Any, job_id: str) -> list[dict[str, Any]]:
    status, body = node.get(f"/v1/jobs/{job_id}/runs?limit=1000")
    assert status == 200, body
    return body["runs"]


def test_a_calendar_skips_the_occurrences_on_its_days(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    put = lambda name, body: http("PUT", f"{node.url}/v1/calendars/{name}", body)  # noqa: E731
    status, body = put("hol", {"timezone": "UTC", "dates": [_days_around_today(), "2030-12-25"]})
    assert status == 201, body
    assert body["dates"] == [_days_around_today(), {"from": "2030-12-25", "to": "2030-12-25"}]
    assert put("hol", {"timezone": "Mars/Olympus", "dates": []})[0] == 400
    status, body = put("bad", {"dates": ["2030-02-30"]})
    assert status == 400 and "not a date" in body["error"]["message"]
    # A job naming a calendar that does not exist is refused, naming it.
    status, body = node.post("/v1/jobs", {"job_id": "x", "schedule": {"every": "1s"}, "skip_calendar": "nope"})
    assert status == 400 and "'nope'" in body["error"]["message"]

    status, job = node.post("/v1/jobs", {"job_id": "tick", "schedule": {"every": "1s"}, "queue": "none",
                                         "skip_calendar": "hol"})
    assert status == 201 and job["skip_calendar"] == "hol", job
    wait_until(lambda: len(_runs(node, "tick")) >= 3, 15, "three occurrences claimed")
    runs = _runs(node, "tick")
    assert {(r["state"], r["reason"]) for r in runs} == {("skipped", "calendar")}, runs
    preview = node.get("/v1/jobs/tick/preview?n=3")[1]
    assert all(o.get("skipped") == "calendar" for o in preview["occurrences"]), preview
    # Explained ahead of its time (past the 12 s lookahead, so not claimed yet): it will be skipped.
    coming = node.get("/v1/jobs/tick/preview?n=30")[1]["occurrences"][-1]["scheduled_time"]
    explained = node.get(f"/v1/jobs/tick/occurrences/{coming}")[1]
    assert explained["verdict"] == "not_yet_due" and explained["skip_calendar"] == "hol", explained
    status, body = node.get("/v1/calendars/hol")
    assert status == 200 and body["used_by"] == ["tick"], body

    # In use: the delete is refused, naming the job.
    status, body = http("DELETE", f"{node.url}/v1/calendars/hol")
    assert status == 409 and "'tick'" in body["error"]["message"], body

    # The calendar no longer lists today: from the next claim on, the occurrences run.
    assert put("hol", {"timezone": "UTC", "dates": ["2030-12-25"]})[0] == 200
    wait_until(lambda: any(r["state"] == "queued" for r in _runs(node, "tick")), 20, "an occurrence queued")
    runs = sorted(_runs(node, "tick"), key=lambda r: r["scheduled_time"])
    first_queued = next(i for i, r in enumerate(runs) if r["state"] == "queued")
    assert all(r["reason"] == "calendar" for r in runs[:first_queued])
    assert all(r["state"] == "queued" for r in runs[first_queued:])  # never skipped again

    assert node.post("/v1/jobs/tick/pause", {})[0] == 200
    assert http("DELETE", f"{node.url}/v1/calendars/hol")[0] == 409  # a paused job still names it
    status, _ = http("DELETE", f"{node.url}/v1/jobs/tick")
    assert status == 200
    status, body = http("DELETE", f"{node.url}/v1/calendars/hol")
    assert status == 200 and body == {"name": "hol", "deleted": True}
    assert node.get("/v1/calendars/hol")[0] == 404
    assert node.get("/v1/calendars")[1] == {"calendars": []}


def _schedctl(server: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedulerd.cli.main", "--server", server, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_schedctl_calendar(make_cluster, tmp_path) -> None:
    node = make_cluster(1).nodes[0]
    out = _schedctl(node.url, "calendar", "set", "holidays-de", "--timezone", "Europe/Berlin",
                    "--date", "2026-10-03", "--range", "2026-12-24:2026-12-26", "--date", "2026-12-27")
    assert out.returncode == 0, out.stderr
    assert "2026-10-03, 2026-12-24:2026-12-27" in out.stdout and "Europe/Berlin" in out.stdout
    path = tmp_path / "us.yaml"
    path.write_text("timezone: America/New_York\ndates:\n  - 2026-07-04\n  - {from: 2026-11-26, to: 2026-11-27}\n")
    out = _schedctl(node.url, "calendar", "set", "holidays-us", "-f", str(path))
    assert out.returncode == 0, out.stderr
    out = _schedctl(node.url, "calendar", "list")
    assert out.returncode == 0 and "holidays-de" in out.stdout and "holidays-us" in out.stdout, out
    out = _schedctl(node.url, "create", "--id", "nightly", "--cron", "0 2 * * *", "--queue", "q",
                    "--skip-calendar", "holidays-de")
    assert out.returncode == 0, out.stderr
    out = _schedctl(node.url, "calendar", "get", "holidays-de")
    assert out.returncode == 0 and "nightly" in out.stdout, out
    out = _schedctl(node.url, "calendar", "delete", "holidays-de")
    assert out.returncode != 0 and "nightly" in out.stderr, out
    out = _schedctl(node.url, "calendar", "delete", "holidays-us")
    assert out.returncode == 0 and "calendar holidays-us deleted" in out.stdout, out
