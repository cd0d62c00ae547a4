"""A rolling upgrade across an entry version, with real nodes: two run a copy of this
tree whose storage/ops.py writes and reads one version more (the next release), one runs
this tree. The upgraded nodes keep writing this tree's version while the old node is a
voter, so it goes on applying; once it is upgraded too, the cluster writes the new version
by itself; and an old build brought back after that stops on the first newer entry, as
docs/operations.md says it does."""
from __future__ import annotations

import os
import re
import shutil
import urllib.request
from datetime import datetime, timezone

import pytest

from schedulerd.sdk.client import Client
from schedulerd.storage import ops
from tests.integration.harness import ROOT, Cluster, NodeProc, recording_worker, running, wait_until

pytestmark = pytest.mark.integration

NEXT = ops.VERSION + 1
FATAL_EXIT = 70  # a node that cannot apply an entry stops with this (raft/group.py)


def next_release(base: str) -> str:
    """This tree's packages, with one entry version more that applies as the current one does."""
    root = os.path.join(base, "next-release")
    for package in ("schedulerd", "storage", "raft"):
        shutil.copytree(os.path.join(ROOT, package), os.path.join(root, package),
                        ignore=shutil.ignore_patterns("__pycache__"))
    path = os.path.join(root, "storage", "ops.py")
    with open(path) as f:
        source = f.read()
    patched = re.sub(r"^VERSION = \d+$", f"VERSION = {NEXT}", source, count=1, flags=re.M)
    patched = re.sub(r"^(READABLE_VERSIONS = frozenset\(\{[^}]*)\}\)$", rf"\1, {NEXT}}})", patched,
                     count=1, flags=re.M)
    assert patched.count(str(NEXT)) >= 2, "storage/ops.py no longer spells VERSION as this test expects"
    with open(path, "w") as f:
        f.write(patched)
    return root


def versions(node: NodeProc) -> tuple[int, int]:
    group = node.group0()
    return group["entry_version"], group["entry_version_newest"]


def run_one_job_through_each_node(cluster: Cluster, label: str) -> None:
    """Each node proposes a create; a worker polling every node runs all three."""
    queue = f"q-{label}"
    now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
    for node in cluster.nodes:
        Client([node.url], timeout_s=20).create_job({"job_id": f"{label}-{node.name}", "schedule": {"at": now},
                                                     "queue": queue})
    worker, executions = recording_worker(cluster.urls, queue)
    with running(worker):
        wait_until(lambda: len({t.job_id for t in executions}) == 3, 30, f"the {label} jobs to run")


def restart_on(node: NodeProc, root: str, cluster: Cluster) -> None:
    node.stop()
    node.root = root
    node.start()
    cluster.wait_ready(node)


def test_a_rolling_upgrade_writes_the_old_version_until_every_node_reads_the_new(tmp_path) -> None:
    new = next_release(str(tmp_path))
    cluster = Cluster.create(str(tmp_path), 3)
    old_node = cluster.nodes[2]
    for node in cluster.nodes[:2]:
        node.root = new
    cluster.start()
    try:
        # Until the leader has heard every voter, the cluster writes ops.VERSION_FLOOR.
        mixed = [(ops.VERSION, NEXT)] * 2 + [(ops.VERSION, ops.VERSION)]
        wait_until(lambda: [versions(n) for n in cluster.nodes] == mixed, 15,
                   f"the mixed cluster to write version {ops.VERSION}")
        run_one_job_through_each_node(cluster, "mixed")
        cluster.wait_converged()
        assert old_node.proc is not None and old_node.proc.poll() is None, "the old node stopped"
        with urllib.request.urlopen(cluster.nodes[0].url + "/metrics", timeout=10) as resp:
            assert f'schedulerd_raft_entry_version{{group="0"}} {ops.VERSION}.0' in resp.read().decode()

        restart_on(old_node, new, cluster)
        wait_until(lambda: all(versions(n) == (NEXT, NEXT) for n in cluster.nodes), 15,
                   f"every node to write version {NEXT}")
        assert set(cluster.leader().group0()["peer_entry_versions"].values()) == {NEXT}
        run_one_job_through_each_node(cluster, "upgraded")
        cluster.wait_converged()

        old_node.stop()
        old_node.root = ROOT
        old_node.start()
        assert old_node.proc is not None
        assert old_node.proc.wait(30) == FATAL_EXIT  # it cannot read what the cluster now writes
        old_node.proc = None
        with open(old_node.log_path) as f:
            assert f"entry version {NEXT}" in f.read()
    finally:
        cluster.stop()

