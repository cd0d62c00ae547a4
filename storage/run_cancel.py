"""Where one run is cancelled: an operator's `POST /v1/runs/{id}/cancel` (CANCEL_RUN), and
the cancel_other overlap policy's cancel of the runs a new occurrence replaces.

A queued or retry-waiting run is cancelled at once. So is a running one, and its lease is
revoked: its worker learns it from its next heartbeat (stale_fence, saying why), and its
ack or nack is refused from then on, as any stale lease's is."""
from __future__ import annotations

from typing import Any

from schedulerd.storage import records
from schedulerd.storage.model import PENDING_RUN_STATES, RUN_RUNNING, Reason, RunEvent, RunState, run_transition
from schedulerd.storage.records import Ctx, Record

CANCELLABLE = frozenset({*(s.value for s in PENDING_RUN_STATES), RUN_RUNNING})


def cancel_run(ctx: Ctx, cmd: dict[str, Any]) -> dict[str, Any]:
    """A cancel repeated by a caller that never got its answer is answered ok (`repeated`)."""
    run_id = cmd["run_id"]
    run = records.get_run(ctx, run_id)
    if run is None:
        return records.rejected("not_found", f"no run {run_id!r}")
    if run["state"] == RunState.CANCELLED and run["reason"] == Reason.RUN_CANCELLED:
        return {"ok": True, "run": run, "repeated": True}
    if run["state"] == RunState.DEAD_LETTER:
        return records.rejected("conflict", f"run {run_id!r} is a dead letter, which nothing runs: re-drive it "
                                            "(POST /v1/runs/{id}/retry) or discard it (DELETE /v1/runs/{id})")
    if run["state"] not in CANCELLABLE:
        return records.rejected("conflict", f"run {run_id!r} is {run['state']}: only a queued, retry_wait or "
                                            "running run can be cancelled")
    return {"ok": True, "run": stop(ctx, run, cmd["now"], Reason.RUN_CANCELLED)}


def stop(ctx: Ctx, run: Record, now: int, reason: Reason) -> Record:
    """Cancel an open run (revoking its lease if it runs); returns it as stored."""
    after = dict(run, state=run_transition(run["state"], RunEvent.CANCEL), lease_until_us=None, finished_us=now,
                 reason=reason.value)
    after.pop("buffered", None)
    records.update_run(ctx, run, after)
    return after
