"""Backup of a running node and restore of a whole cluster from it: what the
backup held is there, what came after is not, the log continues (fences grow),
runs the backup caught in flight are redelivered, and new jobs run."""
from __future__ import annotations

import pathlib
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from schedulerd.sdk.worker import Task, Worker
from tests.integration.harness import Cluster, running, wait_until

pytestmark = pytest.mark.integration


def schedulerd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedulerd.main", *args], capture_output=True, text=True,
                          timeout=60)


def test_a_cluster_restored_from_a_backup_has_what_the_backup_held_and_goes_on(
        make_cluster, tmp_path: pathlib.Path) -> None:
    old = make_cluster(3)
    leader = old.leader()
    for i in range(30):
        assert leader.post("/v1/jobs", {"job_id": f"hourly-{i}", "schedule": {"cron": f"{i} * * * *"}})[0] == 201
    now = datetime.now(timezone.utc)
    assert leader.post("/v1/jobs", {"job_id": "in-flight", "schedule": {"at": now.isoformat()},
                                    "queue": "restore"})[0] == 201
    # Leased and never acked: the backup catches it running.
    task = leader.post("/v1/tasks/poll", {"worker_id": "w-old", "queues": ["restore"], "wait_s": 10})[1]["tasks"][0]
    follower = next(n for n in old.nodes if n is not leader)
    old.wait_converged()

    backup = tmp_path / "cluster.snap"
    made = schedulerd("backup", "--data-dir", follower.data_dir, "--out", str(backup))
    assert made.returncode == 0, made.stderr
    assert leader.post("/v1/jobs", {"job_id": "after-backup", "schedule": {"every": "1h"}})[0] == 201
    old.stop()

    new = Cluster.create(str(tmp_path / "new"), 3)
    for node in new.nodes:
        done = schedulerd("restore", "--from", str(backup), "--data-dir", node.data_dir)
        assert done.returncode == 0, done.stderr
    refused = schedulerd("restore", "--from", str(backup), "--data-dir", new.nodes[0].data_dir)
    assert refused.returncode == 1 and "needs an empty data dir" in refused.stderr
    new.start()
    try:
        leader = new.leader()
        assert leader.get("/v1/jobs/hourly-29")[0] == 200
        assert leader.get("/v1/jobs/after-backup")[0] == 404
        run = leader.get(f"/v1/runs/{task['run_id']}")[1]
        assert run["state"] == "running" and run["fence"] == task["fence"]

        ran: list[Task] = []
        worker = Worker(new.urls, wait_s=1)
        worker.handler("restore")(lambda t: ran.append(t))
        with running(worker):
            soon = (datetime.now(timezone.utc) + timedelta(seconds=1)).isoformat()
            assert leader.post("/v1/jobs", {"job_id": "after-restore", "schedule": {"at": soon},
                                            "queue": "restore"})[0] == 201
            wait_until(lambda: any(t.job_id == "after-restore" for t in ran), 20, "a new job to run")
            fresh = next(t for t in ran if t.job_id == "after-restore")
            assert fresh.fence > task["fence"], "the restored log must continue after the backup"
            # The run the backup caught in flight is still leased (30 s from before the backup):
            # its holder may finish it; had it died, the lease would end and the run come back.
            acked = leader.post(f"/v1/tasks/{task['run_id']}/ack", {"worker_id": "w-old", "fence": task["fence"]})
            assert acked[0] == 200 and acked[1]["run"]["state"] == "succeeded"
        new.wait_converged()
        digests = {n.get("/v1/cluster/digest")[1]["groups"][0]["digest"] for n in new.nodes}
        assert len(digests) == 1
    finally:
        new.stop()


def test_a_backup_of_a_node_with_several_groups_must_name_the_group(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / "node"
    for group in (0, 1):
        (data_dir / f"group-{group}.lmdb").mkdir(parents=True)
    refused = schedulerd("backup", "--data-dir", str(data_dir), "--out", str(tmp_path / "b.snap"))
    assert refused.returncode == 2
    assert "holds groups 0, 1: back up each with --group N" in refused.stderr
    assert not (tmp_path / "b.snap").exists()
