"""Three real nodes, one clock run 3 s off (the --clock-offset-file the fault harness
skews with): a follower's ahead, the leader's ahead, a follower's behind. A worker
polling only the skewed node must not start a run before it is due by the other two
clocks (raft/clocks.py, schedulerd/lease_time.py), nor seconds after."""
from __future__ import annotations

import re
import time
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest

from schedulerd.sdk.client import Client
from schedulerd.sdk.worker import Task, Worker
from tests.integration.harness import Cluster, NodeProc, running, wait_until

pytestmark = pytest.mark.integration

SKEW_S = 3.0
DUE_IN_S = 5.0
EARLY_ALLOWED_S = 0.05  # the real clocks are one machine's: the only error is measurement
LATE_ALLOWED_S = 2.0
ROLE_ATTEMPTS = 2


def _skew(node: NodeProc, seconds: float) -> None:
    with open(node.data_dir + ".offset", "w") as f:
        f.write(f"{seconds}")
    wait_until(lambda: abs(_clock(node) - time.time() - seconds) < 0.5, 10, f"{node.name}'s clock to move")


def _clock(node: NodeProc) -> float:
    return datetime.fromisoformat(node.get("/v1/cluster")[1]["clock"].replace("Z", "+00:00")).timestamp()


def _start_on_the_skewed_node(cluster: Cluster, skewed: NodeProc, skew_s: float, job_id: str) -> float:
    """Seconds from the job's due time to its start (negative: early), by the machine's clock."""
    _skew(skewed, skew_s)
    due = datetime.now(timezone.utc) + timedelta(seconds=DUE_IN_S)
    Client(cluster.urls, timeout_s=20).create_job(
        {"job_id": job_id, "schedule": {"at": due.isoformat().replace("+00:00", "Z")}, "queue": job_id})
    started: list[float] = []
    worker = Worker(servers=[skewed.url], concurrency=1, wait_s=2)

    def run(task: Task) -> None:
        started.append(time.time())

    worker.handler(job_id)(run)
    with running(worker):
        wait_until(lambda: started, DUE_IN_S + 15, f"{job_id} to start")
    leader = cluster.leader()
    if skewed is not leader:  # the leader measures and reports it
        offset_ms = leader.group0()["peer_clock_offsets_ms"][skewed.raft_addr]
        assert abs(offset_ms / 1000 - skew_s) < 0.5, offset_ms
        with urllib.request.urlopen(leader.url + "/metrics", timeout=10) as resp:
            metric = re.search(rf'schedulerd_raft_peer_clock_offset_seconds{{group="0",peer="{skewed.raft_addr}"}} (\S+)',
                               resp.read().decode())
        assert metric is not None and abs(float(metric.group(1)) - skew_s) < 0.5
    _skew(skewed, 0)
    return started[0] - due.timestamp()


def test_a_node_whose_clock_is_off_starts_runs_on_time(tmp_path) -> None:
    cluster = Cluster.create(str(tmp_path), 3)
    for node in cluster.nodes:
        node.extra_args += ["--clock-offset-file", node.data_dir + ".offset"]
    cluster.start()
    try:
        for role, skew_s in (("follower", SKEW_S), ("leader", SKEW_S), ("follower", -SKEW_S)):
            job_id = f"{role}-{'ahead' if skew_s > 0 else 'behind'}"
            # The roles are read afresh for each case, and a case counts for its role only
            # if the leader held through it: an election the loaded box calls on its own
            # (a stall past the 0.5 s election timeout) gets the case one more try.
            for attempt in range(ROLE_ATTEMPTS):
                leader = cluster.leader()
                skewed = leader if role == "leader" else next(n for n in cluster.nodes if n is not leader)
                late_s = _start_on_the_skewed_node(cluster, skewed, skew_s, f"{job_id}-{attempt}")
                assert -EARLY_ALLOWED_S <= late_s <= LATE_ALLOWED_S, \
                    f"{job_id}: started {late_s:+.3f} s from its due time"
                held = cluster.leader() is leader
                if held:
                    break
            assert held, f"{job_id}: the leader changed in each of {ROLE_ATTEMPTS} tries, so no try skewed the {role}"
    finally:
        cluster.stop()
