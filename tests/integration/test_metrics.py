"""GET /metrics on a real node: what an operator's dashboard and alerts read."""
from __future__ import annotations

import urllib.request
from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families

from schedulerd.sdk.worker import Task, Worker
from tests.integration.harness import running, wait_until

pytestmark = pytest.mark.integration


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_follow_jobs_runs_queues_raft_and_http(make_cluster) -> None:
    cluster = make_cluster(1)
    node = cluster.nodes[0]
    soon = (datetime.now(timezone.utc) + timedelta(seconds=1)).isoformat()
    for job_id in ("ok", "bad"):
        status, _ = node.post("/v1/jobs", {"job_id": job_id, "schedule": {"at": soon}, "queue": "work",
                                           "max_attempts": 1})
        assert status == 201
    assert node.post("/v1/jobs", {"job_id": "later", "schedule": {"cron": "0 3 * * *"}})[0] == 201
    assert node.post("/v1/jobs/later/pause", {})[0] == 200
    assert node.post("/v1/jobs", {"job_id": "nobody-polls", "schedule": {"at": soon}, "queue": "idle"})[0] == 201

    worker = Worker([node.url], concurrency=2, wait_s=1)

    @worker.handler("work")
    def work(task: Task) -> str:
        if task.job_id == "bad":
            raise RuntimeError("boom")
        return "done"

    with running(worker):
        wait_until(lambda: worker.stats.acked == 1 and worker.stats.nacked == 1, 20, "one ack and one nack")

    samples = wait_until(lambda: (lambda s: s if value(s, "schedulerd_queue_ready", queue="idle") == 1 else None)(
        scrape(node.url)), 10, "the unpolled run in the idle queue")
    assert value(samples, "schedulerd_jobs", state="completed") == 3
    assert value(samples, "schedulerd_jobs", state="paused") == 1
    assert value(samples, "schedulerd_runs", state="dead_letter") == 1
    assert value(samples, "schedulerd_run_events_total", event="claimed") == 3
    assert value(samples, "schedulerd_run_events_total", event="leased") == 2
    assert value(samples, "schedulerd_run_events_total", event="acked") == 1
    assert value(samples, "schedulerd_run_events_total", event="nacked") == 1
    assert value(samples, "schedulerd_run_events_total", event="dead_lettered") == 1
    assert value(samples, "schedulerd_dispatch_lateness_seconds_count", queue="work") == 2
    assert value(samples, "schedulerd_dispatch_lateness_seconds_bucket", queue="work", le="+Inf") == 2
    assert value(samples, "schedulerd_queue_oldest_ready_age_seconds", queue="idle") > 0
    assert value(samples, "schedulerd_overdue_jobs") == 0
    assert value(samples, "schedulerd_raft_is_leader", group="0") == 1
    assert value(samples, "schedulerd_raft_has_quorum", group="0") == 1
    assert value(samples, "schedulerd_raft_applied_index", group="0") > 0
    assert value(samples, "schedulerd_raft_leader_changes_total", group="0") >= 1
    assert value(samples, "schedulerd_raft_journal_fsync_seconds_count", group="0") > 0
    assert value(samples, "schedulerd_http_request_duration_seconds_count",
                 method="POST", route="/v1/jobs", status="201") == 4
    assert value(samples, "schedulerd_http_request_duration_seconds_count",
                 method="POST", route="/v1/tasks/{run_id}/nack", status="200") == 1
    assert value(samples, "schedulerd_metrics_scan_truncated") == 0
    # The node registers once its metadata group has elected itself: wait for that, not for luck.
    samples = wait_until(lambda: (lambda s: s if value(s, "schedulerd_nodes", state="alive") == 1 else None)(
        scrape(node.url)), 15, "the node in the registry")
    assert value(samples, "schedulerd_groups_under_replicated") == 0
    assert value(samples, "schedulerd_leader_imbalance") == 0
    assert value(samples, "schedulerd_placement_moves_total", outcome="done") == 0


def test_queue_figures_count_each_run_once_across_a_cluster(make_cluster) -> None:
    """Summed over every node, a queue's ready and running runs are the cluster's own count,
    not once per replica: only a group's leader exports its figures (docs/autoscaling.md)."""
    cluster = make_cluster(3, groups=3)
    node = cluster.nodes[0]
    past = (datetime.now(timezone.utc) - timedelta(seconds=1)).isoformat()
    jobs = [{"job_id": f"j{i}", "schedule": {"at": past}, "queue": "scale"} for i in range(9)]
    status, body = node.post("/v1/jobs:batch", {"jobs": jobs})
    assert status == 200, body
    status, polled = node.post("/v1/tasks/poll", {"worker_id": "w", "queues": ["scale"], "max_tasks": 2,
                                                  "wait_s": 5})
    assert status == 200 and polled["tasks"]
    leased = len(polled["tasks"])

    def summed() -> tuple[float, float] | None:
        scrapes = [scrape(n.url) for n in cluster.nodes]
        ready = sum(value(s, "schedulerd_queue_ready", queue="scale") for s in scrapes)
        running = sum(value(s, "schedulerd_queue_running", queue="scale") for s in scrapes)
        return (ready, running) if ready + running == 9 else None

    assert wait_until(summed, 15, "the nine runs counted once across the nodes") == (9 - leased, leased)
