"""GET /v1/jobs/{id}/occurrences/{time} and `schedctl explain` on one real node: an
occurrence that ran, one skipped, an instant between occurrences, one to come, one
outside the schedule's bounds, one inside a pause; namespaces and bad input."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from schedulerd.errors import NotFound
from schedulerd.sdk.client import Client
from tests.integration.harness import recording_worker, running, wait_until

pytestmark = pytest.mark.integration


def _iso(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def schedctl(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedulerd.cli.main", "--server", url, *args],
                          capture_output=True, text=True, timeout=60)


def test_each_kind_of_instant_gets_its_verdict(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    now = datetime.now(timezone.utc).replace(microsecond=0)
    # A one-off due now, claimed by its create and run by a worker; one missed long ago, skipped.
    ran_at, missed_at = _iso(now), _iso(now - timedelta(minutes=10))
    assert node.post("/v1/jobs", {"job_id": "once", "schedule": {"at": ran_at}, "queue": "q"})[0] == 201
    assert node.post("/v1/jobs", {"job_id": "late", "schedule": {"at": missed_at}, "queue": "q",
                                  "misfire_policy": "skip"})[0] == 201
    worker, _ = recording_worker([node.url], "q")
    with running(worker):
        wait_until(lambda: node.get("/v1/jobs/once/runs")[1]["runs"][0]["state"] == "succeeded", 15,
                   "the one-off's run to succeed")
    status, ran = node.get(f"/v1/jobs/once/occurrences/{ran_at}")
    assert status == 200, ran
    assert (ran["verdict"], ran["state"], ran["attempt"]) == ("ran", "succeeded", 1) and ran["finished_at"]
    assert ran["explanation"].startswith(f"It ran: run {ran['run_id']} succeeded at ")
    # A missed occurrence is left to the leader's next scan, which records it skipped.
    skipped = wait_until(lambda: (lambda doc: doc if doc["verdict"] != "awaiting_claim" else None)(
        node.get(f"/v1/jobs/late/occurrences/{missed_at}")[1]), 10, "the missed one-off's claim")
    assert (skipped["verdict"], skipped["reason"]) == ("skipped", "misfire_skip"), skipped

    # A daily cron in Berlin, bounded to 2030: 02:00 there is 01:00Z in January.
    schedule = {"cron": "0 2 * * *", "timezone": "Europe/Berlin", "start_at": "2030-01-01T00:00:00Z",
                "end_at": "2030-12-31T23:59:59Z"}
    assert node.post("/v1/jobs", {"job_id": "nightly", "schedule": schedule})[0] == 201
    between = node.get("/v1/jobs/nightly/occurrences/2030-01-10T00:30:00Z")[1]
    assert (between["verdict"], between["previous_occurrence"], between["next_occurrence"]) == (
        "not_an_occurrence", "2030-01-09T01:00:00Z", "2030-01-10T01:00:00Z"), between
    to_come = node.get("/v1/jobs/nightly/occurrences/2030-01-10T02:00:00+01:00")[1]  # the same instant, raw '+'
    assert (to_come["verdict"], to_come["time"]) == ("not_yet_due", "2030-01-10T01:00:00Z"), to_come
    outside = node.get("/v1/jobs/nightly/occurrences/2031-01-05T01:00:00Z")[1]
    assert (outside["verdict"], outside["bound"], outside["end_at"]) == (
        "excluded_by_bounds", "end_at", "2030-12-31T23:59:59Z"), outside

    assert node.post("/v1/jobs/nightly/pause", {})[0] == 200
    paused = node.get("/v1/jobs/nightly/occurrences/2030-01-10T01:00:00Z")[1]
    assert (paused["verdict"], paused["job_state"]) == ("job_paused", "paused"), paused


def test_namespaces_errors_and_the_cli(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    payments = Client(node.url, namespace="payments")
    payments.create_job({"job_id": "nightly", "schedule": {"cron": "0 2 * * *", "timezone": "Europe/Berlin"}})
    answer = payments.explain_occurrence("nightly", "2030-01-10T02:00:00+01:00")  # sent as %2B
    assert (answer["job_id"], answer["verdict"]) == ("nightly", "not_yet_due")
    with pytest.raises(NotFound):  # the default namespace has no such job
        Client(node.url).explain_occurrence("nightly", "2030-01-10T01:00:00Z")
    status, body = node.get("/v1/jobs/nightly/occurrences/2030-01-10T01:00:00")  # no zone: refused first
    assert (status, body["error"]["code"]) == (400, "invalid_request")
    assert "is not an ISO 8601 instant from 1970-01-01T00:00:00Z" in body["error"]["message"]

    text = schedctl(node.url, "-n", "payments", "explain", "nightly", "2030-01-10T00:30:00Z")
    assert text.returncode == 0, text.stderr
    first, blank, *fields = text.stdout.splitlines()
    assert first.startswith("It is not an occurrence of the job's schedule (cron 0 2 * * * in Europe/Berlin)")
    assert blank == "" and ["verdict:", "not_an_occurrence"] in [line.split() for line in fields], text.stdout
    doc = json.loads(schedctl(node.url, "-n", "payments", "--json", "explain", "nightly",
                              "2030-01-10T00:30:00Z").stdout)
    assert doc["next_occurrence"] == "2030-01-10T01:00:00Z"
    refused = schedctl(node.url, "explain", "nightly", "yesterday")
    assert refused.returncode == 1 and refused.stderr.startswith("error: invalid_request: time 'yesterday'")
