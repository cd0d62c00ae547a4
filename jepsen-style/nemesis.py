"""The fault schedule (a pure function of the seed) and the thread that plays it.

`plan()` decides kinds, variants, calm gaps, hold times, which follower/node/
worker and clock magnitudes up front from the seed. Whom "the leader" is, and
exact timing, are facts of the run, found out while playing. Every fault is
recorded as one `nemesis` event with its start and end (heal) times; the end
of every fault heals *everything* (rules flushed, processes running and
resumed, clocks at zero), so faults never pile up by accident."""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from cluster import DEAD_NODE_TIMEOUT_S, REPLICATION_FACTOR, Cluster
from history import History
from net import Net
from workers import WorkerPool

KINDS = ("kill", "pause", "partition", "clock", "worker", "disk", "membership")
VARIANTS = {
    "kill": ("leader", "follower", "all"),
    "pause": ("leader-election", "leader-lease"),
    "partition": ("isolate-leader", "isolate-follower", "bridge", "one-way"),
    "clock": ("bump", "strobe"),
    "worker": ("kill", "isolate"),
    "disk": ("full-leader", "full-follower"),
    # replace-follower: a follower's machine loses its disk and comes back on its address as
    # a new node at once: the old node is declared dead, its replicas are taken out and
    # re-created on the new one. dead-and-replaced: a follower is down past the dead-node
    # timeout, so the cluster repairs without it; then a new machine joins in its place, on a
    # spare slot's address when there is one. join: a new machine joins on a spare slot and
    # is given its share. remove: a follower is drained out (schedctl cluster remove-node)
    # and, once removed, its machine is retired to a spare slot.
    "membership": ("replace-follower", "dead-and-replaced", "join", "remove"),
}
LEADER_LOSS = {("kill", "leader"), ("kill", "all"), ("pause", "leader-election"), ("pause", "leader-lease"),
               ("partition", "isolate-leader")}
GAP_S = (3.0, 6.0)  # calm between faults
RECOVER_S = 4.0  # planning estimate of heal + re-election after each fault
LEADER_WAIT_S = 20.0  # to find a leader to aim at (a loaded box elects slowly)
STROBE_PERIOD_S = 0.5
REMOVE_WAIT_S = 60.0  # past its hold, how long a drain may take before the node is left draining


@dataclass(frozen=True)
class Fault:
    n: int
    kind: str
    variant: str
    gap_s: float  # calm before the fault
    hold_s: float  # how long it lasts before the heal
    pick: float  # in [0, 1): chooses among candidate targets (a follower, a node, a worker)
    magnitude_s: float  # signed clock offset for clock faults


def _hold_s(kind: str, variant: str, rng: random.Random, lease_s: float) -> float:
    if kind == "kill":
        return rng.uniform(1.0, 3.0) if variant == "all" else rng.uniform(2.0, 5.0)
    if kind == "pause":  # longer than an election, or longer than a whole lease
        return rng.uniform(3.5, 4.5) if variant == "leader-election" else lease_s + rng.uniform(1.5, 3.0)
    if kind == "partition":
        return rng.uniform(5.0, 8.0)
    if kind == "clock":
        return rng.uniform(5.0, 10.0)
    if kind == "disk":
        return rng.uniform(4.0, 8.0)
    if kind == "membership":  # the catch-up, the moves or the repair happen in it
        if variant == "dead-and-replaced":
            return DEAD_NODE_TIMEOUT_S + rng.uniform(5.0, 8.0)
        return rng.uniform(8.0, 12.0) if variant == "replace-follower" else rng.uniform(12.0, 18.0)
    return rng.uniform(1.0, 3.0) if variant == "kill" else lease_s + rng.uniform(2.0, 4.0)


def plan(seed: int, kinds: list[str], phase_s: float, lease_s: float) -> list[Fault]:
    """Faults that fit in phase_s, cycling through the kinds in a seeded order so
    that every enabled kind happens at least once (even if that overruns phase_s)."""
    rng = random.Random(f"{seed}:nemesis")
    order = list(kinds)
    rng.shuffle(order)
    cycles = {k: rng.sample(VARIANTS[k], len(VARIANTS[k])) for k in order}
    used = {k: 0 for k in order}
    faults: list[Fault] = []
    t = 0.0
    while True:
        kind = order[len(faults) % len(order)]
        variant = cycles[kind][used[kind] % len(cycles[kind])]
        gap, hold = rng.uniform(*GAP_S), _hold_s(kind, variant, rng, lease_s)
        pick, magnitude = rng.random(), rng.uniform(0.5, 30.0) * rng.choice((-1, 1))
        if len(faults) >= len(order) and t + gap + hold + RECOVER_S > phase_s:
            return faults
        used[kind] += 1
        faults.append(Fault(len(faults), kind, variant, gap, hold, pick, magnitude))
        t += gap + hold + RECOVER_S


class Nemesis:
    def __init__(self, faults: list[Fault], cluster: Cluster, workers: WorkerPool, net: Net,
                 history: History, lease_s: float) -> None:
        self.faults, self.cluster, self.workers, self.net = faults, cluster, workers, net
        self.history, self.lease_s = history, lease_s
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._play, name="nemesis", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout_s: float) -> None:
        self.thread.join(timeout_s)

    def _play(self) -> None:
        try:
            for fault in self.faults:
                if self.stop_event.wait(fault.gap_s):
                    return
                self._one(fault)
        except BaseException as exc:  # surfaced by the runner: a broken nemesis must not pass silently
            self.error = exc
            self.heal()

    def _one(self, fault: Fault) -> None:
        # Node faults are aimed relative to the leader (it, or one of its followers).
        needs_leader = fault.kind in ("kill", "partition", "pause", "disk", "membership")
        leader = self.cluster.wait_leader(LEADER_WAIT_S) if needs_leader else None
        if needs_leader and leader is None:
            self.history.add("nemesis_skipped", n=fault.n, kind=fault.kind, variant=fault.variant,
                             reason="no leader found")
            return
        start = time.time()  # before: explanation windows must cover the injection itself
        targets, detail = self._inject(fault, leader)
        if not targets:  # a join with no spare slot, a drain that would never end
            self.history.add("nemesis_skipped", n=fault.n, kind=fault.kind, variant=fault.variant, reason=detail)
            return
        injected = time.time()  # after: recovery is timed from when the fault is fully in place
        if fault.kind == "clock":
            self._hold_clock(fault, targets)
        else:
            self.stop_event.wait(fault.hold_s)
        end = time.time()
        if fault.kind == "membership":
            detail += self._after_membership(fault.variant, targets, leader)
        self.heal()
        recovered = time.time() if self.cluster.wait_leader(LEADER_WAIT_S) is not None else None
        self.history.add("nemesis", n=fault.n, kind=fault.kind, variant=fault.variant, targets=targets,
                         leader=leader, start=start, injected=injected, end=end, recovered=recovered,
                         leader_loss=(fault.kind, fault.variant) in LEADER_LOSS, detail=detail)

    def _inject(self, fault: Fault, leader: int | None) -> tuple[list[int], str]:
        active = [node.idx for node in self.cluster.active]
        others = [i for i in active if i != leader]
        chosen = others[int(fault.pick * len(others))] if others else 0
        k, v = fault.kind, fault.variant
        if k == "kill":
            targets = [leader] if v == "leader" else [chosen] if v == "follower" else active
            for i in targets:
                self.cluster.kill(i)
            return targets, f"kill -9 {targets}, restart after {fault.hold_s:.1f}s"
        if k == "pause":
            self.cluster.pause(leader)
            return [leader], f"SIGSTOP for {fault.hold_s:.1f}s"
        if k == "partition":
            return self._partition(v, leader, chosen, fault.pick)
        if k == "clock":
            node = active[int(fault.pick * len(active))]
            return [node], f"{v} {fault.magnitude_s:+.1f}s"
        if k == "membership" and v == "join":
            joined = self.cluster.join_spare()
            return ([joined], f"a new machine joins on slot {joined}") if joined is not None else \
                ([], "no spare slot: nothing joined")
        if k == "membership" and v == "remove":
            if len(active) <= REPLICATION_FACTOR or leader is None:
                return [], f"{len(active)} nodes: none can be drained"
            accepted = self.cluster.drain(chosen, via=leader)
            return [chosen], f"node {chosen} drained ({'accepted' if accepted else 'refused'})"
        if k == "membership":
            self.cluster.kill(chosen)
            if v == "dead-and-replaced":
                return [chosen], f"node {chosen} down {fault.hold_s:.1f}s (past the dead-node timeout), then replaced"
            self.cluster.wipe(chosen)
            self.cluster.start(chosen)
            return [chosen], f"node {chosen} wiped and started again on its address (a new node)"
        if k == "disk":
            victim = leader if v == "full-leader" else chosen
            left = self.cluster.fill_disk(victim)
            return [victim], f"data dir of node {victim} filled to {left // (1 << 20)} MiB free"
        return self._worker_fault(v, fault.pick)

    def _partition(self, variant: str, leader: int, chosen: int, pick: float) -> tuple[list[int], str]:
        active = [node.idx for node in self.cluster.active]
        if variant in ("isolate-leader", "isolate-follower"):
            victim = leader if variant == "isolate-leader" else chosen
            for j in active:
                if j != victim:
                    self.net.cut(victim, j)
            return [victim], f"node {victim} cut from its peers; clients and workers still reach it"
        if variant == "bridge":
            a, c = [i for i in active if i != chosen][:2]
            self.net.cut(a, c)
            return [a, c], f"{a} and {c} cut from each other; {chosen} sees both"
        followers = [i for i in active if i != leader]
        if pick < 0.5:  # followers stop hearing the leader, the leader still hears them
            for f in followers:
                self.net.cut_one_way(leader, f)
            return [leader], f"one-way: {leader} -> {followers} dropped"
        for f in followers:  # the leader stops hearing its followers (acks, votes)
            self.net.cut_one_way(f, leader)
        return [leader], f"one-way: {followers} -> {leader} dropped"

    def _after_membership(self, variant: str, targets: list[int], leader: int | None) -> str:
        """What a membership fault does at its end, before the heal; returns more detail."""
        if variant == "dead-and-replaced":
            # Declared dead: its data dir serves no more. A new machine joins in its place, on
            # a spare slot's address when there is one (the dead slot becomes the spare).
            joined = self.cluster.join_spare()
            for i in targets:
                if joined is None:
                    self.cluster.wipe(i, joins=True)
                else:
                    self.cluster.retire(i)
            return f"; replaced on slot {targets[0] if joined is None else joined}"
        if variant == "remove" and targets and leader is not None:
            node_id = self.cluster.node_id(targets[0])
            deadline = time.monotonic() + REMOVE_WAIT_S
            via = leader if targets[0] != leader else next(n.idx for n in self.cluster.active if n.idx != targets[0])
            while node_id is not None and time.monotonic() < deadline and not self.stop_event.is_set():
                if self.cluster.registry_state(node_id, via) == "removed":
                    self.cluster.retire(targets[0])
                    return "; removed, its machine retired"
                time.sleep(0.5)
            return "; not removed in time: left draining"
        return ""

    def _worker_fault(self, variant: str, pick: float) -> tuple[list[int], str]:
        n = self.workers.n
        first = int(pick * n)
        order = [(first + k) % n for k in range(n)]
        if variant == "kill":
            # Aim at a worker that is inside a handler right now ("mid-task").
            deadline = time.monotonic() + 3.0
            victim = first
            while time.monotonic() < deadline:
                busy = [w for w in order if self.workers.busy(w)]
                if busy:
                    victim = busy[0]
                    break
                time.sleep(0.05)
            mid_task = self.workers.busy(victim)
            self.workers.kill(victim)
            return [victim], f"kill -9 worker {victim} (mid-task: {mid_task})"
        self.net.isolate_worker(first)
        return [first], f"worker {first} isolated"

    def _hold_clock(self, fault: Fault, targets: list[int]) -> None:
        node = targets[0]
        if fault.variant == "bump":
            self.cluster.set_offset(node, fault.magnitude_s)
            self.stop_event.wait(fault.hold_s)
            return
        deadline = time.monotonic() + fault.hold_s
        sign = 1
        while time.monotonic() < deadline and not self.stop_event.is_set():
            self.cluster.set_offset(node, sign * fault.magnitude_s)
            sign = -sign
            self.stop_event.wait(STROBE_PERIOD_S)

    def heal(self) -> None:
        self.net.heal_all()
        self.cluster.heal_processes()
        self.workers.ensure_running()
