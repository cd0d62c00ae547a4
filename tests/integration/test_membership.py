"""A cluster that grows and heals, on real nodes: a node joins and is given replicas until
groups and leaders per node are within one of even; a client on any node reads and writes
every job (a node forwards what it holds no replica of); a node killed for good is declared
dead and its replicas re-created on the survivors; a drained node leaves every group. Each
step checks that no acknowledged job was lost."""
from __future__ import annotations

import pathlib
import subprocess
from datetime import datetime, timezone
import sys
from typing import Any

import pytest

from tests.integration.harness import Cluster, NodeProc, wait_until

pytestmark = pytest.mark.integration

FAR = "2031-01-01T00:00:00Z"


def view(node: NodeProc) -> dict[str, Any]:
    status, body = node.get("/v1/cluster")
    assert status == 200, body
    return body


def settled(cluster: Cluster, replicas: int, groups: int) -> dict[str, Any] | None:
    """The cluster view (a live node's) once no change is under way, every group has
    `replicas` members, groups per serving node are within one, and every group has a
    leader with leaders per node within one (each node knows the leaders of its own groups)."""
    live = [node for node in cluster.nodes if node.proc is not None and node.get("/readyz")[0] == 200]
    if not live:
        return None
    v = view(live[0])
    serving = [n for n in v["nodes"] if n["state"] == "alive"]
    held = [len(n["groups"]) for n in serving]
    members: dict[int, int] = {}
    for n in serving:
        for g in n["groups"]:
            members[g] = members.get(g, 0) + 1
    if v["meta"]["changes"] or members != {g: replicas for g in range(groups)} or max(held) - min(held) > 1:
        return None
    leaders: dict[int, str] = {}
    for node in live:
        for n in view(node)["nodes"]:
            leaders.update(dict.fromkeys(n["leads"], n["node_id"]))
    led = [sum(1 for leader in leaders.values() if leader == n["node_id"]) for n in serving]
    if len(leaders) != groups or max(led) - min(led) > 1:
        return None
    return v


def create(node: NodeProc, ids: list[str]) -> None:
    status, body = node.post("/v1/jobs:batch", {"jobs": [{"job_id": i, "schedule": {"at": FAR}} for i in ids]})
    assert status == 200 and all(r["ok"] for r in body["results"]), body


def all_jobs(node: NodeProc) -> set[str]:
    found: set[str] = set()
    cursor = None
    while True:
        status, body = node.get("/v1/jobs?limit=7" + (f"&cursor={cursor}" if cursor else ""))
        assert status == 200, body
        found |= {j["job_id"] for j in body["jobs"]}
        cursor = body["next_cursor"]
        if cursor is None:
            return found


def test_a_node_joins_takes_its_share_serves_every_job_and_a_dead_node_is_repaired(
        make_cluster, tmp_path: pathlib.Path) -> None:
    groups = 3
    cluster = make_cluster(3, ["--dead-node-timeout", "5s"], groups=groups)
    wait_until(lambda: settled(cluster, 3, groups), 30, "the first placement")
    before = [f"job-{i}" for i in range(40)]
    create(cluster.nodes[0], before)

    joined = cluster.join_node(str(tmp_path), ["--dead-node-timeout", "5s"], groups=groups)
    cluster.wait_ready(joined, 60)
    v = wait_until(lambda: settled(cluster, 3, groups), 90, "the new node's share and balanced leaders")
    by_id = {n["node_id"]: n for n in v["nodes"]}
    new_id = view(joined)["node_id"]
    assert len(by_id) == 4 and by_id[new_id]["state"] == "alive" and by_id[new_id]["groups"]
    assert sorted(len(n["groups"]) for n in v["nodes"]) == [2, 2, 2, 3]
    # Three voters of the metadata group; the fourth node follows its log as an observer.
    new_meta = view(joined)["meta"]
    assert len(new_meta["members"]) == 3 and new_id not in new_meta["members"], new_meta
    shown = view(joined)["data_groups"]
    assert [g["group"] for g in shown] == list(range(groups))
    assert all(len(g["members"]) == 3 and g["change"] is None for g in shown)
    assert all(g["leader_node"] in g["members"] for g in shown if "leader_node" in g)

    # Any node answers for every job: what it holds no replica of, it forwards.
    after = [f"late-{i}" for i in range(20)]
    create(joined, after)
    for node in cluster.nodes:  # a replica that answers a read may be a moment behind its leader
        wait_until(lambda: all_jobs(node) == set(before) | set(after), 10, f"{node.name} to list every job")
    for job_id in (before[0], before[17], after[3]):
        for node in cluster.nodes:
            status, body = node.get(f"/v1/jobs/{job_id}")
            assert status == 200 and body["job_id"] == job_id, (node.name, body)

    # A bulk action from a node that holds two of the three groups: the third's holder does its share.
    partial = next(n for n in cluster.nodes if len(by_id[view(n)["node_id"]]["groups"]) < groups)
    status, paused = partial.post("/v1/jobs:pause", {"selector": "!unlabelled"})
    assert status == 200 and (paused["matched"], paused["changed"]) == (60, 60), paused
    status, resumed = partial.post("/v1/jobs:resume", {"selector": "!unlabelled"})
    assert status == 200 and (resumed["matched"], resumed["changed"]) == (60, 60), resumed

    # Runs ready in every group are counted by every node, whichever groups it holds.
    now = datetime.now(timezone.utc).isoformat()
    status, body = cluster.nodes[0].post("/v1/jobs:batch", {"jobs": [
        {"job_id": f"ready-{i}", "schedule": {"at": now}, "queue": "nobody"} for i in range(12)]})
    assert status == 200 and all(r["ok"] for r in body["results"]), body

    def ready_everywhere() -> bool:
        for node in cluster.nodes:
            queues = {q["queue"]: q for q in node.get("/v1/queues")[1]["queues"]}
            if queues.get("nobody", {}).get("ready") != 12:
                return False
        return True

    wait_until(ready_everywhere, 30, "every node to count the 12 ready runs of every group")
    before += [f"ready-{i}" for i in range(12)]

    # Killed for good: declared dead after the timeout, its replicas re-created on the others.
    meta_leader = v["meta"]["leader_node"]
    victim = next(n for n in cluster.nodes[1:] if view(n)["node_id"] != meta_leader)
    victim_id = view(victim)["node_id"]
    victim.kill9()

    def repaired() -> dict[str, Any] | None:
        v = settled(cluster, 3, groups)
        return v if v and next(n for n in v["nodes"] if n["node_id"] == victim_id)["state"] == "dead" else None

    v = wait_until(repaired, 120, "the dead node's replicas re-created on the survivors")
    assert next(n for n in v["nodes"] if n["node_id"] == victim_id)["groups"] == []
    # The dead voter's place in the metadata group went to the observer.
    v = wait_until(lambda: (lambda m: m if new_id in m["members"] and m["changes"] == {} else None)(
        view(joined)["meta"]), 60, "the observer to be given the dead node's vote")
    assert victim_id not in v["members"] and len(v["members"]) == 3 and len(v["raft_members"]) == 3
    for node in cluster.nodes:
        if node.proc is not None:
            wait_until(lambda: all_jobs(node) == set(before) | set(after), 10, f"{node.name} to list every job")

    # Back from the dead, it learns it was declared dead and serves nothing.
    victim.start()
    wait_until(lambda: "declared dead" in str(victim.get("/readyz")[1]), 30, "the dead node to say it is out")


def test_a_drained_node_leaves_every_group_and_the_cluster_keeps_every_job(make_cluster) -> None:
    groups = 2
    cluster = make_cluster(4, groups=groups)
    wait_until(lambda: settled(cluster, 3, groups), 30, "the first placement")
    # Four first nodes all start as voters of the metadata group; it is trimmed to three.
    v = wait_until(lambda: (lambda m: m if len(m["members"]) == 3 and not m["changes"] else None)(
        view(cluster.nodes[0])["meta"]), 30, "the metadata group trimmed to three voters")
    observer = next(n for n in cluster.nodes if view(n)["node_id"] not in v["members"])
    assert observer.get("/readyz")[0] == 200 and len(view(observer)["meta"]["raft_members"]) == 3
    ids = [f"job-{i}" for i in range(30)]
    create(cluster.nodes[1], ids)
    leaving = cluster.nodes[3]
    leaving_id = view(leaving)["node_id"]

    shown = subprocess.run([sys.executable, "-m", "schedulerd.cli.main", "--server", cluster.nodes[0].url,
                            "cluster", "remove-node", leaving_id], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert "draining" in shown.stdout

    def removed() -> dict[str, Any] | None:
        v = settled(cluster, 3, groups)
        return v if v and next(n for n in v["nodes"] if n["node_id"] == leaving_id)["state"] == "removed" else None

    v = wait_until(removed, 90, "the drained node to be removed")
    assert leaving_id not in v["meta"]["members"]
    assert all(len(n["groups"]) == groups for n in v["nodes"] if n["state"] == "alive")
    wait_until(lambda: leaving.get("/readyz")[0] == 503, 30, "the removed node to stop serving")
    for node in cluster.nodes[:3]:
        wait_until(lambda: all_jobs(node) == set(ids), 10, f"{node.name} to list every job")
    status, body = cluster.nodes[0].get(f"/v1/cluster/nodes/{leaving_id}")
    assert status == 200 and body["state"] == "removed"
