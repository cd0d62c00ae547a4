"""Membership changes under elections, partitions and lost messages, on real SyncObjs
over the hand-driven network, from seeds: Raft's safety must hold throughout (at most
one leader per term, no two replicas ever applied different entries at one index), and
once the network heals everyone still a member converges, with every acknowledged entry.
SCHEDULERD_MEMBERSHIP_SEEDS=1000 for a soak. A seed replays its operations exactly; node
sets iterate in hash order, so the interleaving also depends on PYTHONHASHSEED."""
from __future__ import annotations

import os
import random
from typing import Any, Iterator

import pytest
from pysyncobj import FAIL_REASON

from schedulerd.raft import pysyncobj_patches
from tests.pysyncobj_net import Net, Replica, conf

ADDRS = [f"n{i}:1" for i in range(1, 6)]
FIRST = ADDRS[:3]
STEPS = 400


def _conf() -> Any:
    return conf(dynamicMembershipChange=True)


def _fixed(replica: Replica) -> None:
    pysyncobj_patches.backtrack_to_commit_index(replica)
    pysyncobj_patches.keep_next_index_on_late_acks(replica)
    pysyncobj_patches.commit_only_what_matched(replica)
    pysyncobj_patches.truncate_only_on_conflict(replica)
    pysyncobj_patches.one_membership_change_at_a_time(replica)
    pysyncobj_patches.hear_removed_nodes_until_committed(replica)


class Fuzz:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.net = Net()
        for replica in self.net.start(FIRST, lambda addr: _conf()):
            _fixed(replica)
        self.acked: list[Any] = []
        self.leaders: dict[int, str] = {}  # term -> the one node that led it
        self.counter = 0
        self.trace: list[str] = []
        self.gone: list[str] = []  # removed by a committed change, to stop

    def leader(self) -> Replica | None:
        leading = [r for r in self.net.replicas.values() if r._isLeader()]
        return max(leading, key=lambda r: r.raftCurrentTerm) if leading else None

    def members(self) -> set[str]:
        """The members as the current leader has them."""
        leader = self.leader()
        if leader is None:
            return set()
        return {leader.selfNode.address, *(n.address for n in leader.otherNodes)}

    def step(self) -> None:
        op = self.rng.choices(["propose", "add", "remove", "elect", "cut", "heal", "heartbeat", "deliver"],
                              weights=[6, 1, 1, 2, 1, 2, 3, 8])[0]
        getattr(self, op)()
        self.net.tick()
        self.stop_removed()
        self.check()

    def stop_removed(self) -> None:
        while self.gone:
            address = self.gone.pop()
            if address in self.net.replicas and address not in self.members():
                self.net.stop(address)
                self.trace.append(f"stop {address}")

    def propose(self) -> None:
        replica = self.rng.choice(list(self.net.replicas.values()))
        self.counter += 1
        item = self.counter
        replica.add(item, callback=lambda result, error, item=item:
                    self.acked.append(item) if error == FAIL_REASON.SUCCESS else None)
        self.trace.append(f"propose {item} at {replica.selfNode.address}")

    def caught_up(self, leader: Replica) -> bool:
        """Every member holds the leader's latest membership entry: the placement driver
        starts a change only then (a joiner that has not caught up cannot vote yet)."""
        log = pysyncobj_patches.raft_log(leader)[:]
        last = max((e[1] for e in log if pysyncobj_patches.membership_change(e[0])), default=0)
        match = leader._SyncObj__raftMatchIndex
        return all(match.get(node, 0) >= last for node in leader.otherNodes)

    def add(self) -> None:
        leader = self.leader()
        outside = [a for a in ADDRS if a not in self.members()]
        if leader is None or not outside or not self.caught_up(leader):
            return
        address = self.rng.choice(outside)
        if address not in self.net.replicas:
            joiner = self.net.add(address, sorted(self.members()), _conf())
            pysyncobj_patches.no_votes_before_joining(joiner)
            _fixed(joiner)
        leader.addNodeToCluster(address)
        self.trace.append(f"add {address} via {leader.selfNode.address}")

    def remove(self) -> None:
        leader = self.leader()
        if leader is None or not self.caught_up(leader):
            return
        others = sorted(self.members() - {leader.selfNode.address})
        if len(others) < 2:
            return
        address = self.rng.choice(others)
        # Once the removal commits, the placement tells the node it no longer holds the
        # group: its replica goes, and comes back, if ever, as a new empty one.
        leader.removeNodeFromCluster(address, callback=lambda result, error, address=address:
                                     self.gone.append(address) if error == FAIL_REASON.SUCCESS else None)
        self.trace.append(f"remove {address} via {leader.selfNode.address}")

    def elect(self) -> None:
        replica = self.rng.choice(list(self.net.replicas.values()))
        replica._SyncObj__raftElectionDeadline = 0
        self.trace.append(f"election at {replica.selfNode.address}")

    def cut(self) -> None:
        address = self.rng.choice(list(self.net.replicas))
        self.net.cut.add(address)
        self.trace.append(f"cut {address}")

    def heal(self) -> None:
        self.net.cut.clear()
        self.trace.append("heal")

    def heartbeat(self) -> None:
        leader = self.leader()
        if leader is not None:
            pysyncobj_patches.send_append_entries(leader)

    def deliver(self) -> None:
        in_flight = len(self.net.flight)
        if in_flight and self.rng.random() < 0.1:  # a message lost
            self.net.flight.remove(self.rng.choice(list(self.net.flight)))
        self.net.deliver(self.rng.randint(1, max(1, in_flight)))

    def check(self) -> None:
        for replica in self.net.replicas.values():
            if replica._isLeader():
                term, address = replica.raftCurrentTerm, replica.selfNode.address
                assert self.leaders.setdefault(term, address) == address, \
                    f"two leaders in term {term}: {self.leaders[term]} and {address}\n" + self.last_steps()
        applied = [r.applied for r in self.net.replicas.values()]
        for a in applied:
            for b in applied:
                n = min(len(a), len(b))
                assert a[:n] == b[:n], "two replicas applied different entries\n" + self.last_steps()

    def settle(self) -> None:
        """Heal, and do what the placement driver does with a member that never hears its
        leader (one that joined knowing members of which none leads now: pysyncobj hangs up
        on an address it does not list): remove it, then add it back as a new, empty node."""
        self.net.cut.clear()
        for round_ in range(200):
            leader = self.leader()
            if leader is None or self.outdated(leader):
                if round_ % 5 == 4:
                    self.elect()  # an election timeout: the cluster moves past a stale leader
            else:
                pysyncobj_patches.send_append_entries(leader)
                if round_ % 25 == 24:
                    self.replace_deaf_members(leader)
            self.net.tick()
            self.net.deliver()
            self.stop_removed()
            self.check()

    def outdated(self, leader: Replica) -> bool:
        """A member has moved to a later term than the leader's: only an election settles it."""
        return any(self.net.replicas[a].raftCurrentTerm > leader.raftCurrentTerm
                   for a in self.members() if a in self.net.replicas)

    def replace_deaf_members(self, leader: Replica) -> None:
        for address in sorted(self.members() - {leader.selfNode.address}):
            replica = self.net.replicas.get(address)
            if replica is not None and leader.selfNode in replica.otherNodes:
                continue
            self.trace.append(f"replace {address}, deaf to {leader.selfNode.address}")
            if replica is not None:
                self.net.stop(address)
            leader.removeNodeFromCluster(address)
            self.net.settle(3)
            joiner = self.net.add(address, sorted(self.members()), _conf())
            pysyncobj_patches.no_votes_before_joining(joiner)
            _fixed(joiner)
            leader.addNodeToCluster(address)
            self.net.settle(3)

    def last_steps(self) -> str:
        return "last steps: " + "; ".join(self.trace[-25:])


@pytest.fixture
def fuzzes() -> Iterator[list[Fuzz]]:
    made: list[Fuzz] = []
    yield made
    for fuzz in made:
        fuzz.net.close()


@pytest.mark.parametrize("seed", range(int(os.environ.get("SCHEDULERD_MEMBERSHIP_SEEDS", 12))))
def test_membership_changes_keep_raft_safe_and_converge(seed: int, fuzzes: list[Fuzz]) -> None:
    fuzz = Fuzz(seed)
    fuzzes.append(fuzz)
    for _ in range(STEPS):
        fuzz.step()
    fuzz.settle()
    leader = fuzz.leader()
    assert leader is not None, fuzz.last_steps()
    members = [fuzz.net.replicas[a] for a in sorted(fuzz.members()) if a in fuzz.net.replicas]
    assert len({tuple(r.applied) for r in members}) == 1, fuzz.last_steps()
    missing = set(fuzz.acked) - set(leader.applied)
    assert not missing, f"acknowledged and lost: {sorted(missing)}\n" + fuzz.last_steps()
