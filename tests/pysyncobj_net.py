"""Real pysyncobj SyncObjs on an in-memory network the test drives by hand.

Nothing ticks on its own (autoTick off) and no message moves until the test
delivers it, so a test can replay the exact interleaving that shows a
misbehaviour: a late ack, a partition, an election at a chosen moment.
Messages cross the network pickled, as they do over TCP."""
from __future__ import annotations

import socket
from collections import deque
from typing import Any, Callable

import pysyncobj.pickle
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import Transport

from schedulerd.raft import pysyncobj_patches


class Replica(SyncObj):
    """A SyncObj whose state machine is the list of items applied (`applied`, which a
    snapshot carries); `seen` is every item this process ever applied, snapshot or not."""

    def __init__(self, addr: str, peers: list[str], conf: SyncObjConf, net: "Net") -> None:
        # Attributes set before SyncObj.__init__ are the node's own: no snapshot holds them.
        self.seen: list[Any] = []
        self.before_apply: Callable[[], None] | None = None  # called in apply, before the item is taken
        super().__init__(addr, peers, conf, transportClass=lambda obj, node, others: Link(net, node))
        self.applied: list[Any] = []

    def patched(self) -> None:
        """Call once patches are in: what they set on the replica stays out of its snapshots
        (pysyncobj's in-memory snapshot pickles the attributes set after it started)."""
        self._SyncObj__properies.update(key for key in vars(self) if key != "applied")

    @replicated
    def add(self, item: Any) -> int:
        if self.before_apply is not None:
            self.before_apply()
        self.seen.append(item)
        self.applied.append(item)
        return len(self.applied)


class _Conn:
    """Stands in for a TCP connection: a real socket to wait on, and its queue's size."""

    def __init__(self, net: "Net", src: Any, dst: Any) -> None:
        self._net, self._src, self._dst = net, src, dst
        self._sock, self._peer = socket.socketpair()
        self.state = CONNECTION_STATE.CONNECTED

    def fileno(self) -> int:
        return self._sock.fileno()

    def getSendBufferSize(self) -> int:
        return self._net.queued_bytes(self._src, self._dst)

    def _TcpConnection__trySendBuffer(self) -> None:
        """The network drains only when the test delivers."""

    def close(self) -> None:
        self._sock.close()
        self._peer.close()


class Link(Transport):
    """One node's end of the network."""

    def __init__(self, net: "Net", node: Any) -> None:
        super().__init__(None, node, [])
        self.net, self.node = net, node
        self._connections: dict[Any, _Conn] = {}
        self.known: set[str] = set()  # addresses it takes connections from, as TCPTransport's node map

    def send(self, node: Any, message: dict[str, Any]) -> bool:
        self.net.post(self.node, node, message)
        return True

    def addNode(self, node: Any) -> None:
        """A membership change added `node`: connect to it (if it runs) both ways."""
        self.known.add(node.address)
        self.net.connect(self.node.address, node.address)

    def dropNode(self, node: Any) -> None:
        self.known.discard(node.address)
        conn = self._connections.pop(node, None)
        if conn is not None:
            conn.close()


class Net:
    """The nodes, and the messages in flight between them in the order they were sent."""

    def __init__(self) -> None:
        self.replicas: dict[str, Replica] = {}
        self.flight: deque[tuple[Any, Any, bytes]] = deque()
        self.cut: set[str] = set()  # addresses whose messages are dropped both ways
        self.sent: list[tuple[str, str, dict[str, Any]]] = []  # every message posted, for inspection

    def start(self, addrs: list[str], conf: Callable[[str], SyncObjConf]) -> list[Replica]:
        for addr in addrs:
            self.replicas[addr] = Replica(addr, [a for a in addrs if a != addr], conf(addr), self)
            self.link(self.replicas[addr]).known = set(addrs) - {addr}
        for addr in addrs:
            for other in self.replicas[addr].otherNodes:
                self.connect(addr, other.address)
        return [self.replicas[a] for a in addrs]

    def add(self, addr: str, peers: list[str], conf: SyncObjConf) -> Replica:
        """Start one more node that knows `peers` (as a node joining a group does)."""
        self.replicas[addr] = replica = Replica(addr, peers, conf, self)
        self.link(replica).known = set(peers) - {addr}
        for peer in peers:
            self.connect(addr, peer)
        return replica

    def stop(self, addr: str) -> None:
        """Take a node off the network for good (its process ends)."""
        replica = self.replicas.pop(addr)
        for other in self.replicas.values():
            for node in list(self.link(other)._connections):
                if node.address == addr:
                    self.link(other)._connections.pop(node).close()
                    self.link(other)._onNodeDisconnected(node)
        for conn in self.link(replica)._connections.values():
            conn.close()
        replica.destroy()

    def connect(self, a: str, b: str) -> None:
        """Connect two running nodes (each side learns of the other only if it lists it)."""
        if a not in self.replicas or b not in self.replicas:
            return
        for src, dst in ((a, b), (b, a)):
            replica = self.replicas[src]
            link = self.link(replica)
            node = next((n for n in replica.otherNodes if n.address == dst), None)
            if node is not None and dst in link.known and node not in link._connections:
                link._connections[node] = _Conn(self, replica.selfNode, node)
                link._onNodeConnected(node)

    def link(self, replica: SyncObj) -> Link:
        return pysyncobj_patches.transport(replica)

    def post(self, src: Any, dst: Any, message: dict[str, Any]) -> None:
        self.sent.append((src.address, dst.address, message))
        if src.address in self.cut or dst.address in self.cut:
            return
        self.flight.append((src, dst, pysyncobj.pickle.dumps(message)))

    def queued_bytes(self, src: Any, dst: Any) -> int:
        return sum(len(data) for s, d, data in self.flight if s == src and d == dst)

    def in_flight(self) -> list[tuple[str, str, dict[str, Any]]]:
        return [(src.address, dst.address, pysyncobj.pickle.loads(data)) for src, dst, data in self.flight]

    def deliver(self, count: int | None = None, only: Callable[[str, str, dict[str, Any]], bool] | None = None) -> int:
        """Deliver up to `count` messages in flight (all, and those they cause, when None),
        each to the receiver's current callback; `only` picks which ones move."""
        done = 0
        while count is None or done < count:
            picked = next((m for m in self.flight
                           if only is None or only(m[0].address, m[1].address, pysyncobj.pickle.loads(m[2]))), None)
            if picked is None:
                break
            self.flight.remove(picked)
            src, dst, data = picked
            receiver = self.replicas.get(dst.address)
            # pysyncobj's TCP transport hangs up on a node it does not list (a removed one).
            if src.address in self.cut or dst.address in self.cut or receiver is None or \
                    src.address not in self.link(receiver).known:
                continue
            self.link(receiver)._onMessageReceivedCallback(src, pysyncobj.pickle.loads(data))
            done += 1
        return done

    def tick(self, *replicas: Replica, times: int = 1) -> None:
        for _ in range(times):
            for replica in replicas or tuple(self.replicas.values()):
                replica.doTick(0.0)

    def elect(self, replica: Replica) -> None:
        """Make `replica` stand for election now, and deliver until it has won."""
        replica._SyncObj__raftElectionDeadline = 0
        for _ in range(10):
            self.tick(replica)
            self.deliver()
            if replica._isLeader():
                return
        raise AssertionError(f"{replica.selfNode.address} was not elected")

    def settle(self, rounds: int = 20) -> None:
        """Tick everyone and deliver everything, `rounds` times."""
        for _ in range(rounds):
            self.tick()
            self.deliver()

    def close(self) -> None:
        for replica in self.replicas.values():
            for conn in self.link(replica)._connections.values():
                conn.close()
            replica.destroy()


def conf(**overrides: Any) -> SyncObjConf:
    """A conf for a hand-driven node: nothing happens because wall-clock time passed (no
    election, heartbeat or compaction is due); the test elects, ticks and delivers."""
    settings: dict[str, Any] = dict(
        autoTick=False, dynamicMembershipChange=False, appendEntriesUseBatch=False,
        raftMinTimeout=1e7, raftMaxTimeout=2e7, leaderFallbackTimeout=1e7,
        appendEntriesPeriod=1e6, connectionTimeout=2e7, logCompactionMinEntries=1 << 30,
        logCompactionMinTime=1 << 30, commandsWaitLeader=False)
    settings.update(overrides)
    return SyncObjConf(**settings)
