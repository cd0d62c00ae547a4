"""GET /v1/preview: the next fire times of a schedule, computed the way the state
machine will compute them (storage/cron.py), without creating anything; it reads no
Raft state, so any node answers, leader or not, with its own clock.

GET /v1/jobs/{id}/preview: an existing job's next occurrences, each with the time its
run will become available (its jitter applied as a claim applies it), within its
schedule's bounds and its max_runs; one its skip_calendar will skip, as the calendar
stands now, says so (`skipped: "calendar"`) and counts against no max_runs."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from schedulerd import jobspec, timefmt, views
from schedulerd.api import inputs, jobs
from schedulerd.api.keys import NODE
from schedulerd.errors import InvalidJob, LimitExceeded, NotFound
from schedulerd.namespaces import split
from schedulerd.storage.model import Reason, RunState
from schedulerd.storage import calendars, claims, cron, queries, records

PREVIEW_N_DEFAULT = 10
QUERY_PARAMS = frozenset({"cron", "timezone", "every", "n", "from"})
JOB_QUERY_PARAMS = frozenset({"n"})


async def preview(request: web.Request) -> web.Response:
    node = request.app[NODE]
    inputs.check_query(request, QUERY_PARAMS)
    query = dict(request.query)
    n = _count(query, node.config.limits.preview_n_max)
    # One reading: an every interval is anchored at it, as a create at that instant would be.
    start_us = _from(query) if "from" in query else node.now_us()
    schedule = jobspec.parse_schedule(_schedule_spec(query), start_us, node.config.limits)
    fire_times = cron.preview(schedule, start_us, n)
    return views.respond(jobspec.warned({"fire_times": [timefmt.to_iso(us) for us in fire_times]}, schedule))


async def job_preview(request: web.Request) -> web.Response:
    node = request.app[NODE]
    inputs.check_query(request, JOB_QUERY_PARAMS)
    n = _count(dict(request.query), node.config.limits.preview_n_max)
    job_id = jobs.job_id_of(request)
    group = node.group_of_job(job_id)
    now_us = node.now_us()
    with node.read(group) as (txn, tables):
        reader = records.Reader(txn, tables)
        job = records.get_job(reader, job_id)
        # Occurrences claimed ahead of their time already have their run, and the job's next
        # fire time has moved past them.
        ahead = [records.get_run(reader, run_id) for run_id in records.occurrence_runs(reader, job_id, n, now_us)]
    if job is None:
        raise NotFound(f"no job {split(job_id)[1]!r}")
    occurrences = [{"scheduled_time": timefmt.to_iso(run["scheduled_us"]),
                    "start_time": timefmt.to_iso(run["available_us"]), "run_id": run["run_id"],
                    **({"skipped": run["reason"]} if run["state"] == RunState.SKIPPED else {})}
                   for run in ahead if run is not None]
    carried = calendars.carried(node.topology.meta.calendars() if node.topology is not None else {},
                                {job["skip_calendar"]} if job is not None and job.get("skip_calendar") else set())
    version = group.versions.writes()  # the rules the next claims will be applied by
    fire_us = job["next_fire_us"]
    # A limited job's runs claimed ahead are counted already: what is left comes after them.
    left = n if job.get("max_runs") is None else max(0, job["max_runs"] - job.get("runs_made", 0))
    while fire_us is not None and len(occurrences) < n and left > 0:
        next_us = cron.next_after(job["schedule"], fire_us)
        if calendars.skips(carried, job, fire_us):
            occurrences.append({"scheduled_time": timefmt.to_iso(fire_us), "start_time": timefmt.to_iso(fire_us),
                                "skipped": Reason.CALENDAR.value})
        else:
            left -= 1
            start_us = fire_us + claims.start_offset_us(job, fire_us, next_us, version)
            occurrences.append({"scheduled_time": timefmt.to_iso(fire_us), "start_time": timefmt.to_iso(start_us)})
        fire_us = next_us
    return views.respond({"job_id": split(job_id)[1], "state": queries.as_seen(job, now_us)["state"],
                          "occurrences": occurrences})


def _from(query: dict[str, str]) -> int:
    try:
        return timefmt.from_iso(query["from"])
    except ValueError as exc:
        raise InvalidJob(f"from: {exc}") from None


def _schedule_spec(query: dict[str, str]) -> dict[str, Any]:
    """The query string as the `schedule` object of a job, for jobspec to validate."""
    if ("cron" in query) == ("every" in query):
        raise InvalidJob("give exactly one of cron=EXPR (with optional timezone=ZONE) "
                         "or every=DURATION")
    if "every" in query:
        if "timezone" in query:
            raise InvalidJob("timezone applies only to cron; an every interval is elapsed time")
        return {"every": query["every"]}
    spec = {"cron": query["cron"]}
    if "timezone" in query:
        spec["timezone"] = query["timezone"]
    return spec


def _count(query: dict[str, str], n_max: int) -> int:
    raw = query.get("n")
    if raw is None:
        return min(PREVIEW_N_DEFAULT, n_max)
    try:
        n = int(raw)
    except ValueError:
        raise InvalidJob(f"n must be an integer from 1 to {n_max}, got {raw!r}") from None
    if n > n_max:
        raise LimitExceeded(f"n={n} is over preview_n_max ({n_max})")
    if n < 1:
        raise InvalidJob(f"n must be an integer from 1 to {n_max}, got {n}")
    return n
