"""The simulated network under pysyncobj, and the ticks that drive every replica.

Each SyncObj gets a `SimTransport` (pysyncobj's pluggable transport) instead of TCP.
Two replicas that list each other are connected, as pysyncobj's TCP transport
connects them, unless one side is down or a link between their machines is cut; a
connection forms again a moment after it may. Over TCP a connection is FIFO and loses
nothing while it lasts: a message is lost only with the connection it was on (a reset,
a crash, a partition). The `chaos` mode drops that promise (messages are lost,
duplicated and reordered one by one, a forwarded proposal never duplicated) to test
the Raft logic beyond what TCP allows.

Nothing ticks on its own (autoTick off). A replica ticks when a message reaches it,
when something is proposed on it, at its next Raft deadline (heartbeat, election) and
at least every IDLE_TICK_S; a heartbeat or its answer that leaves nothing to commit or
apply does not make one (pysyncobj handled it in full on receipt)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pysyncobj.pickle
from pysyncobj import SyncObj
from pysyncobj.node import Node
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import Transport

from tests.sim.world import Stopped, World, current_node

IDLE_TICK_S = 2.0
# A proposal a follower forwards to its leader is appended once per copy that arrives:
# like any Raft without client sessions, pysyncobj counts on its connection never to
# deliver one twice, which TCP keeps. Chaos mode loses and reorders these, never copies.
AT_MOST_ONCE = frozenset({"apply_command"})
# A tick follows a message or a proposal this soon: the time a node takes to get to it.
TICK_AFTER_S = 0.0005


@dataclass
class NetConfig:
    mode: str = "tcp"  # or "chaos"
    delay_s: tuple[float, float] = (0.0002, 0.002)
    # chaos mode only: per-message loss and duplication
    loss: float = 0.02
    duplicate: float = 0.02
    reconnect_s: float = 1.0  # at most this long before a connection forms again
    silence_timeout_s: float = 3.5  # a peer that went silent (power, partition) is dropped after this


class _Conn:
    """What the daemon's patches read of a TCP connection (its state and send queue), and
    the address at its other end."""
    state = CONNECTION_STATE.CONNECTED

    def __init__(self, address: str) -> None:
        self.address = address

    def getSendBufferSize(self) -> int:
        return 0


class Ticker:
    def __init__(self, net: "SimNet", syncobj: SyncObj, owner: str) -> None:
        self.net, self.syncobj, self.owner = net, syncobj, owner
        self.handle: asyncio.TimerHandle | None = None
        self.at = float("inf")
        self.stopped = False
        self.ticks = 0

    def kick(self, delay: float = TICK_AFTER_S) -> None:
        self.schedule(self.net.world.loop.time() + delay)

    def schedule(self, at: float) -> None:
        if self.stopped or at >= self.at:
            return
        if self.handle is not None:
            self.handle.cancel()
        self.at = at
        self.handle = self.net.world.loop.call_at(at, self._tick)

    def work_after(self, message: Any) -> bool:
        """Whether the replica has something to do in a tick after receiving `message`."""
        if not isinstance(message, dict) or message.get("type") not in ("append_entries", "next_node_idx"):
            return True
        obj = self.syncobj
        commit = obj._SyncObj__raftCommitIndex
        return commit > obj._SyncObj__raftLastApplied or (
            obj._SyncObj__raftState == 2 and commit < obj._SyncObj__raftLog[-1][1])

    def stop(self) -> None:
        self.stopped = True
        if self.handle is not None:
            self.handle.cancel()

    def _tick(self) -> None:
        self.handle, self.at = None, float("inf")
        if self.stopped:
            return
        self.ticks += 1
        token = current_node.set(self.owner)
        try:
            self.syncobj.doTick(0.0)
        except Stopped as stop:
            self.net.world.stopped(stop)
            return
        except Exception as exc:  # pysyncobj's tick raising freezes a real node's Raft work
            self.net.errors.append(f"{self.owner}: tick raised {exc!r}")
            self.net.world.stopped(Stopped(self.owner, 99))
            return
        finally:
            current_node.reset(token)
        now = self.net.world.loop.time()
        obj = self.syncobj
        if obj._SyncObj__raftState == 2:  # leader
            due = obj._SyncObj__newAppendEntriesTime
        else:
            due = obj._SyncObj__raftElectionDeadline
        # A deadline already past stays past while the replica waits for something else (an
        # election waits for a connection, whose arrival ticks it): look again when idle.
        self.schedule(min(due if due > now else now + IDLE_TICK_S, now + IDLE_TICK_S))


class SimTransport(Transport):
    net: "SimNet"  # set by the simulation before any SyncObj is made

    def __init__(self, syncObj: SyncObj, selfNode: Any, otherNodes: Any) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self.net = SimTransport.net
        self.syncobj = syncObj
        self.owner = current_node.get() or "?"
        # A read-only replica (an observer) has no Raft address: it connects to the nodes it
        # lists, which take it as a read-only node, as pysyncobj's TCP transport does.
        self.observer = selfNode is None
        self.nodes: dict[str, Any] = {node.address: node for node in otherNodes}
        port = next(iter(self.nodes)).rpartition(":")[2] if self.nodes else "0"
        self.address: str = f"{self.net.hosts[self.owner]}:ro{port}" if self.observer else selfNode.address
        syncObj._sim_group = self.address.rpartition(":")[2].removeprefix("ro")  # the group's port
        self.readonly: dict[str, Any] = {}  # observers connected here, by their sim address
        self._connections: dict[Any, _Conn] = {}
        self.ticker = Ticker(self.net, syncObj, self.owner)
        syncObj._sim_ticker = self.ticker
        self.net.attach(self)
        self.ticker.kick()

    @property
    def ready(self) -> bool:
        return True

    def tryGetReady(self) -> None:
        pass

    def send(self, node: Any, message: Any) -> bool:
        if node not in self._connections:
            return False
        self.net.post(self, self._connections[node].address, message)
        return True

    def addNode(self, node: Any) -> None:
        self.nodes[node.address] = node
        self.net.reconcile()

    def dropNode(self, node: Any) -> None:
        self.nodes.pop(node.address, None)
        self.net.reconcile()

    def destroy(self) -> None:
        self.ticker.stop()
        self.net.detach(self, drop_after_s=0.0)

    def sender(self, address: str) -> Any:
        """The node object a message from `address` arrives from here, or None (not listed)."""
        return self.nodes.get(address) or self.readonly.get(address)

    def connected(self, address: str, observer: bool) -> None:
        if observer:
            node = Node(f"readonly-{address}")
            self.readonly[address] = node
            self._connections[node] = _Conn(address)
            self.net.world.run_in(self.owner, self._onReadonlyNodeConnected, node)
        else:
            node = self.nodes.get(address)
            if node is None or node in self._connections:
                return
            self._connections[node] = _Conn(address)
            self.net.world.run_in(self.owner, self._onNodeConnected, node)
        self.ticker.kick()

    def disconnected(self, address: str) -> None:
        node = next((n for n, c in self._connections.items() if c.address == address), None)
        if node is None:
            return
        del self._connections[node]
        if self.readonly.pop(address, None) is not None:
            self.net.world.run_in(self.owner, self._onReadonlyNodeDisconnected, node)
        else:
            self.net.world.run_in(self.owner, self._onNodeDisconnected, node)
        self.ticker.kick()


def host_of(address: str) -> str:
    return address.rpartition(":")[0]


@dataclass
class _Pair:
    """One connection between two replicas, its state and each direction's FIFO tail."""
    connected: bool = False
    epoch: int = 0
    pending: asyncio.TimerHandle | None = None
    tail: dict[str, float] = field(default_factory=dict)


class SimNet:
    def __init__(self, world: World, config: NetConfig) -> None:
        self.world = world
        self.config = config
        self.transports: dict[str, SimTransport] = {}
        self.hosts: dict[str, str] = {}  # node name -> its machine's host
        self.cut: set[tuple[str, str]] = set()  # (from host, to host) directions that carry nothing
        self.slow: dict[str, float] = {}  # host -> extra one-way delay
        self.pairs: dict[tuple[str, str], _Pair] = {}
        self.errors: list[str] = []
        self.delivered = 0
        self.dropped = 0

    # --- membership of the network ---

    def attach(self, transport: SimTransport) -> None:
        old = self.transports.get(transport.address)
        if old is not None and old is not transport:
            self.detach(old, drop_after_s=0.0)
        self.transports[transport.address] = transport
        self.reconcile()

    def detach(self, transport: SimTransport, drop_after_s: float) -> None:
        """A replica is gone: its peers see their connections to it drop after `drop_after_s`
        (at once when its process ended and the kernel reset them; after the silence
        timeout when its machine lost power)."""
        if self.transports.get(transport.address) is not transport:
            return
        del self.transports[transport.address]
        transport.ticker.stop()
        for key, pair in list(self.pairs.items()):
            if transport.address in key and pair.connected:
                self._schedule(key, pair, False, drop_after_s)
        self.reconcile()

    def _linked(self, ta: SimTransport, tb: SimTransport) -> bool:
        """Whether the two replicas would connect: two voters that list each other, or an
        observer and a voter it lists."""
        if ta.observer or tb.observer:
            return not (ta.observer and tb.observer) and (tb.address in ta.nodes or ta.address in tb.nodes)
        return tb.address in ta.nodes and ta.address in tb.nodes

    def _wanted(self, a: str, b: str) -> bool:
        ta, tb = self.transports.get(a), self.transports.get(b)
        if ta is None or tb is None or not self._linked(ta, tb):
            return False
        ha, hb = host_of(a), host_of(b)
        return (ha, hb) not in self.cut and (hb, ha) not in self.cut

    def reconcile(self) -> None:
        """Start connecting or dropping every pair whose state differs from what it may be."""
        addresses = sorted(self.transports)
        keys = {(a, b) for i, a in enumerate(addresses) for b in addresses[i + 1:]
                if self._linked(self.transports[a], self.transports[b])}
        keys |= {key for key, pair in self.pairs.items() if pair.connected}
        for key in sorted(keys):
            pair = self.pairs.setdefault(key, _Pair())
            wanted = self._wanted(*key)
            if wanted != pair.connected and pair.pending is None:
                if wanted:
                    delay = self.world.rng.uniform(0.0, self.config.reconnect_s)
                else:
                    gone = key[0] not in self.transports or key[1] not in self.transports
                    delay = 0.0 if gone else self.world.rng.uniform(0.2, self.config.silence_timeout_s)
                self._schedule(key, pair, wanted, delay)

    def _schedule(self, key: tuple[str, str], pair: _Pair, connect: bool, delay: float) -> None:
        if pair.pending is not None:
            pair.pending.cancel()
        pair.pending = self.world.loop.call_later(delay, self._settle, key, connect)

    def _settle(self, key: tuple[str, str], connect: bool) -> None:
        pair = self.pairs[key]
        pair.pending = None
        if connect != self._wanted(*key):
            self.reconcile()
            return
        if connect == pair.connected:
            return
        pair.connected = connect
        pair.epoch += 1
        pair.tail.clear()
        for here, there in (key, key[::-1]):
            transport = self.transports.get(here)
            if transport is None:
                continue
            if connect:
                transport.connected(there, self.transports[there].observer)
            else:
                transport.disconnected(there)
        self.reconcile()

    # --- messages ---

    def post(self, src: SimTransport, dst: str, message: Any) -> None:
        key = (src.address, dst) if src.address < dst else (dst, src.address)
        pair = self.pairs.get(key)
        if pair is None or not pair.connected:
            return
        if (host_of(src.address), host_of(dst)) in self.cut:
            self.dropped += 1
            return
        rng, loop = self.world.rng, self.world.loop
        data = pysyncobj.pickle.dumps(message)
        delay = rng.uniform(*self.config.delay_s) + self.slow.get(host_of(src.address), 0.0) \
            + self.slow.get(host_of(dst), 0.0)
        at = loop.time() + delay
        copies = 1
        if self.config.mode == "chaos":
            if rng.random() < self.config.loss:
                self.dropped += 1
                return
            duplicated = rng.random() < self.config.duplicate
            copies += duplicated and message.get("type") not in AT_MOST_ONCE
        else:
            at = max(at, pair.tail.get(dst, 0.0))  # one TCP stream per direction: in order
            pair.tail[dst] = at
        for copy in range(copies):
            loop.call_at(at + copy * rng.uniform(0.0, 0.01), self._deliver, src.address, dst, key, pair.epoch, data)

    def _deliver(self, src: str, dst: str, key: tuple[str, str], epoch: int, data: bytes) -> None:
        pair = self.pairs.get(key)
        transport = self.transports.get(dst)
        if pair is None or pair.epoch != epoch or not pair.connected or transport is None \
                or (host_of(src), host_of(dst)) in self.cut:
            self.dropped += 1
            return
        node = transport.sender(src)
        if node is None:
            self.dropped += 1
            return
        self.delivered += 1
        token = current_node.set(transport.owner)
        message = pysyncobj.pickle.loads(data)
        try:
            transport._onMessageReceivedCallback(node, message)
        except Stopped as stop:
            self.world.stopped(stop)
        except Exception as exc:
            self.errors.append(f"{transport.owner}: receiving from {src} raised {exc!r}")
            self.world.stopped(Stopped(transport.owner, 99))
        finally:
            current_node.reset(token)
        if transport.ticker.work_after(message):
            transport.ticker.kick()

    # --- faults ---

    def set_cut(self, cut: set[tuple[str, str]]) -> None:
        self.cut = set(cut)
        self.reconcile()
