"""The audit log: who changed what, and when, replicated like everything else.

A command proposed for an API caller carries `audit: {"who", "what", "via"}`;
apply stores it with the entry's time, its Raft index and the outcome, in the
same txn as the change. Creates are coalesced, so their note rides on the first
job of each request (with `count`, the request's number of jobs). The log is
bounded: past AUDIT_RECORDS_MAX the oldest records go, in the same entry, the
same on every replica. Worker traffic (leases, heartbeats, acks, nacks) is not
audited: each run's record already names its worker and fence."""
from __future__ import annotations

from typing import Any

from schedulerd.storage import keys
from schedulerd.storage.codec import pack
from schedulerd.storage.ops import Op
from schedulerd.storage.records import Ctx

AUDIT_RECORDS_MAX = 10_000


def record_command(ctx: Ctx, op: Op, cmd: dict[str, Any], result: dict[str, Any]) -> None:
    if op == Op.CREATE_JOBS:
        specs, results = cmd["jobs"], result["results"]
        for i, spec in enumerate(specs):
            note = spec.get("audit")
            if note is not None:
                mine = results[i:i + int(note.get("count", 1))]
                _record(ctx, cmd["now"], note, _create_outcome(mine))
        return
    note = cmd.get("audit")
    if note is not None:
        _record(ctx, cmd["now"], note, "ok" if result.get("ok", True) else str(result.get("code", "rejected")))


def _create_outcome(results: list[dict[str, Any]]) -> str:
    if len(results) == 1:
        r = results[0]
        return ("existing" if r.get("existing") else "ok") if r["ok"] else str(r["code"])
    failed = sum(1 for r in results if not r["ok"])
    return f"{len(results) - failed} ok, {failed} failed" if failed else f"{len(results)} ok"


def _record(ctx: Ctx, now_us: int, note: dict[str, Any], outcome: str) -> None:
    table = ctx.tables.audit
    key = keys.u64(ctx.index) + keys.u64(ctx.audits_made)  # several records of one entry keep their order
    ctx.audits_made += 1
    ctx.txn.put(key, pack({"at_us": now_us, "raft_index": ctx.index, "who": str(note.get("who", "?")),
                           "what": str(note.get("what", "?")), "via": str(note.get("via", "")),
                           "outcome": outcome}), db=table)
    excess = ctx.txn.stat(table)["entries"] - AUDIT_RECORDS_MAX
    if excess > 0:
        with ctx.txn.cursor(db=table) as cur:
            cur.first()
            for _ in range(excess):
                cur.delete()
