"""After the faults: wait for the cluster to go quiet, then read back everything
from every node over the public API (jobs with cursors, every job's runs,
cluster status, state digest)."""
from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import wire
from cluster import REPLICATION_FACTOR, Cluster

PAGE = 1000
OPEN_RUN_STATES = {"queued", "running", "retry_wait"}
SETTLE_POLL_S = 0.5


def list_jobs(url: str) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        query = f"limit={PAGE}" + (f"&cursor={quote(cursor)}" if cursor else "")
        page = wire.get_json(f"{url}/v1/jobs?{query}", timeout_s=15)
        jobs.extend(page["jobs"])
        nxt = page.get("next_cursor")
        if nxt is None:
            return jobs
        if nxt == cursor:  # a server that repeats its cursor would loop us forever
            raise RuntimeError(f"{url}: /v1/jobs returned cursor {cursor!r} twice")
        cursor = nxt


def job_runs(url: str, job_id: str) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        query = f"limit={PAGE}" + (f"&cursor={quote(cursor)}" if cursor else "")
        page = wire.get_json(f"{url}/v1/jobs/{quote(job_id, safe='')}/runs?{query}", timeout_s=15)
        runs.extend(page["runs"])
        nxt = page.get("next_cursor")
        if nxt is None:
            return runs
        if nxt == cursor:
            raise RuntimeError(f"{url}: runs of {job_id} returned cursor {cursor!r} twice")
        cursor = nxt


def open_runs(url: str, finished: set[str]) -> int:
    """Work not yet done, on one node: runs not yet finished (queued, running, waiting for
    a retry), and one-off jobs still active with none open (due, but not yet claimed). A
    job that is completed or cancelled and has no open run cannot change any more: it goes
    into `finished` and is not read again (a long soak has thousands)."""
    count = 0
    for job in list_jobs(url):
        if job["job_id"] in finished:
            continue
        n = sum(1 for run in job_runs(url, job["job_id"]) if run["state"] in OPEN_RUN_STATES)
        if n == 0 and job["state"] in ("completed", "cancelled"):
            finished.add(job["job_id"])
        elif n == 0 and job["state"] == "active" and "at" in job["schedule"]:
            n = 1
        count += n
    return count


def settle(cluster: Cluster, timeout_s: float) -> dict[str, Any]:
    """Wait until the leader's replica has no open work (redeliveries done), or the deadline."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    finished: set[str] = set()
    while time.monotonic() < deadline:
        leader = cluster.leader()
        if leader is not None:
            try:
                last = open_runs(cluster.nodes[leader].url, finished)
                if last == 0:
                    return {"settled": True, "open_runs": 0}
            except RuntimeError as exc:
                last = str(exc)
        time.sleep(SETTLE_POLL_S)
    return {"settled": False, "open_runs": last}


def _snapshot(cluster: Cluster) -> dict[str, Any]:
    """Per node in the cluster, per replica it holds: last applied, commit index, digest."""
    out: dict[str, Any] = {}
    for node in cluster.active:
        try:
            status = {g["group"]: g for g in wire.get_json(node.url + "/v1/cluster")["groups"]}
            digests = wire.get_json(node.url + "/v1/cluster/digest")["groups"]
            out[str(node.idx)] = {str(d["group"]): {
                "last_applied": status[d["group"]]["last_applied"], "commit_index": status[d["group"]]["commit_index"],
                "digest": d["digest"], "digest_applied": d["last_applied"]} for d in digests}
        except (RuntimeError, KeyError, TypeError):
            out[str(node.idx)] = None
    return out


def _agreed(snap: dict[str, Any], groups: int, replicas: int) -> bool:
    """Every node answered, every group has `replicas` replicas (none left over where a
    replica was dropped, none missing), and each group's replicas are identical."""
    if any(s is None for s in snap.values()):
        return False
    for group in map(str, range(groups)):
        held = [s[group] for s in snap.values() if group in s]
        if len(held) != replicas or len({tuple(sorted(h.items())) for h in held}) != 1:
            return False
    return True


def wait_converged(cluster: Cluster, timeout_s: float) -> dict[str, Any]:
    """Each group's replicas agree on last_applied, commit index and digest, seen twice in a
    row (once could be a coincidence mid-change)."""
    deadline = time.monotonic() + timeout_s
    start = time.monotonic()
    replicas = min(REPLICATION_FACTOR, len(cluster.active))
    previous: dict[str, Any] | None = None
    snap: dict[str, Any] = {}
    while time.monotonic() < deadline:
        snap = _snapshot(cluster)
        same = _agreed(snap, cluster.groups, replicas)
        if same and snap == previous:
            return {"converged": True, "nodes": snap, "waited_s": round(time.monotonic() - start, 1)}
        previous = snap if same else None
        time.sleep(0.5)
    return {"converged": False, "nodes": snap, "waited_s": round(time.monotonic() - start, 1)}


def read_all(cluster: Cluster) -> list[dict[str, Any]]:
    """Everything every node knows: the checkers compare the nodes with each other."""
    out = []
    for node in cluster.active:
        jobs = list_jobs(node.url)
        out.append({"node": node.idx, "jobs": jobs,
                    "runs": {j["job_id"]: job_runs(node.url, j["job_id"]) for j in jobs},
                    "cluster": wire.get_json(node.url + "/v1/cluster"),
                    "digest": wire.get_json(node.url + "/v1/cluster/digest")})
    return out
