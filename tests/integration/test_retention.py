"""Purge and discard on a real node: a finished job goes with its history and its id
and idempotency key can be used again; a worker still holding a run of the purged job
hears 404 for it; a dead letter leaves the list and the gauge."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from datetime import datetime, timezone

import pytest

from schedulerd import archive
from schedulerd.errors import NotFound
from schedulerd.sdk.client import Client
from schedulerd.storage import ops
from tests.integration.harness import ROOT, Cluster, http, recording_worker, running, wait_until

pytestmark = pytest.mark.integration


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def schedctl(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedulerd.cli.main", "--server", url, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def dead_letter_gauge(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    line = next(x for x in text.splitlines() if x.startswith('schedulerd_runs{state="dead_letter"}'))
    return float(line.split()[-1])


def test_purge_frees_the_id_and_the_key_and_refuses_the_old_lease(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    client = Client(node.url)
    job = {"job_id": "report", "schedule": {"at": now_iso()}, "queue": "q", "idempotency_key": "report-2026-12"}
    assert node.post("/v1/jobs", job)[0] == 201
    status, polled = node.post("/v1/tasks/poll", {"worker_id": "w", "queues": ["q"], "wait_s": 5})
    (task,) = polled["tasks"]
    # A purge refuses while the run is still running: the cancel lands, the purge waits.
    status, body = http("DELETE", node.url + "/v1/jobs/report?purge=true")
    assert status == 409 and "1 running" in body["error"]["message"]
    assert node.get("/v1/jobs/report")[1]["state"] == "cancelled"
    assert node.post(f"/v1/tasks/{task['run_id']}/nack", {"worker_id": "w", "fence": task["fence"],
                                                          "error": "gave up"})[0] == 200
    assert client.cancel_job("report", purge=True) == {"job_id": "report", "purged": True, "deleted_runs": 1}
    assert node.get("/v1/jobs/report")[0] == 404 and node.get(f"/v1/runs/{task['run_id']}")[0] == 404

    status, again = node.post("/v1/jobs", {**job, "schedule": {"every": "1h"}})
    assert status == 201 and again["job_id"] == "report", "the id and the key are free again"
    status, body = node.post(f"/v1/tasks/{task['run_id']}/ack", {"worker_id": "w", "fence": task["fence"]})
    assert status == 404 and body["error"]["code"] == "not_found"
    assert node.get("/v1/jobs/report")[1]["state"] == "scheduled"
    assert http("DELETE", node.url + "/v1/jobs/report?purge=maybe")[0] == 400
    with pytest.raises(NotFound):
        client.cancel_job("nothing-here", purge=True)


def test_a_dead_letter_is_discarded_through_the_api_and_schedctl(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    for job_id in ("a", "b"):
        assert node.post("/v1/jobs", {"job_id": job_id, "schedule": {"at": now_iso()}, "queue": "q",
                                      "max_attempts": 1})[0] == 201
    dead = []
    while len(dead) < 2:
        status, polled = node.post("/v1/tasks/poll", {"worker_id": "w", "queues": ["q"], "wait_s": 5})
        for task in polled["tasks"]:
            node.post(f"/v1/tasks/{task['run_id']}/nack", {"worker_id": "w", "fence": task["fence"], "error": "no"})
            dead.append(task["run_id"])
    wait_until(lambda: dead_letter_gauge(node.url) == 2, 10, "two dead letters in the gauge")
    status, body = http("DELETE", f"{node.url}/v1/runs/{dead[0]}")
    assert status == 200 and body["discarded"] and body["run"]["state"] == "dead_letter"
    out = schedctl(node.url, "--json", "dead-letter", "discard", dead[1])
    assert out.returncode == 0 and json.loads(out.stdout)["run_id"] == dead[1], out.stderr
    assert node.get("/v1/dead-letter")[1]["runs"] == []
    wait_until(lambda: dead_letter_gauge(node.url) == 0, 10, "the dead-letter gauge to empty")
    out = schedctl(node.url, "dead-letter", "discard", dead[1])
    assert out.returncode != 0 and "not_found" in out.stderr
    out = schedctl(node.url, "cancel", "a", "--purge")
    assert out.returncode == 0 and "purged" in out.stdout, out.stderr


JOBS = 100
# 5 s: every job has run before the first is swept, even on a loaded box, so the count
# the test watches falls from 100; 20 keys a second leaves seconds to kill the leader mid-sweep.
SWEEP_ARGS = ["--finished-ttl", "5s", "--limit", "sweep_batch_max=10", "--limit", "sweep_keys_per_s_max=20"]


def test_the_sweep_archives_before_it_deletes_even_across_a_leader_kill(tmp_path) -> None:
    """Three nodes, each with its own --archive-dir; 100 one-offs run and finish; the sweep
    (10 keys an entry, 20 a second) is cut by kill -9 of the leader. Every job and run that
    left the stores is in some node's archive, and the stores end equal."""
    cluster = Cluster.create(str(tmp_path), 3, SWEEP_ARGS)
    archives = [tmp_path / f"archive-{i}" for i in range(3)]
    for node, folder in zip(cluster.nodes, archives):
        node.extra_args += ["--archive-dir", str(folder)]
    cluster.start()
    try:
        # A new cluster writes the floor entry version until its leader has heard every voter,
        # and a job created at it carries no TTL (docs/operations.md, "Retention").
        wait_until(lambda: all(n.get("/v1/cluster")[1]["groups"][0]["entry_version"] >= ops.RETENTION_SINCE
                               for n in cluster.nodes), 10, "every node to write the retention entry version")
        client = Client(cluster.urls, timeout_s=20)
        client.create_jobs([{"job_id": f"j{i}", "schedule": {"at": now_iso()}, "queue": "work"} for i in range(JOBS)])
        worker, executions = recording_worker(cluster.urls, "work")
        with running(worker):
            wait_until(lambda: len({t.run_id for t in executions}) >= JOBS, 30, "every job to run")
        run_ids = {t.run_id for t in executions}
        leader = cluster.leader()
        remaining = wait_until(lambda: [n for n in [len(leader.get("/v1/jobs?limit=1000")[1]["jobs"])] if n < JOBS],
                               30, "the sweep to start")[0]
        leader.kill9()
        assert remaining > 0, "the sweep was over before the kill"
        survivors = [n for n in cluster.nodes if n is not leader]
        wait_until(lambda: all(n.get("/v1/jobs")[1]["jobs"] == [] for n in survivors), 60,
                   "every finished job to be swept", interval_s=0.5)
        leader.start()
        cluster.wait_ready(leader)
        cluster.wait_converged()
        digests = {n.get("/v1/cluster/digest")[1]["groups"][0]["digest"] for n in cluster.nodes}
        assert len(digests) == 1, "the stores differ after the sweep"
        archived_runs: set[str] = set()
        archived_jobs: set[str] = set()
        for path in (p for folder in archives for p in folder.rglob("*" + archive.ARCHIVE_SUFFIX)):
            for record in archive.read(str(path)):
                (archived_runs if record["kind"] == "run" else archived_jobs).add(
                    record["run_id"] if record["kind"] == "run" else record["job_id"])
        assert run_ids <= archived_runs, f"deleted without an archive: {sorted(run_ids - archived_runs)[:5]}"
        assert {f"j{i}" for i in range(JOBS)} <= archived_jobs
    finally:
        cluster.stop()
