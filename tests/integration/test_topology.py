"""The node registry and the placement on real nodes: every first node registers under an
id it keeps across restarts, the metadata leader bootstraps the cluster's shape, and
/v1/cluster and `schedctl cluster` show the nodes with the groups each holds and leads."""
from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from tests.integration.harness import Cluster, wait_until

pytestmark = pytest.mark.integration


def topology(cluster: Cluster, i: int) -> dict[str, Any]:
    return cluster.nodes[i].get("/v1/cluster")[1]


def test_every_node_registers_the_leader_bootstraps_and_a_restart_keeps_the_id(make_cluster) -> None:
    cluster = make_cluster(3)
    wait_until(lambda: all(topology(cluster, i).get("cluster") and len(topology(cluster, i)["nodes"]) == 3
                           for i in range(3)), 20, "every node to see the bootstrapped registry")
    view = topology(cluster, 0)
    assert view["cluster"]["replication_factor"] == 3 and view["cluster"]["groups"] == 1
    ids = {n["node_id"] for n in view["nodes"]}
    assert {topology(cluster, i)["node_id"] for i in range(3)} == ids
    assert all(n["state"] == "alive" and n["groups"] == [0] for n in view["nodes"])
    assert sum(len(n["leads"]) for n in view["nodes"]) == 1
    assert sorted(view["meta"]["members"]) == sorted(ids) and view["meta"]["leader_node"] in ids
    raft = {n["raft"] for n in view["nodes"]}
    assert raft == {node.raft_addr for node in cluster.nodes}

    restarted = cluster.nodes[1]
    before = topology(cluster, 1)["node_id"]
    restarted.kill9()
    restarted.start()
    wait_until(lambda: topology(cluster, 1).get("node_id") == before, 20, "the restarted node to answer")
    wait_until(lambda: topology(cluster, 1)["meta"]["leader_node"] is not None, 20, "its metadata replica")
    assert {n["node_id"] for n in topology(cluster, 1)["nodes"]} == ids  # itself again, not a new node

    shown = subprocess.run([sys.executable, "-m", "schedulerd.cli.main", "--server", cluster.nodes[0].url, "cluster"],
                           capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert "NODE" in shown.stdout and all(node_id in shown.stdout for node_id in ids)
    assert "replication factor 3" in shown.stdout


def test_a_single_node_bootstraps_with_replication_factor_1(make_cluster) -> None:
    cluster = make_cluster(1)
    wait_until(lambda: topology(cluster, 0).get("cluster"), 20, "the bootstrap")
    view = topology(cluster, 0)
    assert view["cluster"]["replication_factor"] == 1
    assert [n["groups"] for n in view["nodes"]] == [[0]]


def test_a_silent_node_is_suspect_then_dead_and_a_dead_one_is_not_taken_back(make_cluster) -> None:
    cluster = make_cluster(3, ["--dead-node-timeout", "4s"])
    wait_until(lambda: topology(cluster, 0).get("cluster") and len(topology(cluster, 0)["nodes"]) == 3, 20,
               "the bootstrapped registry")
    leader_node = topology(cluster, 0)["meta"]["leader_node"]
    victim = next(i for i in range(3) if topology(cluster, i)["node_id"] != leader_node)
    victim_id = topology(cluster, victim)["node_id"]
    watcher = next(i for i in range(3) if i != victim)
    cluster.nodes[victim].kill9()

    def state_of(node_id: str) -> str:
        return next(n["state"] for n in topology(cluster, watcher)["nodes"] if n["node_id"] == node_id)

    wait_until(lambda: state_of(victim_id) == "suspect", 15, "the silent node to be suspect")
    wait_until(lambda: state_of(victim_id) == "dead", 15, "the silent node to be dead")
    assert all(state_of(n["node_id"]) == "alive" for n in topology(cluster, watcher)["nodes"]
               if n["node_id"] != victim_id)

    cluster.nodes[victim].start()  # it learns from its metadata replica that it is out
    wait_until(lambda: "declared dead" in str(cluster.nodes[victim].get("/readyz")[1]), 20,
               "the dead node to say it is out")
    assert cluster.nodes[victim].get("/readyz")[0] == 503
    assert state_of(victim_id) == "dead"
