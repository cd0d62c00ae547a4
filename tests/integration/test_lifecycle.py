"""Job lifecycle and run management over HTTP on a real node."""
from __future__ import annotations

import json
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest

from tests.integration.harness import http, wait_until

pytestmark = pytest.mark.integration


def _iso(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _post_with_key(url: str, body: dict, key: str) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Idempotency-Key": key})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_idempotency_key_header(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    body = {"schedule": {"every": "1h"}, "payload": {"charge": 10}}
    status, first = _post_with_key(node.url + "/v1/jobs", body, "order-42")
    assert status == 201
    status, again = _post_with_key(node.url + "/v1/jobs", body, "order-42")
    assert status == 200 and again["job_id"] == first["job_id"]
    status, err = _post_with_key(node.url + "/v1/jobs", dict(body, payload={"charge": 11}), "order-42")
    assert status == 409 and err["error"]["code"] == "conflict"
    status, via_field = node.post("/v1/jobs", dict(body, idempotency_key="order-42"))
    assert status == 200 and via_field["job_id"] == first["job_id"]
    assert len(node.get("/v1/jobs")[1]["jobs"]) == 1


def test_pause_resume_update_trigger_cancel(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    status, job = node.post("/v1/jobs", {"job_id": "rep", "schedule": {"cron": "0 3 * * *", "timezone": "UTC"},
                                         "queue": "q", "overlap_policy": "skip", "jitter_s": 30})
    assert status == 201 and job["overlap_policy"] == "skip" and job["jitter_s"] == 30
    status, paused = node.post("/v1/jobs/rep/pause", {})
    assert status == 200 and paused["state"] == "paused" and paused["next_fire_time"] is None
    status, resumed = node.post("/v1/jobs/rep/resume", {})
    assert status == 200 and resumed["state"] == "scheduled" and resumed["next_fire_time"].endswith("T03:00:00Z")

    status, updated = http("PATCH", node.url + "/v1/jobs/rep", {"schedule": {"every": "1h"}, "priority": 7})
    assert status == 200 and updated["priority"] == 7 and updated["schedule"] == {"every": "1h"}
    status, b1 = http("PATCH", node.url + "/v1/jobs/rep", {"backoff": {"factor": 3}})
    status, b2 = http("PATCH", node.url + "/v1/jobs/rep", {"backoff": {"base_ms": 500}})
    assert status == 200 and b2["backoff"] == {"base_ms": 500, "factor": 3.0, "max_ms": 300000}
    status, err = http("PATCH", node.url + "/v1/jobs/rep", {"backoff": {"max_ms": 100}, "priority": 1})
    assert status == 400 and "backoff.max_ms (100) must be at least backoff.base_ms (500)" in err["error"]["message"]
    assert node.get("/v1/jobs/rep")[1]["priority"] == 7
    status, err = http("PATCH", node.url + "/v1/jobs/rep", {"job_id": "other"})
    assert status == 400 and "job_id" in err["error"]["message"]
    status, err = http("PATCH", node.url + "/v1/jobs/rep", {"starting_deadline_s": 30})  # the job's jitter_s is 30
    assert status == 400 and "jitter_s (30) must be less than starting_deadline_s (30)" in err["error"]["message"]
    assert node.get("/v1/jobs/rep")[1]["starting_deadline_s"] is None

    status, trig = node.post("/v1/jobs/rep/trigger", {})
    assert status == 201 and trig["run"]["trigger"] is True and trig["run"]["state"] == "queued"
    status, body = node.post("/v1/tasks/poll", {"worker_id": "w", "queues": ["q"], "wait_s": 5})
    (task,) = body["tasks"]
    assert task["idempotency_key"] == f"rep:{trig['run']['scheduled_time']}"

    status, cancelled = http("DELETE", node.url + "/v1/jobs/rep")
    assert status == 200 and cancelled["state"] == "cancelled"
    assert node.post("/v1/jobs/rep/pause", {})[0] == 409
    assert node.post("/v1/jobs/rep/trigger", {})[0] == 409
    assert node.post("/v1/jobs/nope/resume", {})[0] == 404


def test_pause_and_patch_just_before_a_claimed_occurrence_still_act_on_it(make_cluster) -> None:
    """The node claims occurrences lookahead_s (12 s) early; a pause or a PATCH sent in that
    window must still stop or change the occurrence, as it would a minute before."""
    node = make_cluster(1).nodes[0]
    due = datetime.now(timezone.utc) + timedelta(seconds=3.5)
    assert node.post("/v1/jobs", {"job_id": "soon", "schedule": {"at": _iso(due)}, "queue": "q"})[0] == 201
    wait_until(lambda: node.get("/v1/jobs/soon/runs")[1]["runs"], 3, "the occurrence claimed ahead")
    status, patched = http("PATCH", node.url + "/v1/jobs/soon", {"queue": "q2"})
    status, paused = node.post("/v1/jobs/soon/pause", {})
    assert datetime.now(timezone.utc) < due, "too slow: the occurrence came due before the pause answered"
    assert patched["state"] == "scheduled" and status == 200 and paused["state"] == "paused"
    assert node.get("/v1/jobs/soon/runs")[1]["runs"] == []
    status, resumed = node.post("/v1/jobs/soon/resume", {})
    assert resumed["state"] == "scheduled"
    status, body = node.post("/v1/tasks/poll", {"worker_id": "w", "queues": ["q2"], "wait_s": 8})
    (task,) = body["tasks"]
    assert task["scheduled_time"] == _iso(due).replace("+00:00", "Z")


def test_overlap_skip_counts_a_run_done_before_the_next_occurrence_as_done(make_cluster) -> None:
    """The next occurrence comes within lookahead_s while the first run is still open: the
    overlap rule must look at the occurrence's time, when that run has finished."""
    node = make_cluster(1).nodes[0]
    assert node.post("/v1/jobs", {"job_id": "tick", "schedule": {"every": "3s"}, "queue": "q",
                                  "overlap_policy": "skip"})[0] == 201
    status, body = node.post("/v1/tasks/poll", {"worker_id": "w", "queues": ["q"], "wait_s": 8})
    (first,) = body["tasks"]
    assert node.post(f"/v1/tasks/{first['run_id']}/ack", {"worker_id": "w", "fence": first["fence"]})[0] == 200
    status, body = node.post("/v1/tasks/poll", {"worker_id": "w", "queues": ["q"], "wait_s": 8})
    (second,) = body["tasks"]
    runs = node.get("/v1/jobs/tick/runs")[1]["runs"]
    assert [r["reason"] for r in runs if r["state"] == "skipped"] == []
    assert second["run_id"] != first["run_id"]


def test_dead_letter_list_and_redrive(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    at = _iso(datetime.now(timezone.utc) - timedelta(seconds=1))
    assert node.post("/v1/jobs", {"job_id": "fragile", "schedule": {"at": at}, "queue": "q",
                                  "max_attempts": 1})[0] == 201
    status, body = node.post("/v1/tasks/poll", {"worker_id": "w", "queues": ["q"], "wait_s": 5})
    (task,) = body["tasks"]
    status, nacked = node.post(f"/v1/tasks/{task['run_id']}/nack",
                               {"worker_id": "w", "fence": task["fence"], "error": "boom"})
    assert nacked["run"]["state"] == "dead_letter" and nacked["run"]["reason"] == "max_attempts"
    status, dead = node.get("/v1/dead-letter")
    assert status == 200 and [r["run_id"] for r in dead["runs"]] == [task["run_id"]]
    status, redriven = node.post(f"/v1/runs/{task['run_id']}/retry", {})
    assert status == 200 and redriven["run"]["state"] == "queued"
    assert node.get("/v1/dead-letter")[1]["runs"] == []
    assert node.post(f"/v1/runs/{task['run_id']}/retry", {})[0] == 409
    status, body = node.post("/v1/tasks/poll", {"worker_id": "w", "queues": ["q"], "wait_s": 5})
    (again,) = body["tasks"]
    assert again["run_id"] == task["run_id"] and again["attempt"] == 2
    assert again["idempotency_key"] == task["idempotency_key"]


def test_missed_occurrences_after_a_full_outage(make_cluster) -> None:
    cluster = make_cluster(1)
    node = cluster.nodes[0]
    assert node.post("/v1/jobs", {"job_id": "tick", "schedule": {"every": "1s"}, "queue": "q",
                                  "misfire_policy": "fire_once"})[0] == 201
    node.kill9()
    down = datetime.now(timezone.utc)
    wait_until(lambda: datetime.now(timezone.utc) - down > timedelta(seconds=8), 12, "an outage of 8 s")
    node.start()
    cluster.wait_ready(node)

    def skipped_and_one_run():
        runs = node.get("/v1/jobs/tick/runs?limit=1000")[1]["runs"]
        reasons = {r.get("reason") for r in runs if r["state"] == "skipped"}
        return "misfire_skip" in reasons and any(r["state"] == "queued" for r in runs)
    wait_until(skipped_and_one_run, 15, "missed occurrences recorded as skipped and one run queued")
