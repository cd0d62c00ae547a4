"""The recorded history, the worker files and the final reads, indexed once for
the checkers and the figures. Occurrences are keyed (job_id, scheduled_us)
with integer microseconds; nothing here judges, it only organises."""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from wire import parse_us

# Faults that can hold up a group's commits or move its leader. Membership counts: its
# variants kill -9 a node (dead-and-replaced holds it down past the dead-node timeout),
# wipe one, or move replicas and leaders between nodes.
NODE_FAULT_KINDS = ("kill", "pause", "partition", "clock", "disk", "membership")
Occ = tuple[str, int]


@dataclass
class Facts:
    lease_s: float
    history: list[dict[str, Any]]
    worker_records: list[dict[str, Any]]
    reads: list[dict[str, Any]]  # one per node, see finalreads.read_all
    convergence: dict[str, Any]
    creates: list[dict[str, Any]] = field(default_factory=list)
    create_attempts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    cancels: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # job_id -> cancel results
    cancel_tried: set[str] = field(default_factory=set)
    faults: list[dict[str, Any]] = field(default_factory=list)
    begins: dict[Occ, list[dict[str, Any]]] = field(default_factory=dict)
    execs: dict[Occ, list[dict[str, Any]]] = field(default_factory=dict)
    sdk: list[dict[str, Any]] = field(default_factory=list)
    acked: set[tuple[str, int]] = field(default_factory=set)  # (run_id, fence) the SDK saw acked
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # reference node's jobs
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # reference node's runs
    jobs_by_key: dict[str, set[str]] = field(default_factory=dict)  # idempotency key -> job ids, any node
    all_job_ids: set[str] = field(default_factory=set)  # on any node

    @classmethod
    def build(cls, lease_s: float, history: list[dict[str, Any]], worker_records: list[dict[str, Any]],
              reads: list[dict[str, Any]], convergence: dict[str, Any]) -> "Facts":
        f = cls(lease_s, history, worker_records, reads, convergence)
        f._index_history()
        f._index_workers()
        f._index_reads()
        return f

    def _index_history(self) -> None:
        attempts: dict[str, list[dict[str, Any]]] = defaultdict(list)
        cancels: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in self.history:
            if e["type"] == "create":
                self.creates.append(e)
            elif e["type"] == "create_attempt":
                attempts[e["key"]].append(e)
            elif e["type"] == "cancel":
                cancels[e["job_id"]].append(e)
            elif e["type"] == "cancel_attempt":
                self.cancel_tried.add(e["job_id"])
            elif e["type"] == "nemesis":
                self.faults.append(e)
        self.create_attempts, self.cancels = dict(attempts), dict(cancels)

    def _index_workers(self) -> None:
        begins: dict[Occ, list[dict[str, Any]]] = defaultdict(list)
        execs: dict[Occ, list[dict[str, Any]]] = defaultdict(list)
        for rec in self.worker_records:
            ev = rec.get("ev")
            if ev in ("begin", "exec"):
                occ = (rec["job_id"], parse_us(rec["scheduled_time"]))
                (begins if ev == "begin" else execs)[occ].append(rec)
            elif ev == "sdk":
                self.sdk.append(rec)
                if rec["event"] == "task_acked" and rec.get("fence") is not None:
                    self.acked.add((rec["run_id"], rec["fence"]))
        self.begins, self.execs = dict(begins), dict(execs)

    def _index_reads(self) -> None:
        by_key: dict[str, set[str]] = defaultdict(set)
        for read in self.reads:
            for job in read["jobs"]:
                self.all_job_ids.add(job["job_id"])
                if job.get("idempotency_key"):
                    by_key[job["idempotency_key"]].add(job["job_id"])
        self.jobs_by_key = dict(by_key)
        if self.reads:
            ref = self.reads[self.reference_node()]
            self.jobs = {j["job_id"]: j for j in ref["jobs"]}
            self.runs = ref["runs"]

    def reference_node(self) -> int:
        """The node whose final reads the checkers take jobs and runs from: one whose reads
        a majority shares, else the one that read the most runs. A node left behind must
        not make the others' work look unexpected (convergence reports it). Any node
        answers for every group (it forwards what it holds no replica of), so the reads
        compare whatever replicas each node holds."""
        keys = [json.dumps([sorted(j["job_id"] for j in r["jobs"]), r["runs"]], sort_keys=True) for r in self.reads]
        best, count = Counter(keys).most_common(1)[0]
        if count * 2 > len(self.reads):
            return keys.index(best)
        return max(range(len(self.reads)), key=lambda i: sum(len(v) for v in self.reads[i]["runs"].values()))

    # -- questions the checkers ask ---------------------------------------

    def ok_execs(self, occ: Occ) -> list[dict[str, Any]]:
        return [e for e in self.execs.get(occ, []) if e.get("outcome") == "ok"]

    def run_for(self, occ: Occ) -> list[dict[str, Any]]:
        return [r for r in self.runs.get(occ[0], []) if parse_us(r["scheduled_time"]) == occ[1]]

    def node_fault_windows(self) -> list[tuple[float, float, dict[str, Any]]]:
        """[start, end + lease + 2 s]: a lease granted before a node fault healed can
        still run out because of it up to one lease length later."""
        return [(f["start"], f["end"] + self.lease_s + 2.0, f) for f in self.faults
                if f["kind"] in NODE_FAULT_KINDS]

    def all_fault_windows(self) -> list[tuple[float, float, dict[str, Any]]]:
        return [(f["start"], f["end"] + self.lease_s + 2.0, f) for f in self.faults]

    def worker_windows(self, slot: int) -> list[tuple[float, float, dict[str, Any]]]:
        return [(f["start"], f["end"] + self.lease_s + 2.0, f) for f in self.faults
                if f["kind"] == "worker" and slot in f["targets"]]

    def clock_offsets(self) -> list[tuple[float, int, float]]:
        """(t, node, offset_s) steps of every node's clock offset, in time order."""
        return sorted((e["t"], e["node"], e["offset_s"]) for e in self.history if e["type"] == "clock")

    def max_skew_ahead(self, t0: float, t1: float) -> float:
        """The largest forward offset any node had at any moment in [t0, t1]:
        the offsets in force when the window opened and those set inside it."""
        in_force: dict[int, float] = {}
        best = 0.0
        for t, node, offset in self.clock_offsets():
            if t > t1:
                break
            if t < t0:
                in_force[node] = offset
            else:
                best = max(best, offset)
        return max([best, *in_force.values()])

    def worker_killed_after(self, worker: str, t: float) -> bool:
        """Was this worker incarnation (`wI-pid`) killed, or found dead, after time t?"""
        return any(e["type"] == "worker" and e["event"] in ("kill", "died", "stop_timeout_killed")
                   and f"w{e['worker']}-{e.get('pid')}" == worker and e["t"] >= t for e in self.history)

    def sdk_trouble(self, worker: str, t0: float, t1: float) -> list[dict[str, Any]]:
        """The worker's own reports that a lease may be gone: failed or rejected
        heartbeats, a lost lease, an ack it gave up on or had rejected."""
        bad = ("heartbeat_failed", "heartbeat_rejected", "lease_lost", "task_settle_abandoned",
               "task_ack_rejected", "task_ack_failed")
        return [r for r in self.sdk if r["worker"] == worker and r["event"] in bad and t0 <= r["t"] <= t1]
