"""One real node: jobs created over HTTP run through the worker SDK and show in history."""
from __future__ import annotations

import json
import signal
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest

from schedulerd.sdk.client import Client
from schedulerd.sdk.worker import Task, Worker
from tests.integration.harness import http, wait_until

pytestmark = pytest.mark.integration


def _iso(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def test_one_off_and_cron_jobs_run_via_the_sdk(make_cluster) -> None:
    cluster = make_cluster(1)
    node = cluster.nodes[0]
    seen: list[Task] = []
    lock = threading.Lock()

    worker = Worker(servers=cluster.urls, concurrency=4, wait_s=2)

    @worker.handler("reports")
    def handle(task: Task) -> dict:
        with lock:
            seen.append(task)
        return {"handled": task.idempotency_key}

    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        at = datetime.now(timezone.utc) + timedelta(seconds=1)
        status, once = node.post("/v1/jobs", {"job_id": "once", "schedule": {"at": _iso(at)},
                                             "queue": "reports", "payload": {"n": 1}})
        assert status == 201, once
        assert once["state"] == "scheduled" and once["next_fire_time"] is not None
        status, tick = node.post("/v1/jobs", {"job_id": "tick", "schedule": {"cron": "*/1 * * * * *"},
                                             "queue": "reports", "payload": {"n": 2}})
        assert status == 201, tick

        wait_until(lambda: any(t.job_id == "once" for t in seen) and
                   sum(t.job_id == "tick" for t in seen) >= 3, 20, "the one-off and three cron runs")
    finally:
        worker.stop()
        thread.join(15)

    once_task = next(t for t in seen if t.job_id == "once")
    assert once_task.payload == {"n": 1} and once_task.attempt == 1
    assert once_task.idempotency_key == f"once:{once['next_fire_time']}"
    assert once_task.scheduled_time >= at.replace(microsecond=at.microsecond) - timedelta(milliseconds=1)

    status, runs = node.get("/v1/jobs/once/runs")
    assert status == 200
    assert [(r["state"], r["attempt"]) for r in runs["runs"]] == [("succeeded", 1)]
    assert runs["runs"][0]["result"] == {"handled": once_task.idempotency_key}
    assert node.get("/v1/jobs/once")[1]["state"] == "completed"

    status, cron_runs = node.get("/v1/jobs/tick/runs")
    succeeded = [r for r in cron_runs["runs"] if r["state"] == "succeeded"]
    assert len(succeeded) >= 3
    times = [r["scheduled_time"] for r in cron_runs["runs"]]
    assert len(times) == len(set(times)), "one run per occurrence"
    assert all(t.endswith("Z") and "." not in t for t in times), "cron fires on whole seconds"

    # The job view says what ran last and when it last succeeded, as a CronJob's status does.
    once_view = node.get("/v1/jobs/once")[1]
    assert once_view["last_run"] == {"run_id": runs["runs"][0]["run_id"], "scheduled_time": once["next_fire_time"],
                                     "state": "succeeded"}
    assert once_view["last_success_time"] == runs["runs"][0]["finished_at"]
    tick_view = node.get("/v1/jobs/tick")[1]
    assert tick_view["last_run"]["scheduled_time"] <= tick_view["next_fire_time"]
    assert tick_view["last_success_time"] is not None
    status, preview = node.get("/v1/jobs/tick/preview?n=3")
    assert status == 200 and preview["job_id"] == "tick" and preview["state"] == "scheduled"
    starts = [o["scheduled_time"] for o in preview["occurrences"]]
    assert len(starts) == 3 and starts == sorted(set(starts)) and starts[0] > tick_view["last_run"]["scheduled_time"]
    assert all(o["start_time"] == o["scheduled_time"] for o in preview["occurrences"])  # no jitter

    status, cancelled = http("DELETE", node.url + "/v1/jobs/tick")
    assert status == 200 and cancelled["state"] == "cancelled" and cancelled["next_fire_time"] is None

    # A shorthand is accepted; a fixed-offset zone named for a region's local time is warned about.
    status, daily = node.post("/v1/jobs", {"job_id": "daily", "schedule": {"cron": "@daily", "timezone": "EST"}})
    assert status == 201 and daily["next_fire_time"].endswith("T05:00:00Z")
    assert daily["warnings"] == ["timezone 'EST' is a fixed offset (UTC-05:00) with no daylight saving time; for "
                                 "New York's local time (EDT in summer) use 'America/New_York'"]
    assert "warnings" not in node.get("/v1/jobs/daily")[1]

    # Bounds and a run limit show in the job's preview and view.
    start = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=1)
    status, limited = node.post("/v1/jobs", {"job_id": "limited", "max_runs": 2, "schedule": {
        "every": "10m", "start_at": _iso(start), "end_at": _iso(start + timedelta(hours=3))}})
    assert status == 201 and (limited["max_runs"], limited["runs_remaining"]) == (2, 2)
    assert limited["next_fire_time"] == _iso(start)
    occurrences = node.get("/v1/jobs/limited/preview?n=5")[1]["occurrences"]
    assert [o["scheduled_time"] for o in occurrences] == [_iso(start), _iso(start + timedelta(minutes=10))]

    # Labels select jobs, as Kubernetes' selectors select objects; a PATCH replaces them.
    for job_id, labels in (("bill-prod", {"team": "billing", "env": "prod"}), ("bill-dev", {"team": "billing"})):
        status, made = node.post("/v1/jobs", {"job_id": job_id, "schedule": {"every": "1h"}, "labels": labels,
                                              "description": f"{job_id} report"})
        assert status == 201 and made["labels"] == labels and made["description"] == f"{job_id} report"

    def selected(selector: str) -> list[str]:
        return [j["job_id"] for j in node.get("/v1/jobs?" + urllib.parse.urlencode({"selector": selector}))[1]["jobs"]]
    assert selected("team=billing") == ["bill-dev", "bill-prod"]
    assert selected("team=billing,env!=prod") == ["bill-dev"]
    assert selected("env in (prod),team") == ["bill-prod"]
    status, patched = http("PATCH", node.url + "/v1/jobs/bill-dev", {"labels": {"team": "search"}})
    assert status == 200 and patched["labels"] == {"team": "search"} and selected("team=billing") == ["bill-prod"]
    status, refused = node.get("/v1/jobs?selector=" + urllib.parse.quote("team=bil ling"))
    assert status == 400 and "is not one of key=value" in refused["error"]["message"]

    # Runs listed by state across jobs; a page at a time, in run id order.
    succeeded = node.get("/v1/runs?state=succeeded&limit=2")[1]
    assert len(succeeded["runs"]) == 2 and all(r["state"] == "succeeded" for r in succeeded["runs"])
    more = node.get(f"/v1/runs?state=succeeded&cursor={succeeded['next_cursor']}")[1]["runs"]
    assert {r["job_id"] for r in succeeded["runs"] + more} == {"once", "tick"}
    assert node.get("/v1/runs")[0] == 400


def test_bad_input_is_a_clear_400_and_changes_nothing(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    cases = [
        ({"schedule": {"cron": "61 * * * *"}}, "invalid_job"),
        ({"schedule": {"at": "2026-01-01T00:00:00"}}, "invalid_job"),
        ({"schedule": {"every": "5 parsecs"}}, "invalid_job"),
        ({"schedule": {"cron": "* * * * *", "timezone": "Mars/Olympus"}}, "invalid_job"),
        ({"schedule": {"every": "1s"}, "max_attempts": 0}, "invalid_job"),
        ({"schedule": {"every": "1s"}, "colour": "red"}, "invalid_job"),
        ({"schedule": {"every": "1s"}, "job_id": "has space"}, "invalid_job"),
    ]
    for body, code in cases:
        status, err = node.post("/v1/jobs", body)
        assert status == 400 and err["error"]["code"] == code, (body, err)
        assert err["error"]["message"]
    status, err = node.post("/v1/jobs", {"schedule": {"every": "1s"}, "payload": "x" * 70_000})
    assert status == 413 and err["error"]["code"] == "too_large"
    status, err = node.post("/v1/tasks/poll", {"worker_id": "w", "queues": ["q"], "max_tasks": 1000})
    assert status == 400 and "lease_batch_max" in err["error"]["message"]
    status, err = node.post("/v1/tasks/poll", {"worker_id": "w", "queues": ["q"], "wait_s": 999})
    assert status == 400 and "long_poll_s_max" in err["error"]["message"]
    assert node.get("/v1/jobs")[1]["jobs"] == []
    assert node.get("/v1/jobs/nope")[0] == 404
    assert node.get("/v1/runs/0-1-0")[0] == 404


def test_stale_fence_is_409_and_expired_lease_is_redelivered(make_cluster, monkeypatch) -> None:
    node = make_cluster(1).nodes[0]
    at = _iso(datetime.now(timezone.utc))
    assert node.post("/v1/jobs", {"job_id": "j", "schedule": {"at": at}, "queue": "q"})[0] == 201
    status, body = node.post("/v1/tasks/poll", {"worker_id": "w1", "queues": ["q"], "wait_s": 5})
    assert status == 200 and len(body["tasks"]) == 1
    task = body["tasks"][0]
    # The lease is on the cluster's clock, which the answer gives: 30 s from its `now`.
    lease_s = (datetime.fromisoformat(task["lease_until"]) - datetime.fromisoformat(body["now"])).total_seconds()
    assert 29 <= lease_s <= 30
    status, err = node.post(f"/v1/tasks/{task['run_id']}/ack", {"worker_id": "w1", "fence": task["fence"] + 1})
    assert status == 409 and err["error"]["code"] == "stale_fence"
    status, err = node.post(f"/v1/tasks/{task['run_id']}/ack", {"worker_id": "w2", "fence": task["fence"]})
    assert status == 409
    status, hb = node.post(f"/v1/tasks/{task['run_id']}/heartbeat", {"worker_id": "w1", "fence": task["fence"]})
    assert status == 200 and hb["lease_until"] >= task["lease_until"] and hb["now"] >= body["now"]
    status, nacked = node.post(f"/v1/tasks/{task['run_id']}/nack",
                               {"worker_id": "w1", "fence": task["fence"], "error": "disk full"})
    assert status == 200 and nacked["run"]["state"] == "retry_wait" and nacked["run"]["error"] == "disk full"
    # A worker that never heard its nack answered sends it again: ok, and nothing changes.
    status, again = node.post(f"/v1/tasks/{task['run_id']}/nack",
                              {"worker_id": "w1", "fence": task["fence"], "error": "disk full"})
    assert status == 200 and again["run"] == nacked["run"]
    start = time.monotonic()
    status, body = node.post("/v1/tasks/poll", {"worker_id": "w1", "queues": ["q"], "wait_s": 5})
    assert status == 200 and len(body["tasks"]) == 1, body
    retry = body["tasks"][0]
    assert time.monotonic() - start > 0.5, "the retry waited out its backoff"
    assert retry["attempt"] == 2 and retry["fence"] > task["fence"]
    assert retry["idempotency_key"] == task["idempotency_key"]
    status, acked = node.post("/v1/tasks/ack", {"worker_id": "w1", "acks": [
        {"run_id": retry["run_id"], "fence": retry["fence"], "result": 42},
        {"run_id": retry["run_id"], "fence": task["fence"]},
        {"run_id": "\u00b2-1-0", "fence": 1}, {"run_id": "9" * 200 + "-1-0", "fence": 1}]})
    assert status == 200
    assert acked["results"][0]["ok"] is True and acked["results"][1]["ok"] is False
    assert [r["error"]["code"] for r in acked["results"][2:]] == ["not_found", "not_found"], "per item, as documented"
    for cursor in ("\u00b2", "18446744073709551616", "-1"):
        status, body = node.get(f"/v1/jobs/{task['job_id']}/runs?cursor={urllib.parse.quote(cursor)}")
        assert status == 400 and "next_cursor" in body["error"]["message"], (cursor, status, body)
    run = node.get(f"/v1/runs/{retry['run_id']}")[1]
    assert run["state"] == "succeeded" and run["result"] == 42 and run["attempt"] == 2
    # A worker that never heard its ack answered sends it again: ok, and the first result stands.
    status, again = node.post(f"/v1/tasks/{retry['run_id']}/ack", {"worker_id": "w1", "fence": retry["fence"]})
    assert status == 200 and again["run"]["result"] == 42
    assert node.get(f"/v1/runs/{retry['run_id']}")[1] == run


def test_a_poll_of_lease_batch_max_tasks_with_largest_payloads_stays_bounded(make_cluster) -> None:
    """500 tasks of 64 KiB payloads arrive whole in one poll, and the response is no bigger
    than lease_batch_max x (payload_bytes_max + 1 KiB): payloads go out as stored, compact."""
    node = make_cluster(1).nodes[0]
    count, payload_max = 500, 64 * 1024
    # 2,000 list items: re-encoded with json's default ", " the payload would grow 2 KB.
    payload = {"numbers": [0] * 2000, "text": "x" * (payload_max - 4050)}
    assert len(json.dumps(payload, separators=(",", ":"))) <= payload_max
    due = _iso(datetime.now(timezone.utc))
    per_request = 15  # fits request_bytes_max (1 MiB)

    def create(lo: int) -> list[bool]:
        jobs = [{"job_id": f"big-{k}", "schedule": {"at": due}, "queue": "big", "payload": payload}
                for k in range(lo, min(count, lo + per_request))]
        status, body = node.post("/v1/jobs:batch", {"jobs": jobs})
        assert status == 200, body
        return [item["ok"] for item in body["results"]]

    with ThreadPoolExecutor(4) as pool:
        created = [ok for oks in pool.map(create, range(0, count, per_request)) for ok in oks]
    assert created == [True] * count

    def all_ready() -> bool:
        queues = node.get("/v1/queues")[1]["queues"]
        return any(q["queue"] == "big" and q["ready"] == count for q in queues)

    wait_until(all_ready, 60, f"{count} runs ready")
    body = json.dumps({"worker_id": "w-big", "queues": ["big"], "max_tasks": count, "wait_s": 0}).encode()
    request = urllib.request.Request(node.url + "/v1/tasks/poll", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        raw = resp.read()
    tasks = json.loads(raw)["tasks"]
    assert len(tasks) == count and all(t["payload"] == payload for t in tasks)
    assert len(raw) <= count * (payload_max + 1024), f"{len(raw)} bytes for {count} tasks"

    acks = [{"run_id": t["run_id"], "fence": t["fence"]} for t in tasks]
    status, acked = node.post("/v1/tasks/ack", {"worker_id": "w-big", "acks": acks})
    assert status == 200 and all(r["ok"] for r in acked["results"])
    assert node.get("/v1/jobs/big-0")[1]["state"] == "completed"


def test_a_batch_create_with_prefer_return_minimal_answers_outcomes_without_views(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    later = _iso(datetime.now(timezone.utc) + timedelta(hours=1))
    assert node.post("/v1/jobs", {"job_id": "taken", "schedule": {"at": later}})[0] == 201
    jobs = [{"job_id": "m-1", "schedule": {"at": later}}, {"job_id": "taken", "schedule": {"at": later}}]
    request = urllib.request.Request(node.url + "/v1/jobs:batch", data=json.dumps({"jobs": jobs}).encode(),
                                     method="POST", headers={"Content-Type": "application/json",
                                                             "Prefer": "respond-async, return=minimal"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.headers["Preference-Applied"] == "return=minimal"
        results = json.loads(resp.read())["results"]
    assert results[0] == {"job_id": "m-1", "ok": True}
    assert results[1]["ok"] is False and results[1]["error"]["code"] == "conflict"
    assert node.get("/v1/jobs/m-1")[1]["next_fire_time"] == later

    client = Client([node.url])
    assert client.create_jobs([{"job_id": "m-2", "schedule": {"at": later}}], minimal=True) == [
        {"job_id": "m-2", "ok": True}]
    (full,) = client.create_jobs([{"job_id": "m-3", "schedule": {"at": later}}])
    assert full["ok"] and full["job"]["job_id"] == "m-3" and full["job"]["state"] == "scheduled"


def test_a_stopping_node_answers_its_waiting_polls_and_exits_promptly(make_cluster) -> None:
    """SIGTERM with a worker's long-poll waiting: the poll is answered (empty) and the node
    exits at once, instead of the HTTP server waiting out the poll's wait_s."""
    node = make_cluster(1).nodes[0]
    answers: list[tuple[int, dict]] = []
    poll = threading.Thread(target=lambda: answers.append(
        node.post("/v1/tasks/poll", {"worker_id": "w", "queues": ["idle"], "wait_s": 30})))
    poll.start()
    wait_until(lambda: node.get("/v1/cluster")[1]["poll_waiters"] == 1, 10, "the poll to wait")
    stopping = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)
    node.proc.wait(10)
    assert time.monotonic() - stopping < 5, "the node waited for the poll"
    assert node.proc.returncode == 0
    poll.join(10)
    assert [(status, body["tasks"]) for status, body in answers] == [(200, [])]
