"""The faults a seed draws, one after another with pauses between, some overlapping:

- crash: a node's process dies (kill -9) and restarts after a while;
- power: a node's machine loses power: its disk keeps only what was synced, its store is
  rebuilt from snapshot and journal at the restart;
- partition: one node cut off from the others, or the cluster split, healed later;
- one-way: one direction between two machines carries nothing (the connection drops
  after the silence timeout, and cannot form again until it heals);
- slow: a machine's messages take hundreds of milliseconds more;
- clock: a node's wall clock jumps ahead or back, within what docs/guarantees.md
  says the design tolerates (the cluster's median clock covers one skewed node);
- disk-low: a node's free space falls under the guard: it refuses writes and hands
  over leadership;
- disk-full: a node's disk fills at once: its next journal write fails and the node
  stops; it is restarted once space returns.

With spare machines (`--spares`), membership changes too:

- join: a spare machine joins the running cluster (`--join`);
- remove: a node is drained (`schedctl cluster remove-node`); once removed it is stopped;
- dead: a node's machine goes down for good: the cluster declares it dead after the
  dead-node timeout and re-creates its replicas on the others;
- replace: a retired machine (removed, or declared dead) is wiped and joins as a new node."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from schedulerd.errors import SchedulerError
from schedulerd.storage.placement import SERVES
from schedulerd.units import US_PER_S

from tests.sim.node import Lost

if TYPE_CHECKING:
    from tests.sim.node import SimNode
    from tests.sim.run import Simulation

FAULTS = ("crash", "power", "partition", "one-way", "slow", "clock", "disk-low", "disk-full")
MEMBERSHIP = ("join", "remove", "dead", "replace")
SERVING_MIN = 3  # membership faults never take the cluster below this many serving nodes
MEAN_GAP_S = 300.0
CLOCK_JUMP_S_MAX = 2.0


class Nemesis:
    def __init__(self, sim: "Simulation", enabled: bool) -> None:
        self.sim = sim
        self.world = sim.world
        self.rng = sim.world.rng
        self.enabled = enabled
        self.count = 0
        self._held: set[str] = set()  # nodes a fault keeps down
        self._ends: list[asyncio.TimerHandle] = []

    def holds(self, node: "SimNode") -> bool:
        return node.name in self._held

    async def run(self) -> None:
        if not self.enabled:
            return
        while True:
            await asyncio.sleep(self.rng.expovariate(1.0 / MEAN_GAP_S))
            kind = self.rng.choice(FAULTS + (MEMBERSHIP if self.sim.options.spares else ()))
            # A spare that never joined is no machine of the cluster yet: started after a
            # fault as if it were one, it would bootstrap a cluster of its own.
            node = self.rng.choice([n for n in self.sim.nodes if n.incarnation > 0])
            self.count += 1
            getattr(self, "_" + kind.replace("-", "_"))(node)

    def _later(self, seconds: float, fn: Any, *args: Any) -> None:
        self._ends.append(self.world.loop.call_later(seconds, fn, *args))

    def _down_for(self, node: "SimNode", machine: bool, seconds: float, what: str) -> None:
        if not node.up or node.name in self._held:
            return
        self.sim.trace(f"fault {what} {node.name} for {seconds:.1f}s")
        self._held.add(node.name)
        node.crash(machine=machine)
        self._later(seconds, self._release, node, what)

    def _release(self, node: "SimNode", what: str) -> None:
        self._held.discard(node.name)
        self.sim.restart(node, f"{what} over")

    def _crash(self, node: "SimNode") -> None:
        self._down_for(node, False, self.rng.uniform(2.0, 120.0), "crash")

    def _power(self, node: "SimNode") -> None:
        self._down_for(node, True, self.rng.uniform(10.0, 300.0), "power")

    def _partition(self, node: "SimNode") -> None:
        hosts = [n.host for n in self.sim.nodes]
        if self.rng.random() < 0.5:
            side = {node.host}
        else:
            side = set(self.rng.sample(hosts, max(1, len(hosts) // 2)))
        cut = {(a, b) for a in side for b in hosts if b not in side} | {(b, a) for a in side for b in hosts if b not in side}
        seconds = self.rng.uniform(5.0, 300.0)
        self.sim.trace(f"fault partition {sorted(side)} for {seconds:.1f}s")
        self.sim.net.set_cut(self.sim.net.cut | cut)
        self._later(seconds, self._heal_cut, cut)

    def _one_way(self, node: "SimNode") -> None:
        other = self.rng.choice([n for n in self.sim.nodes if n is not node])
        cut = {(node.host, other.host)}
        seconds = self.rng.uniform(5.0, 120.0)
        self.sim.trace(f"fault one-way {node.name}->{other.name} for {seconds:.1f}s")
        self.sim.net.set_cut(self.sim.net.cut | cut)
        self._later(seconds, self._heal_cut, cut)

    def _heal_cut(self, cut: set[tuple[str, str]]) -> None:
        self.sim.trace(f"heal cut {sorted(cut)}")
        self.sim.net.set_cut(self.sim.net.cut - cut)

    def _slow(self, node: "SimNode") -> None:
        extra = self.rng.uniform(0.05, 0.8)
        seconds = self.rng.uniform(10.0, 300.0)
        self.sim.trace(f"fault slow {node.name} +{extra * 1000:.0f}ms for {seconds:.1f}s")
        self.sim.net.slow[node.host] = extra
        self._later(seconds, self._fast, node)

    def _fast(self, node: "SimNode") -> None:
        self.sim.trace(f"heal slow {node.name}")
        self.sim.net.slow.pop(node.host, None)

    def _clock(self, node: "SimNode") -> None:
        if any(n.clock_offset_us for n in self.sim.nodes if n is not node):
            return  # one skewed clock at a time: the median covers one
        offset = int(self.rng.uniform(-CLOCK_JUMP_S_MAX, CLOCK_JUMP_S_MAX) * US_PER_S)
        seconds = self.rng.uniform(10.0, 600.0)
        self.sim.trace(f"fault clock {node.name} {offset / US_PER_S:+.3f}s for {seconds:.1f}s")
        node.set_clock_offset(offset)
        self.sim.note_skew()
        self._later(seconds, self._clock_back, node)

    def _clock_back(self, node: "SimNode") -> None:
        self.sim.trace(f"heal clock {node.name}")
        node.set_clock_offset(0)
        self.sim.note_skew()

    def _disk_low(self, node: "SimNode") -> None:
        seconds = self.rng.uniform(10.0, 300.0)
        self.sim.trace(f"fault disk-low {node.name} for {seconds:.1f}s")
        self.world.low_disks.add(node.name)
        self._later(seconds, self._disk_room, node)

    def _disk_full(self, node: "SimNode") -> None:
        if node.name in self._held:
            return
        seconds = self.rng.uniform(10.0, 300.0)
        self.sim.trace(f"fault disk-full {node.name} for {seconds:.1f}s")
        self.world.full_disks.add(node.name)
        self._held.add(node.name)  # a node that stops on it is restarted once space returns
        self._later(seconds, self._disk_room, node)

    def _disk_room(self, node: "SimNode") -> None:
        self.sim.trace(f"heal disk {node.name}")
        self.world.low_disks.discard(node.name)
        if node.name in self.world.full_disks:
            self.world.full_disks.discard(node.name)
            self._release(node, "disk-full")

    def _serving(self) -> list["SimNode"]:
        registry = self.sim.registry()
        return [n for n in self.sim.nodes if not n.retired and registry.get(n.node_id, {}).get("state") in SERVES]

    def _members_up(self) -> list["SimNode"]:
        return [n for n in self._serving() if n.up]

    def _join(self, node: "SimNode") -> None:
        registry = self.sim.registry()
        spares = [n for n in self.sim.nodes if n.spare and not n.up and not n.retired
                  and n.node_id not in registry and n.name not in self._held]
        members = self._members_up()
        if spares and members:
            self.sim.trace(f"fault join {spares[0].name} as {spares[0].node_id}")
            spares[0].join_through(members)

    def _remove(self, node: "SimNode") -> None:
        registry = self.sim.registry()
        serving = [n for n in self._serving() if registry[n.node_id]["state"] != "draining"]
        members = self._members_up()
        if len(serving) <= SERVING_MIN or not members:
            return
        target, via = self.rng.choice(serving), self.rng.choice(members)
        self.sim.trace(f"fault remove {target.name} ({target.node_id}) via {via.name}")

        async def drain() -> None:
            assert via.node is not None and via.node.topology is not None
            await via.node.topology.propose_checked({"op": "set_state", "node_id": target.node_id,
                                                     "state": "draining"})

        self.world.loop.create_task(self._quietly(via, drain))

    async def _quietly(self, via: "SimNode", fn: Any) -> None:
        try:
            await via.serve(fn)
        except (Lost, SchedulerError) as exc:
            self.sim.trace(f"membership request via {via.name} failed: {exc}")

    def _dead(self, node: "SimNode") -> None:
        serving = self._members_up()
        if len(serving) <= SERVING_MIN:
            return
        target = self.rng.choice(serving)
        if target.name in self._held:
            return
        self.sim.trace(f"fault dead {target.name} ({target.node_id}): its machine is gone")
        self._held.add(target.name)
        target.crash(machine=True)

    def _replace(self, node: "SimNode") -> None:
        retired = [n for n in self.sim.nodes if n.retired and not n.up]
        members = self._members_up()
        if not retired or not members:
            return
        target = retired[0]
        target.wipe()
        self.sim.trace(f"fault replace {target.name}: wiped, joins as {target.node_id}")
        target.join_through(members)

    def release_retired(self, node: "SimNode") -> None:
        self._held.discard(node.name)

    async def heal_all(self) -> None:
        """End every fault now and start every node that is down."""
        for handle in self._ends:
            handle.cancel()
        self._ends.clear()
        self._held.clear()
        self.world.low_disks.clear()
        self.world.full_disks.clear()
        self.sim.net.slow.clear()
        self.sim.net.set_cut(set())
        for node in self.sim.nodes:
            node.set_clock_offset(0)
            if not node.up and not node.retired and not (node.spare and node.incarnation == 0):
                self.sim.restart(node, "healing")
        self.sim.note_skew()
