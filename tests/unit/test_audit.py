"""The audit log: a record per audited command, with its outcome, bounded."""
from __future__ import annotations

import pathlib

import pytest

from schedulerd.storage import audit, queries
from schedulerd.storage.ops import Op
from tests.unit.fsm_driver import S, T0, Driver

EVERY = {"kind": "every", "every_us": 60 * S}


def records(d: Driver) -> list[dict]:
    with d.store.read() as txn:
        return [r for _, r in queries.audit_records(txn, d.store.tables, limit=100, before=None)]


def test_commands_with_a_note_are_recorded_with_their_outcome(tmp_path: pathlib.Path) -> None:
    d = Driver(str(tmp_path))
    d.create("a", EVERY, audit={"who": "deployer", "what": "create job a", "via": "POST /v1/jobs"})
    assert d.job("a") is not None and "audit" not in d.job("a"), "the note is not part of the job"
    d.apply(Op.PAUSE_JOB, now=T0 + S, job_id="a", audit={"who": "ops", "what": "pause job a"})
    d.apply(Op.CANCEL_JOB, now=T0 + 2 * S, job_id="missing", audit={"who": "ops", "what": "cancel job missing"})
    d.apply(Op.RESUME_JOB, now=T0 + 3 * S, job_id="a")  # no note: not audited
    assert [(r["who"], r["what"], r["outcome"], r["at_us"]) for r in records(d)] == [
        ("ops", "cancel job missing", "not_found", T0 + 2 * S),
        ("ops", "pause job a", "ok", T0 + S),
        ("deployer", "create job a", "ok", T0)]


def test_a_batch_create_is_one_record_with_the_count(tmp_path: pathlib.Path) -> None:
    d = Driver(str(tmp_path))
    d.create("dup", EVERY)
    from schedulerd.storage.jobs import SPEC_DEFAULTS
    specs = [dict(SPEC_DEFAULTS, job_id=j, schedule=EVERY, schedule_spec={}, queue="q", payload_json="{}")
             for j in ("x", "dup", "y")]
    specs[0]["audit"] = {"who": "ci", "what": "create 3 jobs", "count": 3}
    d.apply(Op.CREATE_JOBS, now=T0, jobs=specs)
    assert [(r["what"], r["outcome"]) for r in records(d)] == [("create 3 jobs", "2 ok, 1 failed")]


def test_the_log_keeps_only_the_newest_records(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit, "AUDIT_RECORDS_MAX", 3)
    d = Driver(str(tmp_path))
    d.create("a", EVERY)
    for i in range(5):
        d.apply(Op.PAUSE_JOB, now=T0 + i, job_id="a", audit={"who": "ops", "what": f"pause {i}"})
    assert [r["what"] for r in records(d)] == ["pause 4", "pause 3", "pause 2"]
