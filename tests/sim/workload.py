"""Simulated callers and workers, and the history they record for the checkers.

Callers create one-off jobs (some by idempotency key, retried until they get an
answer), a few repeating jobs, and cancel some. Workers poll any node, run each task
for a drawn time (heartbeating long ones), then ack; some nack, some crash (the worker
forgets what it held) and some hang past their lease and ack late. Every answer is
recorded as the caller saw it: ok, refused, or unknown (a timeout, a reset)."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from schedulerd import jobspec
from schedulerd.errors import SchedulerError
from schedulerd.storage.ops import Op
from schedulerd.timefmt import from_iso, to_iso
from schedulerd.units import US_PER_S

from tests.sim.node import Lost, SimNode
from tests.sim.world import World

QUEUE = "sim"
EVERY_S = 300  # the repeating jobs' period
REPEATING_MAX = 6


@dataclass
class History:
    creates: list[dict[str, Any]] = field(default_factory=list)
    cancels: list[dict[str, Any]] = field(default_factory=list)
    dispatches: list[dict[str, Any]] = field(default_factory=list)
    acks: list[dict[str, Any]] = field(default_factory=list)
    nacks: list[dict[str, Any]] = field(default_factory=list)


class Workload:
    def __init__(self, world: World, nodes: list[SimNode], trace: Callable[[str], None], rate_per_h: float,
                 workers: int) -> None:
        self.world, self.nodes, self.trace = world, nodes, trace
        self.rng = world.rng
        self.history = History()
        self.rate_per_h = rate_per_h
        self.workers = workers
        self.stopping = False
        self.jobs = 0
        self.keys = 0
        self.repeating = 0
        self.worker_incarnations: dict[str, int] = {}

    # --- calls into nodes ---

    def holders(self, group_id: int) -> list[SimNode]:
        return [n for n in self.nodes if n.up and n.node is not None and n.node.local_group(group_id) is not None]

    def pick(self, group_id: int | None = None) -> SimNode | None:
        up = [n for n in self.nodes if n.up] if group_id is None else self.holders(group_id)
        return self.rng.choice(up) if up else None

    # --- callers ---

    async def callers(self) -> None:
        while not self.stopping:
            await asyncio.sleep(self.rng.expovariate(self.rate_per_h / 3600.0))
            if self.stopping:
                return
            roll = self.rng.random()
            if roll < 0.1 and self.history.creates:
                self.world.loop.create_task(self.cancel(self.rng.choice(self.history.creates)))
            elif roll < 0.14 and self.repeating < REPEATING_MAX:
                self.repeating += 1
                self.world.loop.create_task(self.create({"schedule": {"every": f"{EVERY_S}s"}, "queue": QUEUE,
                                                                "max_attempts": 5, "history_limit": 10_000}))
            else:
                at = self.world.clock.wall() + self.rng.uniform(1.0, 900.0)
                raw = {"schedule": {"at": to_iso(int(at * US_PER_S))}, "queue": QUEUE, "max_attempts": 5,
                       "finished_ttl_s": self.rng.choice([600, 3600, 86400])}
                self.world.loop.create_task(self.create(raw, keyed=roll < 0.4))

    async def create(self, raw: dict[str, Any], keyed: bool = False) -> None:
        self.jobs += 1
        key = None
        if keyed:
            self.keys += 1
            key = f"key-{self.keys}"
        else:
            raw = {**raw, "job_id": f"job-{self.jobs}"}
        record: dict[str, Any] = {"raw": raw, "key": key, "sent_at": self.world.clock.elapsed_s, "answers": []}
        self.history.creates.append(record)
        for attempt in range(6 if keyed else 1):
            answer = await self._create_once(raw, key)
            record["answers"].append(answer)
            if answer[0] != "unknown":
                break
            await asyncio.sleep(self.rng.uniform(1.0, 10.0))
        self.trace(f"create {raw.get('job_id', key)} -> {[a[0] for a in record['answers']]}")

    async def _create_once(self, raw: dict[str, Any], key: str | None) -> tuple[str, Any]:
        node = self.pick()
        if node is None:
            return ("unknown", "no node up")

        async def run() -> dict[str, Any]:
            assert node.node is not None
            spec = jobspec.parse_job(raw, node.node.now_us(), node.node.config.limits, key)
            spec["audit"] = {"who": "sim", "what": "create", "via": "sim"}
            group = node.node.group_of_job(spec["job_id"])
            (result,) = await node.creates.submit(group, [spec])
            return result  # type: ignore[no-any-return]

        try:
            result = await node.serve(run)
        except Lost as exc:
            return ("unknown", str(exc))
        except SchedulerError as exc:
            return ("unknown" if exc.code == "outcome_unknown" else "failed", f"{exc.code}: {exc}")
        if not result["ok"]:
            return ("failed", result.get("code"))
        return ("ok", result["job_id"])

    async def cancel(self, create: dict[str, Any]) -> None:
        oks = [a[1] for a in create["answers"] if a[0] == "ok"]
        job_id = oks[0] if oks else create["raw"].get("job_id")
        if job_id is None:
            return
        record: dict[str, Any] = {"job_id": job_id, "sent_at": self.world.clock.elapsed_s, "outcome": "unknown"}
        self.history.cancels.append(record)
        node = None
        for n in self.nodes:
            if n.up and n.node is not None:
                group_id = n.node.group_id_of_job(job_id)
                node = self.pick(group_id)
                break
        if node is None:
            return

        async def run() -> tuple[dict[str, Any], int]:
            assert node.node is not None
            group = node.node.group_of_job(job_id)
            result = await node.node.propose(group, Op.CANCEL_JOB, {"job_id": job_id, "audit": {"who": "sim"}})
            return result, group.replica.raftLastApplied

        try:
            result, applied = await node.serve(run)
        except (Lost, SchedulerError) as exc:
            record["outcome"] = f"unknown: {exc}"
            return
        record["outcome"] = "ok" if result.get("ok") else f"refused: {result.get('code')}"
        record["applied_hi"] = applied
        record["incarnation"] = (node.name, node.incarnation)
        self.trace(f"cancel {job_id} -> {record['outcome']}")

    # --- workers ---

    async def worker(self, index: int) -> None:
        name = f"w{index}"
        self.worker_incarnations[name] = 0
        while not self.stopping:
            incarnation = self.worker_incarnations[name]
            worker_id = f"{name}.{incarnation}"
            node = self.pick()
            if node is None:
                await asyncio.sleep(1.0)
                continue

            async def poll(node: SimNode = node) -> list[Any]:
                assert node.leases is not None
                return await node.leases.poll(worker_id, [QUEUE], 2, 20.0)

            try:
                tasks = await node.serve(poll)
            except (Lost, SchedulerError):
                await asyncio.sleep(self.rng.uniform(0.5, 3.0))
                continue
            if not tasks:
                continue
            runs = [self.world.loop.create_task(self.run_task(name, worker_id, view)) for view, _ in tasks]
            await asyncio.wait(runs)

    async def run_task(self, name: str, worker_id: str, view: dict[str, Any]) -> None:
        dispatch = {"run_id": view["run_id"], "job_id": view["job_id"], "fence": view["fence"],
                    "attempt": view["attempt"], "scheduled_us": from_iso(view["scheduled_time"]),
                    "worker": worker_id, "at": self.world.clock.elapsed_s, "wall_us": int(self.world.clock.wall() * US_PER_S)}
        self.history.dispatches.append(dispatch)
        roll = self.rng.random()
        if roll < 0.03:  # the worker process dies: everything it held is forgotten
            dispatch["fate"] = "crashed"
            self.worker_incarnations[name] += 1
            return
        hang = roll < 0.05
        duration = self.rng.uniform(40.0, 90.0) if hang else self.rng.choice([0.2, 1.0, 5.0, 20.0, 45.0])
        until = self.world.clock.elapsed_s + duration
        while (left := until - self.world.clock.elapsed_s) > 0.001:
            await asyncio.sleep(min(10.0, left))
            if not hang and until - self.world.clock.elapsed_s > 0.001:
                await self._commit(view, "heartbeats", [[view["run_id"], view["fence"], worker_id]], "heartbeat")
        if roll < 0.10 and not hang:
            dispatch["fate"] = "nack"
            await self._nack(view, worker_id)
            return
        dispatch["fate"] = "late" if hang else "ok"
        result = json.dumps({"worker": worker_id})
        outcome = await self._commit(view, "acks", [[view["run_id"], view["fence"], result, worker_id]], "ack")
        self.history.acks.append({"run_id": view["run_id"], "fence": view["fence"], "outcome": outcome,
                                  "at": self.world.clock.elapsed_s})

    async def _commit(self, view: dict[str, Any], kind: str, items: list[Any], what: str) -> str:
        """An ack or heartbeat, retried on unknown outcomes as the SDK retries; its last answer."""
        group_id = int(view["run_id"].partition("-")[0])
        outcome = "unknown"
        for _ in range(4):
            node = self.pick(group_id)
            if node is None:
                await asyncio.sleep(2.0)
                continue

            async def run(node: SimNode = node) -> dict[str, Any]:
                assert node.node is not None and node.commits is not None
                group = node.node.local_group(group_id)
                if group is None:
                    raise Lost("the group left this node")
                (result,) = await getattr(node.commits, kind).submit(group, items)
                return result  # type: ignore[no-any-return]

            try:
                result = await node.serve(run)
            except (Lost, SchedulerError) as exc:
                outcome = f"unknown: {exc}"
                await asyncio.sleep(self.rng.uniform(0.5, 3.0))
                continue
            return "ok" if result["ok"] else f"refused: {result['code']}"
        return outcome

    async def _nack(self, view: dict[str, Any], worker_id: str) -> None:
        group_id = int(view["run_id"].partition("-")[0])
        node = self.pick(group_id)
        if node is None:
            return

        async def run() -> dict[str, Any]:
            assert node.node is not None
            group = node.node.local_group(group_id)
            if group is None:
                raise Lost("the group left this node")
            return await node.node.propose(group, Op.NACK, {  # type: ignore[no-any-return]
                "worker_id": worker_id, "run_id": view["run_id"], "fence": view["fence"], "error": "sim nack"})

        try:
            result = await node.serve(run)
            outcome = "ok" if result["ok"] else f"refused: {result['code']}"
        except (Lost, SchedulerError) as exc:
            outcome = f"unknown: {exc}"
        self.history.nacks.append({"run_id": view["run_id"], "fence": view["fence"], "outcome": outcome})

