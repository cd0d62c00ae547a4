"""One simulation run: build the world, start the nodes, run the workload and the faults
the seed draws for the simulated hours asked, heal everything, let the cluster finish
what it owes, then check. Every event the run decides or observes goes into the trace,
whose digest the run ends with: the same seed gives the same digest."""
from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import shutil
import tempfile
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from pysyncobj import SyncObj

from schedulerd import join
from schedulerd.errors import Conflict, SchedulerError
from schedulerd.raft.conf import RaftConfig
from schedulerd.storage import queries
from schedulerd.storage.tables import last_applied
from schedulerd.units import US_PER_S

from tests.sim import checks
from tests.sim.disk import SimDisk
from tests.sim.faults import Nemesis
from tests.sim.net import NetConfig, SimNet, SimTransport, Ticker
from tests.sim.node import RAFT_PORT, Lost, SimNode
from tests.sim.workload import Workload
from tests.sim.world import Stopped, World

# After the faults stop: long enough for every one-off created (up to 15 min ahead), its
# retries (backoff, a 30 s lease running out) and the sweeps to be done.
SETTLE_S = 40 * 60.0
CONVERGE_S = 120.0


@dataclass
class Options:
    seed: int
    sim_hours: float = 1.0
    nodes: int = 3
    spares: int = 0  # machines that join (and replace) during the run: membership faults
    groups: int = 2
    net: str = "tcp"
    faults: bool = True
    rate_per_h: float = 240.0  # creates per simulated hour: a light workload
    workers: int = 4
    trace_tail: int = 60


@dataclass
class Result:
    verdict: str
    sim_hours: float
    digest: str
    problems: list[str]
    figures: dict[str, Any]
    tail: list[str] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)  # the daemon's last log lines, simulated time and node

    def last_line(self) -> str:
        return f"verdict={self.verdict} sim_hours={self.sim_hours:g} digest={self.digest}"


class _InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """asyncio.to_thread's executor: the call runs at once, on the loop (no real thread)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            fut.set_exception(exc)
        return fut


class Simulation:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.world = World(options.seed)
        self.net = SimNet(self.world, NetConfig(mode=options.net))
        self.disk = SimDisk(self.world)
        self._hash = hashlib.sha256()
        self._tail: deque[str] = deque(maxlen=options.trace_tail)
        self.raft_problems: list[str] = []
        self._applied: dict[tuple[Any, int], int] = {}
        self._leaders: dict[tuple[int, int], str] = {}
        self.nodes: list[SimNode] = []
        self.skews: list[tuple[float, int]] = []  # (sim time, largest forward offset from then on)
        self.root = ""
        self.nemesis = Nemesis(self, enabled=options.faults)

    # --- the trace ---

    def trace(self, line: str) -> None:
        stamped = f"{self.world.clock.elapsed_s:12.4f} {line}"
        self._hash.update(stamped.encode() + b"\n")
        self._tail.append(stamped)

    # --- observers of Raft, installed as patches ---

    def _saw_entry(self, group: Any, index: int, blob: bytes) -> None:
        crc = zlib.crc32(blob) ^ (len(blob) << 32)
        seen = self._applied.setdefault((group, index), crc)
        if seen != crc:
            self.raft_problems.append(f"committed entry changed: group {group} index {index} applied with two "
                                      f"different entries")

    def _saw_leader(self, address: str, term: int) -> None:
        key = (int(address.rpartition(":")[2]) - RAFT_PORT, term)
        seen = self._leaders.setdefault(key, address)
        if seen != address:
            self.raft_problems.append(f"two leaders in one term: group {key[0]} term {term}: {seen} and {address}")

    def _patches(self, patch: Callable[[Any, str, Any], None]) -> None:
        sim = self
        self.disk.installed(patch)
        SimTransport.net = self.net
        defaults = list(SyncObj.__init__.__defaults__)
        defaults[-1] = SimTransport
        patch(SyncObj.__init__, "__defaults__", tuple(defaults))
        patch(SyncObj, "destroy_synchronous", SyncObj.destroy)
        apply_command = SyncObj._applyCommand

        def proposed(self: SyncObj, *args: Any, **kwargs: Any) -> Any:
            result = apply_command(self, *args, **kwargs)
            ticker = getattr(self, "_sim_ticker", None)
            if ticker is not None:
                ticker.kick()
            return result

        patch(SyncObj, "_applyCommand", proposed)
        sync_conf = RaftConfig.sync_conf

        def hand_ticked(self: RaftConfig, journal_path: str, **extra: Any) -> Any:
            conf = sync_conf(self, journal_path, **extra)
            conf.autoTick = False
            conf.pollerType = "select"
            conf.connectionTimeout = max(conf.connectionTimeout, conf.raftMaxTimeout)  # TCP's only; pysyncobj checks it
            return conf

        patch(RaftConfig, "sync_conf", hand_ticked)
        do_apply = SyncObj._SyncObj__doApplyCommand

        def applied(self: SyncObj, command: bytes) -> Any:
            # Every entry pysyncobj applies (a new leader's no-op and membership changes
            # too); raftLastApplied + 1 is its index, as raft/group.py counts it.
            sim._saw_entry(getattr(self, "_sim_group", "?"), self.raftLastApplied + 1, command)
            return do_apply(self, command)

        patch(SyncObj, "_SyncObj__doApplyCommand", applied)
        tick = Ticker._tick

        def ticked(self: Ticker) -> None:
            tick(self)
            obj = self.syncobj
            if not self.stopped and obj._SyncObj__raftState == 2:
                sim._saw_leader(obj.selfNode.address, obj.raftCurrentTerm)

        patch(Ticker, "_tick", ticked)
        patch(join, "standing", self._standing)
        patch(join, "register", self._register)
        self.world.on_stop = self._on_stop

    async def _standing(self, https: list[str], node_id: str, tls: bool) -> str | None:
        """join.standing, asked of the simulated nodes a caller can reach."""
        asker = next((n for n in self.nodes if n.node is not None and n.node.topology is not None
                      and n.node.topology.node_id == node_id), None)
        for node in self.nodes:
            if node.http not in https or node.node is None or node.node.topology is None:
                continue
            if asker is not None and not self.reachable(asker, node):
                continue
            known = node.node.topology.meta.view()["nodes"].get(node_id)
            if known is not None:
                return str(known["state"])
        return None

    def reachable(self, a: SimNode, b: SimNode) -> bool:
        return b.up and (a.host, b.host) not in self.net.cut and (b.host, a.host) not in self.net.cut

    async def _register(self, config: Any, entry: dict[str, Any]) -> dict[str, Any]:
        """join.register: a member the joining node can reach registers it (api/nodes.register)."""
        joiner = next(n for n in self.nodes if n.host == config.http_host)
        problems = []
        for url in config.join:
            member = next((n for n in self.nodes if url == f"http://{n.http}"), None)
            if member is None or not self.reachable(joiner, member):
                problems.append(f"{url}: unreachable")
                continue

            async def register(member: SimNode = member) -> dict[str, Any]:
                assert member.node is not None and member.node.topology is not None
                return await member.node.topology.propose_checked(  # type: ignore[no-any-return]
                    {"op": "register", "node_id": entry["node_id"], "http": entry["http"], "raft": entry["raft"]})

            try:
                result = await member.serve(register)
            except Conflict as exc:
                return {"ok": False, "error": str(exc)}
            except (Lost, SchedulerError) as exc:
                problems.append(f"{url}: {exc}")
                continue
            return {"ok": True, "joined": result["joined"]}
        raise join.JoinError("could not register with any member: " + "; ".join(problems))

    def registry(self) -> dict[str, Any]:
        """The node registry as the most advanced metadata replica up has applied it."""
        best: dict[str, Any] = {}
        best_index = -1
        for node in self.nodes:
            if node.node is not None and node.node.topology is not None:
                meta = node.node.topology.meta
                if meta.replica.raftLastApplied > best_index:
                    best_index, best = meta.replica.raftLastApplied, meta.view()["nodes"]
        return best

    async def watch_registry(self) -> None:
        """A node the cluster removed or declared dead is retired, as an operator would stop it."""
        while True:
            await asyncio.sleep(10.0)
            nodes = self.registry()
            for node in self.nodes:
                known = nodes.get(node.node_id)
                if node.retired or known is None or known["state"] not in ("removed", "dead"):
                    continue
                self.trace(f"retire {node.name} ({node.node_id} {known['state']})")
                node.retired = True
                node.stop()
                self.nemesis.release_retired(node)

    def _on_stop(self, stop: Stopped) -> None:
        node = next((n for n in self.nodes if n.name == stop.node), None)
        if node is None or not node.up:
            return
        self.trace(f"exit {node.name} code={stop.code}: {stop}")
        node.crash(machine=False)
        if stop.code == 99:
            self.raft_problems.extend(self.net.errors)
            self.net.errors.clear()
        self.world.loop.call_later(self.world.rng.uniform(5.0, 30.0), self.restart, node, "after exit")

    def restart(self, node: SimNode, why: str) -> None:
        if node.up or node.retired or self.nemesis.holds(node):
            return
        self.trace(f"start {node.name} ({why})")
        node.start()

    # --- skew allowance for the early check ---

    def note_skew(self) -> None:
        largest = max([0] + [n.clock_offset_us for n in self.nodes])
        self.skews.append((self.world.clock.elapsed_s, largest))

    def skew_allowance_us(self, at_s: float) -> int:
        """The largest forward offset any node had in the 30 s before `at_s`."""
        allowance = 0
        for i, (since, largest) in enumerate(self.skews):
            until = self.skews[i + 1][0] if i + 1 < len(self.skews) else float("inf")
            if since <= at_s and until >= at_s - 30.0:
                allowance = max(allowance, largest)
        return allowance

    # --- the run ---

    def run(self) -> Result:
        self.root = tempfile.mkdtemp(prefix="schedulerd-sim-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        try:
            with self.world.installed(self._patches):
                self.world.loop.set_default_executor(_InlineExecutor(max_workers=1))
                return self.world.loop.run_until_complete(self._main())
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    async def _main(self) -> Result:
        opts = self.options
        first = [f"10.0.0.{i}:{RAFT_PORT}" for i in range(1, opts.nodes + 1)]
        self.nodes = [SimNode(self.world, self.net, self.disk, i, self.root, opts.groups, first)
                      for i in range(1, opts.nodes + opts.spares + 1)]
        self.note_skew()
        for node in self.nodes[:opts.nodes]:
            self.trace(f"start {node.name}")
            node.start()
        workload = Workload(self.world, self.nodes, self.trace, opts.rate_per_h, opts.workers)
        loop = self.world.loop
        tasks = [loop.create_task(workload.callers()), loop.create_task(self.nemesis.run()),
                 loop.create_task(self.watch_registry())]
        tasks += [loop.create_task(workload.worker(i)) for i in range(opts.workers)]
        await asyncio.sleep(opts.sim_hours * 3600.0)
        self.trace("faults stop; healing")
        await self.nemesis.heal_all()
        tasks[0].cancel()
        tasks[1].cancel()
        workers = tasks[3:]
        end_us = int(self.world.clock.wall() * US_PER_S)
        await asyncio.sleep(SETTLE_S)
        workload.stopping = True
        await asyncio.wait(workers, timeout=120.0)
        converged = await self._converge()
        stores = [(f"{n.name} group {g.group_id}", g.store) for n in self.nodes if n.node is not None
                  for g in n.node.groups]
        archives = [os.path.join(n.data_dir, "archive") for n in self.nodes]
        problems, figures = checks.check(workload.history, stores, archives, end_us, self.skew_allowance_us,
                                         self.raft_problems + converged)
        problems += [f"loop error: {e}" for e in self.world.loop_errors]
        figures.update({"crashes": sum(n.crashes for n in self.nodes), "faults": self.nemesis.count,
                        "messages": self.net.delivered, "dropped": self.net.dropped,
                        "entries_seen": len(self._applied), "syncs": self.disk.syncs})
        for line in sorted(f"figure {k}={v}" for k, v in figures.items()):
            self.trace(line)
        for problem in problems:
            self.trace(f"problem {problem}")
        for node in self.nodes:
            node.stop()
        for task in list(asyncio.all_tasks()):
            if task is not asyncio.current_task():
                task.cancel()
        sim_hours = round(self.world.clock.elapsed_s / 3600.0, 3)
        return Result("FAIL" if problems else "PASS", sim_hours, self._hash.hexdigest()[:16], problems, figures,
                      list(self._tail), list(self.world.log_tail)[-80:])

    async def _converge(self) -> list[str]:
        """Wait for every replica of each group to have applied the same entries; their digests."""
        deadline = self.world.clock.elapsed_s + CONVERGE_S
        while True:
            views: dict[int, dict[str, tuple[int, str]]] = {}
            for node in self.nodes:
                if node.node is None:
                    continue
                for group in node.node.groups:
                    with group.store.read() as txn:
                        views.setdefault(group.group_id, {})[node.name] = (
                            last_applied(txn, group.store.tables), queries.state_digest(txn, group.store.tables))
            differing = {g: v for g, v in views.items() if len(set(v.values())) > 1}
            if not differing or self.world.clock.elapsed_s >= deadline:
                for group_id, by_node in sorted(views.items()):
                    for name, (applied, digest) in sorted(by_node.items()):
                        self.trace(f"final group={group_id} {name} applied={applied} digest={digest[:12]}")
                return [f"replicas of group {g} differ after {CONVERGE_S:.0f} s: {v}" for g, v in differing.items()]
            await asyncio.sleep(1.0)


def run(options: Options) -> Result:
    return Simulation(options).run()

