"""A small driver that applies commands to a real LMDB store at increasing
Raft indexes, as the Raft layer would."""
from __future__ import annotations

import hashlib
from typing import Any

from schedulerd.raft.store import Store
from schedulerd.storage import codec, fsm, ops, queries, records
from schedulerd.storage.jobs import SPEC_DEFAULTS
from schedulerd.storage.ops import Op
from schedulerd.storage.tables import DB_NAMES

S = 1_000_000
T0 = 1_800_000_000 * S  # a fixed "now" in 2027


class Driver:
    def __init__(self, path: str, group: int = 0) -> None:
        self.store = Store(path, group, 1 << 30)
        self.index = 0

    def apply(self, op: Op, *, version: int = ops.VERSION, **payload: Any) -> dict[str, Any]:
        """Apply an entry written at `version` (an older one keeps its older rules)."""
        self.index += 1
        try:
            applied_op, result = fsm.apply(self.store, self.index, ops.encode(op, payload, version))
        except fsm.FatalApplyError:
            self.store.abort_applied()
            raise
        self.store.commit_applied()
        assert applied_op == op
        return result

    def create(self, job_id: str, schedule: dict[str, Any], now: int = T0, **fields: Any) -> dict[str, Any]:
        spec = dict(SPEC_DEFAULTS, job_id=job_id, schedule=schedule, schedule_spec={}, queue="q", payload_json="{}")
        spec.update(fields)
        return self.apply(Op.CREATE_JOBS, now=now, jobs=[spec])["results"][0]

    def job(self, job_id: str) -> dict[str, Any] | None:
        with self.store.read() as txn:
            return records.get_job(records.Reader(txn, self.store.tables), job_id)

    def run(self, run_id: str) -> dict[str, Any] | None:
        with self.store.read() as txn:
            return records.get_run(records.Reader(txn, self.store.tables), run_id)

    def runs(self, job_id: str) -> list[dict[str, Any]]:
        with self.store.read() as txn:
            return queries.job_runs(txn, self.store.tables, job_id, limit=10_000, after_us=None)[0]

    def due(self, until: int) -> list[tuple[str, int]]:
        with self.store.read() as txn:
            return queries.due(txn, self.store.tables, range(256), until, 10_000)

    def ready(self, now: int, queues: tuple[str, ...] = ("q",)) -> list[str]:
        with self.store.read() as txn:
            return [r for _, r in queries.ready(txn, self.store.tables, list(queues), now, 10_000)]

    def claim_due(self, now: int, grace_us: int = 5 * S) -> list[str]:
        due = self.due(now)
        if not due:
            return []
        return self.apply(Op.CLAIM_BATCH, now=now, grace_us=grace_us, claims=[list(d) for d in due])["runs"]

    def lease(self, now: int, worker: str = "w", run_ids: list[str] | None = None,
              lease_s: int = 30) -> list[dict[str, Any]]:
        ids = self.ready(now) if run_ids is None else run_ids
        result = self.apply(Op.LEASE_BATCH, now=now, lease_until=now + lease_s * S, grants=[[worker, ids]])
        return result["grants"][0][1]

    def stored_stats(self, job_id: str) -> dict[str, int] | None:
        """The job's run counts as stored beside it (None: not stored, counted when asked)."""
        with self.store.read() as txn:
            raw = txn.get(job_id.encode(), db=self.store.tables.job_stats)
        return codec.unpack(raw) if raw else None

    def state_counts(self) -> dict[str, int]:
        """Jobs per state, as the store counts them (states with none left out)."""
        with self.store.read() as txn:
            return {k: v for k, v in queries.job_state_counts(txn, self.store.tables).items() if v}

    def digest(self) -> str:
        """Hash of every table's content (meta included): replicas must agree byte for byte."""
        h = hashlib.sha256()
        with self.store.read() as txn:
            for name in DB_NAMES:
                with txn.cursor(db=getattr(self.store.tables, name)) as cur:
                    for k, v in cur:
                        h.update(name.encode() + k + b"\x00" + v)
        return h.hexdigest()
