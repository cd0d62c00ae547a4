"""This node's part in the cluster's topology: its id, its replica of the metadata group,
keeping its entry in the node registry current, its data replicas kept to the placement
(replicas.py), the changes it carries out as a group's leader (group_changes.py) and, on the
metadata group's leader, bootstrapping the cluster once every first node has registered,
judging liveness and driving the placement (placement_driver.py)."""
from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING, Any, Callable

from schedulerd import identity, join, liveness, replicas
from schedulerd.errors import Conflict, OutcomeUnknown, Unavailable
from schedulerd.group_changes import GroupChanges
from schedulerd.placement_driver import PlacementDriver
from schedulerd.raft.conf import group_addr
from schedulerd.raft.meta_group import MetaGroup
from schedulerd.raft.proposals import ProposalFailed
from schedulerd.storage import meta, meta_voters, placement

if TYPE_CHECKING:
    from schedulerd.node import Node

log = logging.getLogger("schedulerd.topology")

# A refused registration is a committed entry too, and the metadata log is never
# compacted: one that was refused is not tried again before this.
REFUSED_RETRY_S = 60.0
# A metadata replica with no leader for this long asks the other nodes whether it is still in the cluster.
STANDING_AFTER_S = 5.0


class Topology:
    def __init__(self, node: "Node", on_fatal: Callable[[str], None]) -> None:
        config = node.config
        self.config = config
        self.node = node
        self.node_id = identity.node_id(config.raft.data_dir)
        self.http = f"{config.http_host}:{config.http_port}"
        addr, peers = config.raft.meta_addrs()
        # The voters as of the metadata log's first entry: the first nodes, or for a node
        # that joins the voters it was told of (it starts as an observer).
        self._first_meta = list(config.join_meta_peers) if config.join_meta_peers else [addr, *peers]
        self._on_fatal = on_fatal
        self.meta = MetaGroup(addr, self._first_meta, config.raft, on_fatal)
        self._now_us = node.now_us
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._refused_until = 0.0
        self._evicted_logged = False
        self._unheard_since: float | None = None
        self._told_state: str | None = None
        self._remembered: list[str] = []
        self.replicas = replicas.Replicas(node, self.node_id)
        self.changes = GroupChanges(node, self.node_id, self._propose)
        self.driver = PlacementDriver(config, self.meta, self._propose)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        def wake() -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._wake.set)

        self.meta.on_applied = wake
        self._task = loop.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.changes.stop()
        self.meta.destroy()

    async def _run(self) -> None:
        """A step on every metadata change this replica applies, and at least every registry_interval_s."""
        while True:
            self._wake.clear()
            try:
                await self._step()
            except ProposalFailed as exc:
                log.debug("topology_proposal_failed %s", exc)
            except asyncio.TimeoutError:
                log.debug("topology_proposal_timed_out")
            except Exception:
                log.exception("topology_step_failed")
            try:
                await asyncio.wait_for(self._wake.wait(), self.config.registry_interval_s)
            except asyncio.TimeoutError:
                pass

    def evicted(self) -> str | None:
        """Why this node may no longer serve (the registry says it is dead or removed), or None."""
        me = self.meta.view()["nodes"].get(self.node_id)
        state = self._told_state or (me["state"] if me is not None else None)
        if state not in ("dead", "removed"):
            return None
        return (f"this node ({self.node_id}) was declared {state} by the cluster: wipe its data dir "
                "and start it again to join as a new node")

    async def _ask_standing(self, view: dict[str, Any]) -> None:
        """A node whose metadata replica hears no leader asks the others for its state: one
        taken out of the metadata group (declared dead while it was away) is never told."""
        loop = asyncio.get_running_loop()
        if self.meta.is_current():
            self._unheard_since = None
            return
        if self._unheard_since is None:
            self._unheard_since = loop.time()
        if loop.time() - self._unheard_since < STANDING_AFTER_S or self._told_state is not None:
            return
        if not self.meta.listening():
            log.error("meta_not_listening address=%s: the metadata group's port could not be bound "
                      "(in use by another process?)", self.meta.self_addr)
        others = {n["http"] for node_id, n in view["nodes"].items() if node_id != self.node_id}
        others |= set(identity.known_nodes(self.config.raft.data_dir))
        state = await join.standing(sorted(others - {self.http}), self.node_id, self.config.http_tls)
        if state in ("dead", "removed"):
            self._told_state = state

    def _keep_meta_role(self, view: dict[str, Any]) -> bool:
        """Run this node's metadata replica as a voter or an observer, as the placement says
        (storage/meta_voters.py); True when it was just switched (its new replica replays
        the log before its view is whole again). Only a current view is acted on: one
        replayed halfway would switch a node just promoted straight back. A leader hands
        over before it stops voting."""
        wants = meta_voters.votes(view, self.node_id)
        if wants is None or wants == self.meta.voter or self.meta.is_leader() or not self.meta.is_current():
            return False
        log.info("meta_role_switch node_id=%s to=%s", self.node_id, "voter" if wants else "observer")
        old = self.meta
        old.destroy()
        self.meta = MetaGroup(old.self_addr, self._first_meta, self.config.raft, self._on_fatal, voter=wants)
        self.meta.on_applied = old.on_applied
        self.driver.meta = self.meta
        return True

    async def _step(self) -> None:
        view = self.meta.view()
        await self._ask_standing(view)
        me = view["nodes"].get(self.node_id)
        reason = self.evicted()
        if reason is not None and not self._evicted_logged:
            self._evicted_logged = True
            log.error("node_evicted %s", reason)
            for group in self.node.groups:  # out of the cluster: it serves nothing, not even stale reads
                self.node.drop_group(group.group_id, keep_files=True)
        if reason is None and self._keep_meta_role(view):
            return
        loop = asyncio.get_running_loop()
        if (me is None or me["http"] != self.http) and loop.time() >= self._refused_until:
            entry = {"op": "register", "node_id": self.node_id, "http": self.http, "raft": self.config.raft.self_addr}
            # A joining node's observer has not caught up yet: a member registers it, after
            # checking that the node answers at the address it gives.
            joining = me is None and bool(self.config.join) and not self.meta.is_current()
            try:
                result = await (join.register(self.config, entry) if joining else self._propose(entry))
            except join.JoinError as exc:
                log.warning("node_join_waiting %s", exc)
                return
            if result["ok"]:
                log.info("node_registered node_id=%s http=%s raft=%s joined=%s", self.node_id, self.http,
                         self.config.raft.self_addr, result["joined"])
                if joining:  # its observer will show the entry once it has caught up
                    self._refused_until = loop.time() + REFUSED_RETRY_S
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
            await self.driver.step(self.meta.view())
        view = self.meta.view()
        others = sorted(n["http"] for node_id, n in view["nodes"].items() if node_id != self.node_id)
        if others and others != self._remembered:
            identity.remember_nodes(self.config.raft.data_dir, others)
            self._remembered = others
        if view["cluster"] is not None and reason is None:
            self.replicas.reconcile(view, self.meta.is_current())
            self.changes.step(view)

    def readiness_problems(self) -> list[str]:
        """Why this node cannot serve yet as the topology sees it (the groups' own state aside)."""
        view = self.meta.view()
        if view["cluster"] is None:
            return ["the cluster is not bootstrapped yet (waiting for every first node to register)"]
        missing = sorted(set(replicas.wanted(view, self.node_id)) - {g.group_id for g in self.node.groups})
        return [f"group {g}'s replica is not started yet" for g in missing]

    def holders(self, group_id: int) -> list[str]:
        """HTTP addresses of the other nodes holding group `group_id`, in a random order."""
        view = self.meta.view()
        members = view["placement"].get(str(group_id), [])
        found = [view["nodes"][m]["http"] for m in members
                 if m != self.node_id and view["nodes"][m]["state"] in ("alive", "suspect", "draining")]
        random.shuffle(found)
        return found

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

    async def propose_checked(self, command: dict[str, Any]) -> dict[str, Any]:
        """Commit a registry command for the API: a refusal is a Conflict, no commit Unavailable."""
        try:
            result = await self._propose(command)
        except ProposalFailed as exc:
            raise Unavailable(f"the metadata group did not commit {command['op']}: {exc}") from None
        except asyncio.TimeoutError:
            raise OutcomeUnknown(f"{command['op']} not committed within {self.config.propose_timeout_s}s; "
                                 "it may still be: retry") from None
        if not result["ok"]:
            raise Conflict(result["error"])
        return result

    async def _propose(self, command: dict[str, Any]) -> dict[str, Any]:
        command["now"] = self._now_us()
        result: dict[str, Any] = await asyncio.wait_for(self.meta.propose(command, asyncio.get_running_loop()),
                                                         self.config.propose_timeout_s)
        return result

    def _silence_by_node(self, view: dict[str, Any]) -> dict[str, float]:
        """On the metadata leader: seconds each other voter, and each node that serves as an
        observer, has been silent, by node id."""
        by_meta_addr = {group_addr(n["raft"], self.config.raft.groups): node_id for node_id, n in view["nodes"].items()}
        serving = [a for a, node_id in by_meta_addr.items() if view["nodes"][node_id]["state"] in placement.SERVES]
        return {by_meta_addr[a]: s for a, s in self.meta.silence_s(serving).items() if a in by_meta_addr}

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


def data_groups(view: dict[str, Any], statuses: list[dict[str, Any]], groups: int) -> list[dict[str, Any]]:
    """Every data group as the placement has it (members and leader as node ids, the change
    under way), with what this node's replica knows when it holds one: term, commit index,
    and on its leader each member's lag in entries."""
    by_raft = {n["raft"]: node_id for node_id, n in view["nodes"].items()}
    local = {s["group"]: s for s in statuses}
    out = []
    for group in range(groups):
        entry: dict[str, Any] = {"group": group, "members": view["placement"].get(str(group), []),
                                 "change": view["changes"].get(str(group))}
        s = local.get(group)
        if s is not None:
            leader = s["leader"]
            entry.update(leader_node=by_raft.get(_base(leader, group)) if leader else None, term=s["term"],
                         commit_index=s["commit_index"],
                         lag={by_raft.get(_base(a, group), a): max(0, s["commit_index"] - m)
                              for a, m in s["match_index"].items()} if s["is_leader"] else None)
        out.append(entry)
    return out


def _base(address: str, group: int) -> str:
    """The node's Raft address (its group 0's) from its address in group `group`."""
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) - group}"
