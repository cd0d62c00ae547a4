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
    def __init__(self, n: int, out_dir: str, lease_s: float, history: History, repo_root: str) -> None:
        self.history = history
        self.lease_s = lease_s
        self.repo_root = repo_root
        base = os.path.join(out_dir, "nodes")
        os.makedirs(base, exist_ok=True)
        self.nodes = [Node(i, os.path.join(base, f"n{i}"), os.path.join(base, f"n{i}.log"),
                           os.path.join(base, f"n{i}.clock-offset")) for i in range(n)]
        # Raft runs encrypted and authenticated, as in production; the HTTP API stays open
        # on the private bridge (--insecure) so the checkers need no tokens.
        self.secret_file = os.path.join(out_dir, "cluster.secret")
        with open(os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(secrets.token_urlsafe(32))

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def start(self, i: int) -> None:
        node = self.nodes[i]
        others = [p for p in self.nodes if p.idx != i]
        # A first node names its peers; a replaced machine joins through the others' HTTP.
        member = ["--join", ",".join(p.url for p in others)] if node.joins else \
            ["--peers", ",".join(p.raft for p in others)]
        args = ["ip", "netns", "exec", net.node_ns(i), sys.executable, "-m", "schedulerd.main",
                "--data-dir", node.data_dir, "--http", f"{node.ip}:{HTTP_PORT}", "--raft", node.raft,
                *member, "--clock-offset-file", node.offset_file, "--lease-s", str(self.lease_s),
                "--dead-node-timeout", f"{DEAD_NODE_TIMEOUT_S:g}s",
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
        for node in self.nodes:
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
        node = self.nodes[i]
        if not node.alive() or node.paused:
            return None
        reply = wire.request("GET", node.url + "/v1/cluster", timeout_s=timeout_s)
        if reply.status != 200 or not isinstance(reply.body, dict):
            return None
        groups = reply.body.get("groups") or []  # none while a new node waits for its replicas
        return groups[0] if groups else None

    def leader(self) -> int | None:
        """The live node that believes it leads; the highest term wins when an
        isolated old leader still believes too."""
        best: tuple[int, int] | None = None
        for node in self.nodes:
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
            if all(wire.request("GET", n.url + "/readyz", timeout_s=2).status == 200 for n in self.nodes):
                return True
            time.sleep(0.3)
        return False
