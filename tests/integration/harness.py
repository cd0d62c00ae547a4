"""Real schedulerd processes on loopback, for integration tests.

Helpers assert (they never return a bool to forget) and wait for conditions
with a deadline instead of sleeping."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from bench.common import free_port_runs, free_ports  # noqa: F401  (re-exported: tests import them from here)
from schedulerd.sdk.worker import Task, Worker
from tests.waiting import wait_until  # noqa: F401  (re-exported: the integration tests import it from here)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@contextmanager
def running(worker: Any) -> Iterator[Any]:
    """The worker polls in a background thread for the body; after it, stop (drain) and join."""
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(15)


def recording_worker(urls: list[str], queue: str) -> tuple[Worker, list[Task]]:
    """A worker of 16 slots whose handler for `queue` appends each task it runs to the list
    (list.append is atomic: the test thread may read the list while the worker's threads add)."""
    worker = Worker(servers=urls, concurrency=16, wait_s=2)
    executions: list[Task] = []
    worker.handler(queue)(executions.append)
    return worker, executions


def http(method: str, url: str, body: Any = None, timeout_s: float = 10.0,
         token: str | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@dataclass
class NodeProc:
    name: str
    http_port: int
    raft_addr: str
    peers: list[str]
    data_dir: str
    log_path: str
    proc: subprocess.Popen | None = None
    extra_args: list[str] = field(default_factory=list)
    token: str | None = None  # sent by get/post when set
    root: str = ROOT  # the tree whose code the node runs (its working directory)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> None:
        args = [sys.executable, "-m", "schedulerd.main", "--data-dir", self.data_dir,
                "--http", f"127.0.0.1:{self.http_port}", "--raft", self.raft_addr,
                "--peers", ",".join(self.peers), *self.extra_args]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, cwd=self.root, stdout=log, stderr=subprocess.STDOUT)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def get(self, path: str) -> tuple[int, Any]:
        return http("GET", self.url + path, token=self.token)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return http("POST", self.url + path, body, token=self.token)

    def group0(self) -> dict[str, Any]:
        status, body = self.get("/v1/cluster")
        assert status == 200, body
        return body["groups"][0]


@dataclass
class Cluster:
    nodes: list[NodeProc] = field(default_factory=list)

    @classmethod
    def create(cls, base_dir: str, n: int, extra_args: list[str] | None = None,
               token: str | None = None, groups: int = 1) -> "Cluster":
        """Node i's group g listens on its Raft port + g (--groups), its metadata group on + groups."""
        ports = free_port_runs(2 * n, groups + 1)  # HTTP ports first; a run is harmless there
        raft = [f"127.0.0.1:{port}" for port in ports[n:]]
        if groups > 1:
            extra_args = [*(extra_args or []), "--groups", str(groups)]
        nodes = [NodeProc(f"n{i}", ports[i], raft[i], [r for j, r in enumerate(raft) if j != i],
                          os.path.join(base_dir, f"n{i}"), os.path.join(base_dir, f"n{i}.log"),
                          extra_args=list(extra_args or []), token=token)
                 for i in range(n)]
        return cls(nodes)

    def join_node(self, base_dir: str, extra_args: list[str] | None = None, groups: int = 1) -> NodeProc:
        """Start one more node that joins the running cluster through node 0 (--join)."""
        http_port, raft_port = free_port_runs(2, groups + 1)
        name = f"n{len(self.nodes)}"
        args = [*(extra_args or []), "--join", self.nodes[0].url]
        if groups > 1:
            args += ["--groups", str(groups)]
        node = NodeProc(name, http_port, f"127.0.0.1:{raft_port}", [], os.path.join(base_dir, name),
                        os.path.join(base_dir, f"{name}.log"), extra_args=args, token=self.nodes[0].token)
        self.nodes.append(node)
        node.start()
        return node

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def start(self, wait: bool = True) -> None:
        for node in self.nodes:
            node.start()
        for node in self.nodes if wait else []:
            self.wait_ready(node)

    def wait_ready(self, node: NodeProc, timeout_s: float = 30) -> None:
        wait_until(lambda: node.get("/readyz")[0] == 200, timeout_s, f"{node.name} ready")

    def leader(self, timeout_s: float = 15) -> NodeProc:
        def find() -> NodeProc | None:
            for node in self.nodes:
                if node.proc is not None and node.group0()["is_leader"]:
                    return node
            return None
        return wait_until(find, timeout_s, "a leader")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def wait_converged(self, timeout_s: float = 30) -> int:
        """All live nodes applied the same last index and nothing is left to commit."""
        def same() -> int | None:
            applied = {n.group0()["last_applied"] for n in self.nodes if n.proc is not None}
            commits = {n.group0()["commit_index"] for n in self.nodes if n.proc is not None}
            return applied.pop() if len(applied) == 1 and commits == {max(commits)} and \
                max(commits) == min(applied | {max(commits)}) else None
        return wait_until(same, timeout_s, "nodes to converge", interval_s=0.2)


def lmdb_digest(path: str) -> str:
    """sha256 over every named database of a (stopped) node's LMDB environment."""
    import lmdb
    from schedulerd.storage.tables import DB_NAMES
    env = lmdb.open(path, readonly=True, lock=False, max_dbs=len(DB_NAMES) + 1)
    h = hashlib.sha256()
    with env.begin() as txn:
        for name in DB_NAMES:
            db = env.open_db(name.encode(), txn=txn, create=False)
            for k, v in txn.cursor(db=db):
                h.update(name.encode() + k + b"\x00" + v)
    env.close()
    return h.hexdigest()
