"""POST /v1/jobs/{id}/backfill: a run for each past occurrence of a job's schedule in a range
that has none yet, or, with dry_run, exactly which occurrences it would run and which
already have a run, changing nothing (storage/backfill.py applies it)."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from schedulerd import timefmt, views
from schedulerd.api import inputs, jobs
from schedulerd.api.keys import NODE
from schedulerd.auth import audit_note
from schedulerd.errors import InvalidRequest, LimitExceeded, NotFound, from_wire
from schedulerd.namespaces import split
from schedulerd.storage import backfill as backfills
from schedulerd.storage import ops, records
from schedulerd.storage.model import OverlapPolicy
from schedulerd.storage.ops import Op

FIELDS = frozenset({"start", "end", "dry_run", "overlap_policy"})
_POLICIES = [p.value for p in OverlapPolicy]


async def backfill(request: web.Request) -> web.Response:
    node = request.app[NODE]
    limit = node.config.limits.backfill_occurrences_max
    raw = await inputs.body(request)
    unknown = sorted(raw.keys() - FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown field(s): {', '.join(unknown)}; allowed: {', '.join(sorted(FIELDS))}")
    job_id = jobs.job_id_of(request)
    start_us, end_us = _instant(raw, "start"), _instant(raw, "end")
    now = node.now_us()
    if end_us <= start_us:
        raise InvalidRequest(f"end ({raw['end']}) must be after start ({raw['start']})")
    if end_us > now:
        raise InvalidRequest(f"end ({raw['end']}) is in the future: a backfill runs past occurrences; the coming ones "
                             "run on schedule")
    dry_run = raw.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise InvalidRequest("dry_run must be true or false")
    policy = raw.get("overlap_policy")
    if policy is not None and policy not in _POLICIES:
        raise InvalidRequest(f"overlap_policy must be one of {', '.join(_POLICIES)}")
    group = node.group_of_job(job_id)
    with node.read(group) as (txn, tables):
        reader = records.Reader(txn, tables)
        job = records.get_job(reader, job_id)
        if job is None:
            raise NotFound(f"no job {split(job_id)[1]!r}")
        # From the job's next fire time on, occurrences are the scheduler's own to claim.
        reached = job["next_fire_us"]
        times = backfills.occurrences(job["schedule"], start_us, end_us if reached is None else min(end_us, reached),
                                      limit)
        if len(times) > limit:
            raise LimitExceeded(f"{raw['start']}..{raw['end']} holds more than backfill_occurrences_max ({limit}) "
                                "occurrences of the schedule: backfill it in shorter ranges")
        had = {at_us: run for at_us in times if (run := records.run_at(reader, job_id, at_us)) is not None}
    if dry_run:
        return views.respond(_answer(job_id, True, times, had, {}, reached))
    node.require_entry_version(group, ops.BACKFILL_SINCE, "a backfill")
    if policy in jobs.NEW_OVERLAP_POLICIES:
        node.require_entry_version(group, ops.OVERLAP_HOLD_SINCE, f"overlap_policy {policy}")
    fresh = [at_us for at_us in times if at_us not in had]
    result = await node.propose(group, Op.BACKFILL_JOB, {
        "job_id": job_id, "occurrences": fresh, **({"overlap_policy": policy} if policy else {}),
        "audit": audit_note(request, f"backfill job {split(job_id)[1]}: {len(fresh)} occurrences from "
                                     f"{raw['start']} to {raw['end']}")})
    if not result["ok"]:
        raise from_wire(result["code"], result["message"])
    with node.read(group) as (txn, tables):
        reader = records.Reader(txn, tables)
        made = {at_us: run for at_us in fresh if (run := records.run_at(reader, job_id, at_us)) is not None}
    return views.respond(_answer(job_id, False, times, had, made, reached))


def _answer(job_id: str, dry_run: bool, times: list[int], had: dict[int, dict[str, Any]],
            made: dict[int, dict[str, Any]], reached: int | None) -> dict[str, Any]:
    """Each occurrence of the range the job's claims have passed (`next_fire_time`: where
    they go on): the run it already had, the run the backfill made (or, dry, would make: no
    run yet), in time order."""
    occurrences = []
    for at_us in times:
        run = had.get(at_us) or made.get(at_us)
        item: dict[str, Any] = {"scheduled_time": timefmt.to_iso(at_us), "already_had_run": at_us in had}
        if run is not None:
            item.update(run_id=run["run_id"], state=run["state"], reason=run.get("reason"))
        occurrences.append(item)
    counts = {"would_create": len(times) - len(had)} if dry_run else {"created": len(made)}
    return {"job_id": split(job_id)[1], "dry_run": dry_run, "occurrences": occurrences,
            "already_had_run": len(had), **counts, "next_fire_time": timefmt.to_iso(reached)}


def _instant(raw: dict[str, Any], name: str) -> int:
    if name not in raw:
        raise InvalidRequest(f"{name} is required: an ISO 8601 instant like 2026-12-01T00:00:00Z")
    try:
        return timefmt.from_iso(raw[name])
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"{name}: {exc}") from None
