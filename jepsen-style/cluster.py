"""The nodes of a run: start (in their namespaces), kill -9, SIGSTOP/SIGCONT,
restart on the same data dir, clock offsets, and "who leads" — all from the
outside, over signals, files the daemon documents (--clock-offset-file) and HTTP."""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import net
import wire
from history import History

HTTP_PORT = 8080
RAFT_PORT = 9080
STOP_WAIT_S = 20.0
# The nodes' --dead-node-timeout: above every fault's hold but a membership fault's, so only
# that one has a node declared dead (nemesis.py).
DEAD_NODE_TIMEOUT_S = 15.0
REPLICATION_FACTOR = 3  # the nodes' default: each group on 3 nodes (a drain of one of 3 never ends)
# Each node's data dir is its own small tmpfs, so the disk nemesis can fill it.
DISK_SOURCE = "sdj-disk"  # the mount source name marks our mounts for cleanup
DISK_MB = 384
DISK_LEFT_BYTES = 32 << 20  # under the daemon's disk_free_bytes_min (64 MiB): writes refused
FILLER = "jepsen-filler"


def cleanup_mounts() -> None:
    """Unmount every tmpfs a harness run mounted (ours or a crashed earlier one's)."""
    with open("/proc/mounts") as fh:
        ours = [line.split()[1] for line in fh if line.split()[0] == DISK_SOURCE]
    for path in ours:
        subprocess.run(["umount", "-l", path], check=False)


@dataclass
class Node:
    idx: int
    data_dir: str
    log_path: str
    offset_file: str
    proc: subprocess.Popen | None = None
    paused: bool = False
    incarnation: int = 0  # bumped on every start: a restart resets what the node reports
    offset_s: float = 0.0
    joins: bool = False  # a replaced machine: it joins the running cluster instead of naming peers
    spare: bool = False  # a slot with no machine in the cluster: one may join on its address

    @property
    def ip(self) -> str:
        return net.node_ip(self.idx)

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{HTTP_PORT}"

    @property
    def raft(self) -> str:
        return f"{self.ip}:{RAFT_PORT}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Cluster:
    """`n` first nodes, then `spare` slots where new machines join (membership nemesis)."""

    def __init__(self, n: int, spare: int, groups: int, out_dir: str, lease_s: float, history: History,
                 repo_root: str) -> None:
        self.history = history
        self.lease_s = lease_s
        self.groups = groups
        self.first = n
        self.repo_root = repo_root
        base = os.path.join(out_dir, "nodes")
        os.makedirs(base, exist_ok=True)
        self.nodes = [Node(i, os.path.join(base, f"n{i}"), os.path.join(base, f"n{i}.log"),
                           os.path.join(base, f"n{i}.clock-offset"), spare=i >= n) for i in range(n + spare)]
        # Raft runs encrypted and authenticated, as in production; the HTTP API stays open
        # on the private bridge (--insecure) so the checkers need no tokens.
        self.secret_file = os.path.join(out_dir, "cluster.secret")
        with open(os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(secrets.token_urlsafe(32))

    @property
    def urls(self) -> list[str]:
        """The URLs of the nodes in the cluster now (clients and workers are given the first ones)."""
        return [n.url for n in self.active]

    @property
    def active(self) -> list[Node]:
        """The slots whose machine is in the cluster (running or not), as opposed to spares."""
        return [n for n in self.nodes if not n.spare]

    def start(self, i: int) -> None:
        node = self.nodes[i]
        # A first node names the first nodes as its peers (on every start, as its unit file
        # would); a new machine joins through the HTTP of the nodes in the cluster now.
        member = ["--join", ",".join(p.url for p in self.active if p.idx != i)] if node.joins else \
            ["--peers", ",".join(p.raft for p in self.nodes[:self.first] if p.idx != i)]
        args = ["ip", "netns", "exec", net.node_ns(i), sys.executable, "-m", "schedulerd.main",
                "--data-dir", node.data_dir, "--http", f"{node.ip}:{HTTP_PORT}", "--raft", node.raft,
                *member, "--clock-offset-file", node.offset_file, "--lease-s", str(self.lease_s),
                "--dead-node-timeout", f"{DEAD_NODE_TIMEOUT_S:g}s", "--groups", str(self.groups),
                "--cluster-secret-file", self.secret_file, "--insecure"]
        log = open(node.log_path, "ab")
        # `ip netns exec` execs the command in place: the pid we get is the daemon's own.
        node.proc = subprocess.Popen(args, cwd=self.repo_root, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        node.paused = False
        node.incarnation += 1
        self.history.add("node", node=i, event="start", pid=node.proc.pid, incarnation=node.incarnation)

    def start_all(self) -> None:
        for node in self.nodes:
            os.makedirs(node.data_dir, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", DISK_SOURCE, node.data_dir],
                           check=True)
            self.set_offset(node.idx, 0.0, record=False)
            if not node.spare:
                self.start(node.idx)

    def fill_disk(self, i: int) -> int:
        """Fill node i's data dir until DISK_LEFT_BYTES are free; returns the bytes left."""
        node = self.nodes[i]
        st = os.statvfs(node.data_dir)
        size = max(0, st.f_bavail * st.f_frsize - DISK_LEFT_BYTES)
        with open(os.path.join(node.data_dir, FILLER), "wb") as fh:
            fh.truncate(0)
            chunk = b"\0" * (1 << 20)
            for _ in range(size >> 20):
                fh.write(chunk)
        self.history.add("disk", node=i, event="fill", bytes=size)
        st = os.statvfs(node.data_dir)
        return st.f_bavail * st.f_frsize

    def unfill_disks(self) -> None:
        for node in self.nodes:
            path = os.path.join(node.data_dir, FILLER)
            if os.path.exists(path):
                os.remove(path)
                self.history.add("disk", node=node.idx, event="free")

    def wipe(self, i: int, joins: bool = False) -> None:
        """Empty node i's data dir (a stopped node's: the machine lost its disk); with `joins`
        it is started from now on as a new machine joining the cluster."""
        node = self.nodes[i]
        assert node.proc is None, "wipe a stopped node"
        node.joins = node.joins or joins
        for name in os.listdir(node.data_dir):
            path = os.path.join(node.data_dir, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        self.history.add("disk", node=i, event="wipe")

    def join_spare(self) -> int | None:
        """A new machine joins on the first spare slot's address (its disk empty); None
        when there is no spare slot."""
        spare = next((n for n in self.nodes if n.spare), None)
        if spare is None:
            return None
        self.wipe(spare.idx, joins=True)
        spare.spare = False
        self.start(spare.idx)
        return spare.idx

    def retire(self, i: int) -> None:
        """Node i's machine leaves for good: stopped, disk wiped, its slot a spare."""
        self.kill(i)
        self.wipe(i, joins=True)
        self.nodes[i].spare = True
        self.history.add("node", node=i, event="retired")

    def node_id(self, i: int) -> str | None:
        s = self.cluster_view(i)
        return s.get("node_id") if s else None

    def cluster_view(self, i: int, timeout_s: float = 2.0) -> dict[str, Any] | None:
        node = self.nodes[i]
        if not node.alive() or node.paused:
            return None
        reply = wire.request("GET", node.url + "/v1/cluster", timeout_s=timeout_s)
        return reply.body if reply.status == 200 and isinstance(reply.body, dict) else None

    def drain(self, i: int, via: int) -> bool:
        """Ask node `via` to drain node i out of the cluster (schedctl cluster remove-node)."""
        node_id = self.node_id(i)
        if node_id is None:
            return False
        reply = wire.request("DELETE", f"{self.nodes[via].url}/v1/cluster/nodes/{node_id}", timeout_s=5.0)
        self.history.add("node", node=i, event="drain", node_id=node_id, status=reply.status)
        return reply.status == 202

    def registry_state(self, node_id: str, via: int) -> str | None:
        reply = wire.request("GET", f"{self.nodes[via].url}/v1/cluster/nodes/{node_id}", timeout_s=2.0)
        return reply.body.get("state") if reply.status == 200 and isinstance(reply.body, dict) else None

    def kill(self, i: int) -> None:
        node = self.nodes[i]
        if node.proc is None:
            return
        node.proc.send_signal(signal.SIGKILL)
        if node.paused:
            node.proc.send_signal(signal.SIGCONT)
        node.proc.wait(STOP_WAIT_S)
        self.history.add("node", node=i, event="kill", pid=node.proc.pid)
        node.proc, node.paused = None, False

    def pause(self, i: int) -> None:
        node = self.nodes[i]
        if node.alive() and not node.paused:
            node.proc.send_signal(signal.SIGSTOP)
            node.paused = True
            self.history.add("node", node=i, event="pause", pid=node.proc.pid)

    def resume(self, i: int) -> None:
        node = self.nodes[i]
        if node.alive() and node.paused:
            node.proc.send_signal(signal.SIGCONT)
            node.paused = False
            self.history.add("node", node=i, event="resume", pid=node.proc.pid)

    def set_offset(self, i: int, seconds: float, record: bool = True) -> None:
        """Write-then-rename: the daemon re-reads the file on mtime change and must
        never see it half-written (an empty file reads as offset 0)."""
        node = self.nodes[i]
        tmp = node.offset_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{seconds:.6f}\n")
        os.replace(tmp, node.offset_file)
        node.offset_s = seconds
        if record:
            self.history.add("clock", node=i, offset_s=seconds)

    def heal_processes(self) -> None:
        """Every node running, none paused, no clock offset, disks with room."""
        self.unfill_disks()
        for node in self.active:
            if node.offset_s != 0.0:
                self.set_offset(node.idx, 0.0)
            if node.paused:
                self.resume(node.idx)
            if not node.alive():
                if node.proc is not None:  # died on its own: that is news for the report
                    self.history.add("node", node=node.idx, event="died", rc=node.proc.returncode)
                    node.proc = None
                self.start(node.idx)

    def stop_all(self) -> None:
        for node in self.nodes:
            if node.proc is None:
                continue
            if node.paused:
                node.proc.send_signal(signal.SIGCONT)
            node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                node.proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(STOP_WAIT_S)
            node.proc = None

    # -- observation ------------------------------------------------------

    def status(self, i: int, timeout_s: float = 2.0) -> dict[str, Any] | None:
        """Node i's replica of group 0, or None (down, paused, or no replica of it here)."""
        view = self.cluster_view(i, timeout_s)
        groups = [g for g in (view or {}).get("groups") or [] if g.get("group") == 0]
        return groups[0] if groups else None

    def leader(self) -> int | None:
        """The live node that believes it leads; the highest term wins when an
        isolated old leader still believes too."""
        best: tuple[int, int] | None = None
        for node in self.active:
            s = self.status(node.idx)
            if s and s.get("is_leader"):
                if best is None or s["term"] > best[0]:
                    best = (s["term"], node.idx)
        return best[1] if best else None

    def wait_leader(self, timeout_s: float) -> int | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None:
                return leader
            time.sleep(0.2)
        return None

    def wait_ready(self, timeout_s: float) -> bool:
        """Every node answers /readyz (has a leader, caught up)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(wire.request("GET", n.url + "/readyz", timeout_s=2).status == 200 for n in self.active):
                return True
            time.sleep(0.3)
        return False
