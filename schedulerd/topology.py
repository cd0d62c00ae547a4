"""This node's part in the cluster's topology: its id, its replica of the metadata group,
keeping its entry in the node registry current, and (on the metadata group's leader)
bootstrapping the cluster once every first node has registered."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from schedulerd import identity, liveness
from schedulerd.config import NodeConfig
from schedulerd.raft.conf import group_addr
from schedulerd.raft.meta_group import MetaGroup
from schedulerd.raft.proposals import ProposalFailed
from schedulerd.storage import meta

log = logging.getLogger("schedulerd.topology")

# A refused registration is a committed entry too, and the metadata log is never
# compacted: one that was refused is not tried again before this.
REFUSED_RETRY_S = 60.0


class Topology:
    def __init__(self, config: NodeConfig, now_us: Callable[[], int], on_fatal: Callable[[str], None]) -> None:
        self.config = config
        self.node_id = identity.node_id(config.raft.data_dir)
        self.http = f"{config.http_host}:{config.http_port}"
        addr, peers = config.raft.meta_addrs()
        self.meta = MetaGroup(addr, peers, config.raft, on_fatal)
        self._now_us = now_us
        self._task: asyncio.Task[None] | None = None
        self._refused_until = 0.0
        self._evicted_logged = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._task = loop.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.meta.destroy()

    async def _run(self) -> None:
        while True:
            try:
                await self._step()
            except ProposalFailed as exc:
                log.debug("topology_proposal_failed %s", exc)
            except asyncio.TimeoutError:
                log.debug("topology_proposal_timed_out")
            except Exception:
                log.exception("topology_step_failed")
            await asyncio.sleep(self.config.registry_interval_s)

    def evicted(self) -> str | None:
        """Why this node may no longer serve (the registry says it is dead or removed), or None."""
        me = self.meta.view()["nodes"].get(self.node_id)
        if me is None or me["state"] not in ("dead", "removed"):
            return None
        return (f"this node ({self.node_id}) was declared {me['state']} by the cluster: wipe its data dir "
                "and start it again to join as a new node")

    async def _step(self) -> None:
        view = self.meta.view()
        me = view["nodes"].get(self.node_id)
        reason = self.evicted()
        if reason is not None and not self._evicted_logged:
            self._evicted_logged = True
            log.error("node_evicted %s", reason)
        loop = asyncio.get_running_loop()
        if (me is None or me["http"] != self.http) and loop.time() >= self._refused_until:
            result = await self._propose({"op": "register", "node_id": self.node_id, "http": self.http,
                                          "raft": self.config.raft.self_addr})
            if result["ok"]:
                log.info("node_registered node_id=%s http=%s raft=%s joined=%s", self.node_id, self.http,
                         self.config.raft.self_addr, result["joined"])
            else:
                self._refused_until = loop.time() + REFUSED_RETRY_S
                log.error("node_registration_refused node_id=%s: %s", self.node_id, result["error"])
            view = self.meta.view()
        if view["cluster"] is None and self.meta.is_leader():
            first = [self.config.raft.self_addr, *self.config.raft.peers]
            registered = {n["raft"] for n in view["nodes"].values()}
            if all(addr in registered for addr in first):
                result = await self._propose({
                    "op": "bootstrap", "cluster_id": self.node_id, "groups": self.config.raft.groups,
                    "replication_factor": self.config.first_replication_factor(),
                    "meta_replicas": self.config.meta_replicas, "raft_addrs": first})
                log.info("cluster_bootstrap %s", result)
        if view["cluster"] is not None and self.meta.is_leader():
            await self._judge_liveness(view)

    async def _judge_liveness(self, view: dict[str, Any]) -> None:
        """On the metadata leader: suspect, dead or alive again, by how long each member of
        the metadata group has been silent (schedulerd/liveness.py)."""
        silent = {**self._silence_by_node(view), self.node_id: 0.0}
        states = {node_id: n["state"] for node_id, n in view["nodes"].items()}
        for node_id, state in liveness.transitions(states, silent, self.config.suspect_after_s(),
                                                   self.config.dead_node_timeout_s):
            result = await self._propose({"op": "set_state", "node_id": node_id, "state": state})
            log.warning("node_%s node_id=%s silent_s=%.1f %s", state, node_id, silent[node_id],
                        "" if result["ok"] else result["error"])

    async def _propose(self, command: dict[str, Any]) -> dict[str, Any]:
        command["now"] = self._now_us()
        result: dict[str, Any] = await asyncio.wait_for(self.meta.propose(command, asyncio.get_running_loop()),
                                                         self.config.propose_timeout_s)
        return result

    def _silence_by_node(self, view: dict[str, Any]) -> dict[str, float]:
        """On the metadata leader: seconds each other member has been silent, by node id."""
        by_meta_addr = {group_addr(n["raft"], self.config.raft.groups): node_id for node_id, n in view["nodes"].items()}
        return {by_meta_addr[a]: s for a, s in self.meta.silence_s().items() if a in by_meta_addr}

    def figures(self, leaders: dict[int, str | None]) -> dict[str, Any]:
        """What /metrics shows of the topology (schedulerd/metrics.py)."""
        view = self.meta.view()
        status = self.status(leaders, view)
        by_state: dict[str, int] = {state: 0 for state in meta.TRANSITIONS}
        for n in view["nodes"].values():
            by_state[n["state"]] += 1
        keeps = {n["node_id"] for n in view["nodes"].values() if n["state"] in ("alive", "suspect")}
        rf = (view["cluster"] or {}).get("replication_factor", 0)
        under = sum(1 for members in meta.data_placement(view).values() if len(keeps.intersection(members)) < rf)
        leads = [len(n["leads"]) for n in status["nodes"] if n["state"] == "alive"]
        silence = self._silence_by_node(view)
        return {"nodes_by_state": by_state, "under_replicated": under,
                "leader_imbalance": max(leads) - min(leads) if leads else 0,
                "moves": dict(view["moves"]), "silence_s": silence}

    def status(self, leaders: dict[int, str | None], view: dict[str, Any] | None = None) -> dict[str, Any]:
        """The registry and the placement as this node's metadata replica has them; `leaders`
        gives each local data group's leader by Raft address (group g's is the node's + g)."""
        view = self.meta.view() if view is None else view
        by_raft = {n["raft"]: node_id for node_id, n in view["nodes"].items()}
        led: dict[str, list[int]] = {}
        for group, address in leaders.items():
            node_id = by_raft.get(_base(address, group)) if address is not None else None
            if node_id is not None:
                led.setdefault(node_id, []).append(group)
        nodes = []
        for node_id, n in sorted(view["nodes"].items()):
            holds = sorted(int(g) for g, members in view["placement"].items() if g != meta.META and node_id in members)
            nodes.append({**n, "groups": holds, "leads": sorted(led.get(node_id, []))})
        meta_leader = self.meta.leader()
        return {
            "node_id": self.node_id,
            "cluster": view["cluster"],
            "placement_epoch": view["epoch"],
            "nodes": nodes,
            "meta": {"members": view["placement"].get(meta.META, []),
                     "leader_node": by_raft.get(_base(meta_leader, self.config.raft.groups)) if meta_leader else None,
                     "raft_members": self.meta.members(),
                     "changes": view["changes"]},
        }


def _base(address: str, group: int) -> str:
    """The node's Raft address (its group 0's) from its address in group `group`."""
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) - group}"
