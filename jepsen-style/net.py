"""Network topology of a run: one namespace per node and per worker, each with a
veth into the bridge `sdj-br0` in the root namespace, and partitions built from
iptables DROP rules *inside* those namespaces.

Everything created here is named `sdj-*` / `sdjv*` and lives on 10.77.0.0/24, so
`cleanup_leftovers()` can remove what a crashed earlier run left behind without
touching anything else. No rule is ever added to the root namespace: deleting a
namespace deletes its rules, so teardown cannot leak a DROP onto the host."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from typing import Sequence

log = logging.getLogger("jepsen.net")

BRIDGE = "sdj-br0"
PREFIX = "10.77.0"
HOST_IP = f"{PREFIX}.1"  # the root namespace's side of the bridge: clients live here
NODE_IP_BASE = 11
WORKER_IP_BASE = 51
NS_PREFIX = "sdj-"
VETH_PREFIX = "sdjv"  # root-side veth names; 15-char interface name limit
CMD_TIMEOUT_S = 20.0


def node_ns(i: int) -> str:
    return f"{NS_PREFIX}n{i}"


def node_ip(i: int) -> str:
    return f"{PREFIX}.{NODE_IP_BASE + i}"


def worker_ns(i: int) -> str:
    return f"{NS_PREFIX}w{i}"


def worker_ip(i: int) -> str:
    return f"{PREFIX}.{WORKER_IP_BASE + i}"


def sh(args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run one command; failures raise with the command's stderr, so a missing
    capability (no netns, no iptables) says what it is."""
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _our_namespaces() -> list[str]:
    out = sh(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(NS_PREFIX)]


def _kill_namespace_pids(ns: str) -> None:
    """Processes still inside one of *our* namespaces were started by a harness run
    (ours or a crashed earlier one): kill them by pid so the namespace can go."""
    out = sh(["ip", "netns", "pids", ns], check=False).stdout
    for pid in (int(p) for p in out.split() if p.isdigit()):
        try:
            os.kill(pid, signal.SIGCONT)  # a SIGSTOPped process dies only after SIGCONT
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cleanup_leftovers() -> None:
    """Remove every sdj-* namespace and the bridge, whoever's run made them."""
    for ns in _our_namespaces():
        _kill_namespace_pids(ns)
    deadline = time.monotonic() + 10
    for ns in _our_namespaces():
        while sh(["ip", "netns", "pids", ns], check=False).stdout.strip() and time.monotonic() < deadline:
            time.sleep(0.1)
        sh(["ip", "netns", "del", ns], check=False)
    links = sh(["ip", "-o", "link", "show"], check=False).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(VETH_PREFIX) or name == BRIDGE:
            sh(["ip", "link", "del", name], check=False)


class Net:
    """The bridge plus namespaces for `nodes` nodes and `workers` workers."""

    def __init__(self, nodes: int, workers: int) -> None:
        self.nodes = nodes
        self.workers = workers
        self.created = False

    def setup(self) -> None:
        cleanup_leftovers()
        self.created = True  # from here on teardown must run, even if setup fails half-way
        sh(["ip", "link", "add", BRIDGE, "type", "bridge"])
        sh(["ip", "addr", "add", f"{HOST_IP}/24", "dev", BRIDGE])
        sh(["ip", "link", "set", BRIDGE, "up"])
        for i in range(self.nodes):
            self._add_ns(node_ns(i), node_ip(i), f"{VETH_PREFIX}n{i}")
        for i in range(self.workers):
            self._add_ns(worker_ns(i), worker_ip(i), f"{VETH_PREFIX}w{i}")

    def _add_ns(self, ns: str, ip: str, veth: str) -> None:
        peer = veth + "p"
        sh(["ip", "netns", "add", ns])
        sh(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
        sh(["ip", "link", "set", peer, "netns", ns])
        sh(["ip", "-n", ns, "link", "set", peer, "name", "eth0"])
        sh(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"])
        sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
        sh(["ip", "-n", ns, "link", "set", "lo", "up"])
        sh(["ip", "link", "set", veth, "master", BRIDGE])
        sh(["ip", "link", "set", veth, "up"])

    def teardown(self) -> None:
        if self.created:
            cleanup_leftovers()
            self.created = False

    # -- partitions -------------------------------------------------------

    @staticmethod
    def _ipt(ns: str, *rule: str) -> None:
        sh(["ip", "netns", "exec", ns, "iptables", "-w", *rule])

    def cut(self, a: int, b: int) -> None:
        """Nodes a and b cannot exchange packets (both directions, dropped in a's namespace)."""
        self._ipt(node_ns(a), "-A", "INPUT", "-s", node_ip(b), "-j", "DROP")
        self._ipt(node_ns(a), "-A", "OUTPUT", "-d", node_ip(b), "-j", "DROP")

    def cut_one_way(self, src: int, dst: int) -> None:
        """Packets from src never reach dst; dst's packets still reach src."""
        self._ipt(node_ns(dst), "-A", "INPUT", "-s", node_ip(src), "-j", "DROP")

    def isolate_worker(self, i: int) -> None:
        """The worker reaches nothing and nothing reaches it (loopback stays up)."""
        self._ipt(worker_ns(i), "-A", "INPUT", "!", "-i", "lo", "-j", "DROP")
        self._ipt(worker_ns(i), "-A", "OUTPUT", "!", "-o", "lo", "-j", "DROP")

    def heal_worker(self, i: int) -> None:
        self._ipt(worker_ns(i), "-F", "INPUT")
        self._ipt(worker_ns(i), "-F", "OUTPUT")

    def heal_nodes(self) -> None:
        for i in range(self.nodes):
            self._ipt(node_ns(i), "-F", "INPUT")
            self._ipt(node_ns(i), "-F", "OUTPUT")

    def heal_all(self) -> None:
        self.heal_nodes()
        for i in range(self.workers):
            self.heal_worker(i)
