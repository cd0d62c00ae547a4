"""The per-queue figures /metrics reads from a replica (storage/queries.py)."""
from __future__ import annotations

import pathlib

from schedulerd.storage import queries
from tests.unit.fsm_driver import T0, Driver


def test_running_by_queue_counts_the_leased_runs_of_each_queue(tmp_path: pathlib.Path) -> None:
    d = Driver(str(tmp_path / "db"))
    for job_id in ("a", "b", "c"):
        d.create(job_id, {"kind": "at", "at_us": T0})
        d.claim_due(T0)
    d.lease(T0, run_ids=d.ready(T0)[:2])
    counted: dict[str, int] = {}
    with d.store.read() as txn:
        assert not queries.running_by_queue(txn, d.store.tables, 100, counted)
        assert queries.running_by_queue(txn, d.store.tables, 1, {})  # cut short: a lower bound
    assert counted == {"q": 2}
