"""Three real nodes with two Raft groups each (`--groups 2`): jobs are split between
the groups by shard, a worker polling every node runs the jobs of both, and a kill -9
of the node leading group 1 loses nothing of either group. Afterwards every group's
replicas are byte-identical."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from schedulerd.errors import SchedulerError
from schedulerd.sdk.client import Client
from schedulerd.storage import keys
from tests.integration.harness import Cluster, NodeProc, lmdb_digest, recording_worker, running, wait_until

pytestmark = pytest.mark.integration

GROUPS = 2
JOBS = 120


def _iso(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _group_of(job_id: str) -> int:
    """The daemon's own rule (schedulerd/node.py): shard of the job id, modulo the groups."""
    return keys.shard_of(job_id) % GROUPS


def _leader_of(cluster: Cluster, group: int) -> NodeProc:
    def find() -> NodeProc | None:
        for node in cluster.nodes:
            if node.proc is not None and node.get("/v1/cluster")[1]["groups"][group]["is_leader"]:
                return node
        return None
    return wait_until(find, 15, f"a leader of group {group}")


def _digests(cluster: Cluster, group: int) -> dict[str, tuple[int, str]]:
    out = {}
    for node in cluster.nodes:
        g = node.get("/v1/cluster/digest")[1]["groups"][group]
        out[node.name] = (g["last_applied"], g["digest"])
    return out


def test_two_groups_split_jobs_survive_a_leader_kill_and_converge(make_cluster) -> None:
    cluster = make_cluster(3, groups=GROUPS)
    for node in cluster.nodes:
        status, body = node.get("/v1/cluster")
        assert status == 200 and [g["group"] for g in body["groups"]] == list(range(GROUPS)), body
    client = Client(cluster.urls, timeout_s=20)
    worker, executions = recording_worker(cluster.urls, "work")
    accepted: set[str] = set()
    start = datetime.now(timezone.utc) + timedelta(seconds=2)
    victim = _leader_of(cluster, 1)
    with running(worker):
        # A batch create whose jobs belong to both groups: one request, an entry in each.
        batch = [{"job_id": f"batch-{i}", "schedule": {"at": _iso(start)}, "queue": "work"} for i in range(20)]
        assert {_group_of(spec["job_id"]) for spec in batch} == set(range(GROUPS))
        results = client.create_jobs(batch)
        assert all(r["ok"] for r in results), results
        accepted |= {r["job_id"] for r in results}
        for i in range(JOBS):
            if i == JOBS // 2:
                victim.kill9()
            due = start + timedelta(milliseconds=40 * i)
            try:
                job = client.create_job({"job_id": f"job-{i}", "schedule": {"at": _iso(due)}, "queue": "work"})
            except SchedulerError:
                continue  # not acknowledged: the client may not count it
            accepted.add(job["job_id"])
        assert len(accepted) >= (JOBS + len(batch)) * 0.9, f"only {len(accepted)} creates were accepted"
        assert {_group_of(job_id) for job_id in accepted} == set(range(GROUPS))

        wait_until(lambda: accepted <= {t.job_id for t in executions}, 60,
                   "every accepted job, of both groups, to run")
        victim.start()
        cluster.wait_ready(victim)

    # One run per accepted job, succeeded: nothing lost, no occurrence claimed twice.
    states = {job_id: [r["state"] for r in client.job_runs(job_id)["runs"]] for job_id in accepted}
    assert {job_id: s for job_id, s in states.items() if s != ["succeeded"]} == {}

    for group in range(GROUPS):
        wait_until(lambda g=group: len(set(_digests(cluster, g).values())) == 1, 30,
                   f"group {group}'s replicas to converge")
    cluster.stop()
    for group in range(GROUPS):
        stores = {node.name: lmdb_digest(f"{node.data_dir}/group-{group}.lmdb") for node in cluster.nodes}
        assert len(set(stores.values())) == 1, (group, stores)
