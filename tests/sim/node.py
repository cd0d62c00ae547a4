"""One simulated machine running schedulerd: the daemon's own Node, LeaseQueue, LeaderLoops
and topology, on the simulated loop, network and disk. The sim's clients call the same
node-side code the HTTP handlers call (jobspec, the create and ack coalescers, the lease
queue, node.propose); HTTP itself and forwarding are the fault harness's to test."""
from __future__ import annotations

import asyncio
import os
import shutil
from typing import Any, Awaitable, Callable

from schedulerd import identity
from schedulerd.api.jobs import creates_coalescer
from schedulerd.api.tasks import TaskCommits
from schedulerd.clock import Clock
from schedulerd.config import NodeConfig
from schedulerd.leader import LeaderLoops
from schedulerd.lease_queue import LeaseQueue
from schedulerd.limits import Limits
from schedulerd.node import Node
from schedulerd.raft import journal, pysyncobj_patches
from schedulerd.raft.conf import RaftConfig

from tests.sim.disk import SimDisk
from tests.sim.net import SimNet, SimTransport
from tests.sim.world import World


class Lost(Exception):
    """The call's node went down before it answered (a reset connection)."""

RAFT_PORT = 7000
DEAD_NODE_TIMEOUT_S = 300.0
HTTP_PORT = 8000

# Raft timings stretched 20x from the defaults (heartbeat 1 s, elections 10-20 s): each
# heartbeat costs the simulator as much as in life, so fewer of them buy simulated hours.
# The relations raft/conf.py checks hold, and the fault harness runs the defaults.
SIM_RAFT = dict(election_timeout_s_min=10.0, election_timeout_s_max=20.0, append_entries_period_s=1.0,
                reconnect_s=2.0, leader_fallback_s=30.0, clock_fresh_s=20.0)


class SimNode:
    def __init__(self, world: World, net: SimNet, disk: SimDisk, index: int, root: str, groups: int,
                 first: list[str]) -> None:
        """`first`: the first nodes' Raft addresses; a node not among them is a spare, which
        joins the running cluster when the faults start it (`join`)."""
        self.world, self.net, self.disk = world, net, disk
        self.index = index
        self.name = f"n{index}"
        self.host = f"10.0.0.{index}"
        self.raft_addr = f"{self.host}:{RAFT_PORT}"
        self.http = f"{self.host}:{HTTP_PORT}"
        self.data_dir = os.path.join(root, self.name)
        self.groups = groups
        self.peers = [a for a in first if a != self.raft_addr] if self.raft_addr in first else []
        self.spare = self.raft_addr not in first
        self.join_urls: tuple[str, ...] = ()
        self.join_meta: tuple[str, ...] = ()
        self.retired = False  # removed or declared dead: never started again as this node
        self.clock_offset_us = 0
        self.node: Node | None = None
        self.leases: LeaseQueue | None = None
        self.loops: LeaderLoops | None = None
        self.creates: Any = None
        self.commits: TaskCommits | None = None
        self.incarnation = 0
        self.crashes = 0
        self.wipes = 0
        net.hosts[self.name] = self.host
        world.data_roots[self.name] = self.data_dir
        self._fresh_data_dir()

    def _fresh_data_dir(self) -> None:
        """An empty data dir with a node id of its own (a wiped machine is a new node)."""
        shutil.rmtree(self.data_dir, ignore_errors=True)
        os.makedirs(self.data_dir)
        with open(os.path.join(self.data_dir, identity.FILE), "w", encoding="ascii") as f:
            f.write(f"n-{self.index:06x}{self.wipes:06x}\n")
        self.disk.mark_all_durable(self.data_dir)

    @property
    def node_id(self) -> str:
        return f"n-{self.index:06x}{self.wipes:06x}"

    def wipe(self) -> None:
        """The operator wipes this (stopped) machine, to join it again as a new node."""
        assert self.node is None
        self.wipes += 1
        self.retired = False
        self._fresh_data_dir()
        self.spare = True
        self.join_urls = ()

    def join_through(self, members: list["SimNode"]) -> None:
        """Start as a new node of the running cluster (`--join` the members' URLs)."""
        self.join_urls = tuple(f"http://{m.http}" for m in members)
        member = next(m for m in members if m.node is not None and m.node.topology is not None)
        assert member.node is not None and member.node.topology is not None
        self.join_meta = tuple(member.node.topology.meta.members())
        self.start()

    async def serve(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Run fn as a request this node serves: it dies with the node's process (Lost)."""
        if self.node is None:
            raise Lost(f"{self.name} is down")
        task = self.world.run_in(self.name, self.world.loop.create_task, fn())
        await asyncio.wait({task})
        if task.cancelled():
            raise Lost(f"{self.name} went down while serving the request")
        return task.result()

    @property
    def up(self) -> bool:
        return self.node is not None

    def config(self) -> NodeConfig:
        raft = RaftConfig(self_addr=self.raft_addr, peers=tuple(self.peers), data_dir=self.data_dir,
                          groups=self.groups, compaction_entries_min=300, compaction_journal_ratio=0.0,
                          snapshot_write_bytes_per_s=0, lmdb_map_bytes=256 << 20, lmdb_writeback_s=0.0,
                          **SIM_RAFT)
        return NodeConfig(raft=raft, http_host=self.host, http_port=HTTP_PORT, lease_s=30.0,
                          scan_interval_s=5.0, lookahead_s=12.0, sweep_interval_s=30.0, propose_timeout_s=20.0,
                          replication_factor=3, meta_replicas=3, registry_interval_s=5.0,
                          join=self.join_urls if self.spare else (),
                          join_meta_peers=self.join_meta if self.spare and not os.path.exists(
                              os.path.join(self.data_dir, "meta.journal")) else (),
                          dead_node_timeout_s=DEAD_NODE_TIMEOUT_S, finished_ttl_s=3600.0,
                          archive_dir=os.path.join(self.data_dir, "archive"),
                          limits=Limits().overridden(("disk_free_bytes_min=1048576",)))

    def start(self) -> None:
        self.world.run_in(self.name, self._start)

    def _start(self) -> None:
        self.incarnation += 1
        node = Node(self.config(), Clock(offset_us=self.clock_offset_us))
        node.start(self.world.loop)
        self.node = node
        self.leases = LeaseQueue(node)
        self.loops = LeaderLoops(node)
        self.loops.start()
        self.creates = creates_coalescer(node)
        self.commits = TaskCommits(node)

    def set_clock_offset(self, offset_us: int) -> None:
        self.clock_offset_us = offset_us
        if self.node is not None:
            self.node.clock.offset_us = offset_us

    def crash(self, machine: bool) -> None:
        """The process dies (kill -9), or with `machine` the machine loses power: its disk
        keeps only what was synced, and its store is discarded at the next start."""
        node = self.node
        if node is None:
            return
        self.node = self.leases = self.loops = self.creates = self.commits = None
        self.crashes += 1
        self.world.kill_node_work(self.name)
        drop_after = self.net.config.silence_timeout_s if machine else 0.0
        replicas = [(g.replica, g.journal, g.store) for g in node._by_id.values()]
        if node.topology is not None:
            replicas.append((node.topology.meta.replica, node.topology.meta.journal, None))
        for replica, log, store in replicas:
            transport = pysyncobj_patches.transport(replica)
            if isinstance(transport, SimTransport):
                self.net.detach(transport, drop_after)
            log._close_files()
            pysyncobj_patches.close_notifier(replica)  # the process's descriptors die with it
            if journal._journals.get(log.path) is log:
                del journal._journals[log.path]
            if store is not None:
                store.abort_applied()
                store.env.close()
        for group in node._by_id.values():
            group._destroyed = True
        if machine:
            self.disk.crash_machine(self.data_dir, self.world.rng)
            self.world.boot_ids[self.name] = self.world.boot_ids.get(self.name, 0) + 1

    def stop(self) -> None:
        """A clean stop (the end of the run)."""
        node = self.node
        if node is None:
            return
        self.world.kill_node_work(self.name)
        self.world.run_in(self.name, node.stop)
        self.node = None
