"""GET /v1/jobs/{id}/occurrences/{time}: why one instant of a job did or did not run.

storage/occurrences.explain decides the verdict from one read of the job's group (no
Raft entry, so any replica answers from what it has applied); this module reads the
instant from the path and says the verdict in a sentence, with the facts behind it."""
from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from schedulerd import timefmt, views
from schedulerd.api import inputs, jobs
from schedulerd.api.keys import NODE
from schedulerd.errors import InvalidRequest, NotFound
from schedulerd.namespaces import split
from schedulerd.storage import calendars, records
from schedulerd.storage.occurrences import Answer, Cause, Verdict, explain
from schedulerd.storage.model import JobState, RunState
from schedulerd.units import US_PER_S

# The one form the path takes, so a schema can state it: an ISO 8601 instant with Z or an
# offset, seconds, at most six fractional digits, in the years the API accepts.
TIME_RE = re.compile(r"(19[7-9][0-9]|2[0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
                     r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])")
TIME_FORMAT = (f"an ISO 8601 instant from {timefmt.TIME_MIN_TEXT} to {timefmt.TIME_MAX_TEXT} with Z or an offset, "
               "like 2026-11-30T02:00:00Z or 2026-11-30T03:00:00+01:00")

_SKIPPED = {
    "misfire_skip": "It was missed (the group had no leader, or the cluster was down, at its time) and the job's "
                    "misfire_policy ({misfire_policy}) did not run it late",
    "deadline": "It could not start within starting_deadline_s ({deadline_s} s) of its time",
    "overlap": "A run of the job was still open at its time, and the job's overlap_policy ({overlap_policy}) "
               "skipped it",
    "paused": "It came due before the job was paused and had not been claimed: the pause recorded it skipped "
              "instead of running it late",
    "rescheduled": "It came due before the job's schedule was changed (PATCH) and had not been claimed: the "
                   "update recorded it skipped",
    "calendar": "It fell on a date of the job's skip calendar",
}
_CANCELLED = {
    "job_cancelled": "it was cancelled at {finished_at} because the job was cancelled",
    "run_cancelled": "it was cancelled on its own at {finished_at} (POST /v1/runs/{{run_id}}/cancel)",
    "overlap": "it was cancelled at {finished_at} for a newer occurrence (overlap_policy cancel_other)",
}
_CAUSES = {
    Cause.HISTORY_PRUNED: "its run may have been deleted with the job's older history (history_limit, "
                          "history_ttl_s)",
    Cause.PAUSED: "the job may have been paused over it (a pause and its resume leave no record of the "
                  "occurrences between them, and before entry version 9 neither did those a pause stepped over)",
    Cause.SCHEDULE_CHANGED: "the schedule may have been another one then (only the current one is kept)",
    Cause.DEAD_LETTER_DISCARDED: "its run may have been a dead letter that was discarded",
}


async def explain_occurrence(request: web.Request) -> web.Response:
    node = request.app[NODE]
    inputs.check_query(request, frozenset())
    job_id = jobs.job_id_of(request)
    at_us = parse_time(request.match_info["time"])
    group = node.group_of_job(job_id)
    now_us = node.now_us()
    with node.read(group) as (txn, tables):  # one consistent read: the job and its runs together
        reader = records.Reader(txn, tables)
        job = records.get_job(reader, job_id)
        if job is None:
            raise NotFound(f"no job {split(job_id)[1]!r}")
        answer = explain(reader, job, at_us, now_us)
    named = job.get("skip_calendar")
    stands = calendars.carried(node.topology.meta.calendars() if node.topology is not None and named else {},
                               {named} if named else set())
    return views.respond(document(job, at_us, answer, now_us, calendars.skips(stands, job, at_us)))


def parse_time(text: str) -> int:
    """The instant the path names, in epoch microseconds; 400 naming the format otherwise."""
    if not TIME_RE.fullmatch(text):
        raise InvalidRequest(f"time {text[:64]!r} is not {TIME_FORMAT}")
    try:
        return timefmt.from_iso(text)
    except (ValueError, OverflowError) as exc:
        raise InvalidRequest(f"time {text[:64]!r} is not {TIME_FORMAT}: {exc}") from None


def document(job: dict[str, Any], at_us: int, answer: Answer, now_us: int, on_calendar: bool = False) -> dict[str, Any]:
    """The answer as JSON: the verdict, one sentence, and the facts it rests on. on_calendar:
    the job's skip_calendar, as it stands now, lists the instant's day."""
    facts = _facts(job, answer)
    sentence = _sentence(job, answer, facts, at_us, now_us)
    if on_calendar and answer.run is None and answer.verdict in (Verdict.NOT_YET_DUE, Verdict.AWAITING_CLAIM):
        facts["skip_calendar"] = job["skip_calendar"]
        sentence += (f" Its day is on calendar {job['skip_calendar']!r}: unless the calendar changes first, its "
                     "claim records it skipped (reason calendar).")
    return {"job_id": split(job["job_id"])[1], "time": timefmt.to_iso(at_us), "verdict": answer.verdict.value,
            "explanation": sentence, **facts}


def _facts(job: dict[str, Any], answer: Answer) -> dict[str, Any]:
    verdict, iso = answer.verdict, timefmt.to_iso
    if answer.run is not None:
        return _run_facts(answer.run, verdict)
    schedule = job["schedule"]
    if verdict == Verdict.NOT_AN_OCCURRENCE:
        return {"previous_occurrence": iso(answer.previous_us), "next_occurrence": iso(answer.next_us),
                "schedule": job["schedule_spec"]}
    if verdict == Verdict.EXCLUDED_BY_BOUNDS:
        return {"bound": answer.bound, "start_at": iso(schedule.get("start_us")),
                "end_at": iso(schedule.get("end_us"))}
    if verdict == Verdict.BEFORE_JOB_CREATED:
        return {"created_at": iso(job["created_us"])}
    if verdict in (Verdict.AFTER_JOB_FINISHED, Verdict.JOB_PAUSED):
        return {"job_state": job["state"], "job_updated_at": iso(job["updated_us"])}
    if verdict in (Verdict.NOT_YET_DUE, Verdict.AWAITING_CLAIM):
        remaining = None if job.get("max_runs") is None else max(0, job["max_runs"] - job.get("runs_made", 0))
        return {"next_fire_time": iso(job["next_fire_us"]),
                **({"runs_remaining": remaining} if remaining is not None else {})}
    kept = {"kept_runs": answer.kept_runs, "oldest_kept_time": iso(answer.oldest_kept_us)}
    if verdict == Verdict.HISTORY_PRUNED:
        return {**kept, "history_limit": job["history_limit"],
                "history_ttl_s": _seconds(job.get("history_ttl_us", 0)), "pruned_by": list(answer.pruned_by)}
    return {**kept, "possible_causes": [cause.value for cause in answer.causes]}


def _run_facts(run: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
    iso = timefmt.to_iso
    facts: dict[str, Any] = {"run_id": run["run_id"], "state": run["state"], "attempt": run["attempt"],
                             "max_attempts": run["max_attempts"], "start_time": iso(run["available_us"]),
                             "finished_at": iso(run["finished_us"]), "reason": run.get("reason"),
                             "trigger": run.get("trigger", False)}
    if "skipped_until_us" in run:  # a catch-up summary: the span of occurrences it stands for
        facts.update(skipped_from=iso(run["scheduled_us"]), skipped_until=iso(run["skipped_until_us"]),
                     skipped_count=run.get("skipped_count"))
    if run.get("buffered"):
        facts["buffered"] = True  # queued behind the job's open runs (overlap_policy buffer_*)
    if verdict == Verdict.SKIPPED:  # it never started: no start time, no attempts
        for name in ("start_time", "attempt", "max_attempts"):
            del facts[name]
    return facts


def _sentence(job: dict[str, Any], answer: Answer, facts: dict[str, Any], at_us: int, now_us: int) -> str:
    verdict = answer.verdict
    if verdict == Verdict.RAN:
        return _ran(job, facts)
    if verdict == Verdict.SKIPPED:
        return _skipped(job, facts)
    if verdict == Verdict.NOT_YET_DUE:
        return _to_come(facts)
    if verdict == Verdict.AWAITING_CLAIM:
        return (f"It is due and not claimed yet: the group leader claims occurrences as they come due, and one "
                f"claimed more than misfire_grace_s late counts as missed (misfire_policy "
                f"{job['misfire_policy']} decides); a wait longer than a few seconds means the group has no leader.")
    if verdict == Verdict.NOT_AN_OCCURRENCE:
        before = facts["previous_occurrence"] or "none"
        after = facts["next_occurrence"] or "none"
        return (f"It is not an occurrence of the job's schedule ({_schedule_text(job)}): the nearest are {before} "
                f"before it and {after} after it.")
    if verdict == Verdict.EXCLUDED_BY_BOUNDS:
        if answer.bound == "start_at":
            return f"It is before the schedule's start_at ({facts['start_at']}): no occurrence comes before that."
        return f"It is after the schedule's end_at ({facts['end_at']}): no occurrence comes after that."
    if verdict == Verdict.BEFORE_JOB_CREATED:
        return (f"The job did not exist yet: it was created at {facts['created_at']}, and its occurrences "
                f"start after that.")
    if verdict == Verdict.AFTER_JOB_FINISHED:
        return _finished(job, facts)
    if verdict == Verdict.JOB_PAUSED:
        return _paused(job, facts, at_us, now_us)
    if verdict == Verdict.HISTORY_PRUNED:
        return _pruned(job, facts)
    causes = "; ".join(_CAUSES[cause] for cause in answer.causes)
    return f"The records hold nothing for this past occurrence and cannot tell why: {causes}."


def _ran(job: dict[str, Any], facts: dict[str, Any]) -> str:
    run_id, state, attempt, tries = facts["run_id"], facts["state"], facts["attempt"], facts["max_attempts"]
    if state == RunState.QUEUED.value and facts.get("buffered"):
        text = (f"It was claimed as run {run_id}, which waits behind the job's open runs (overlap_policy "
                f"{job['overlap_policy']})")
    elif state == RunState.QUEUED.value:
        text = f"It was claimed as run {run_id}, which waits for a worker from {facts['start_time']}"
    elif state == RunState.RUNNING.value:
        text = f"It is running: run {run_id}, attempt {attempt} of {tries}"
    elif state == RunState.SUCCEEDED.value:
        text = f"It ran: run {run_id} succeeded at {facts['finished_at']} after {attempt} attempt(s)"
    elif state == RunState.RETRY_WAIT.value:
        text = f"It ran and attempt {attempt} of {tries} failed: run {run_id} tries again from {facts['start_time']}"
    elif state == RunState.DEAD_LETTER.value:
        text = (f"It ran and failed {attempt} attempt(s): run {run_id} is a dead letter since "
                f"{facts['finished_at']} ({facts['reason']})")
    else:
        how = _CANCELLED.get(facts["reason"], "it was cancelled at {finished_at} ({reason})").format(**facts)
        text = f"Run {run_id} did not finish: {how}, after {attempt} attempt(s)"
    if facts["trigger"]:
        text += "; it was a manual trigger, not an occurrence of the schedule"
    return text + "."


def _skipped(job: dict[str, Any], facts: dict[str, Any]) -> str:
    if "skipped_until" in facts:
        count = facts["skipped_count"] if facts["skipped_count"] is not None else "more than 1000"
        return (f"It was one of {count} missed occurrences, from {facts['skipped_from']} to {facts['skipped_until']}, "
                f"older than the newest catchup_limit ({job['catchup_limit']}) that were considered: none of them "
                f"ran, and run {facts['run_id']} records them all.")
    deadline_us = job.get("starting_deadline_us")
    template = _SKIPPED.get(facts["reason"], "It was skipped ({reason})")
    text = template.format(reason=facts["reason"], misfire_policy=job["misfire_policy"],
                           overlap_policy=job["overlap_policy"],
                           deadline_s=_seconds(deadline_us) if deadline_us is not None else "-")
    return f"{text}; run {facts['run_id']} records the skip."


def _to_come(facts: dict[str, Any]) -> str:
    if "run_id" in facts:
        return f"It is still to come: claimed ahead as run {facts['run_id']}, it starts at {facts['start_time']}."
    text = "It is still to come: an occurrence of the job's schedule, not claimed yet"
    if "runs_remaining" in facts:
        text += f"; the job has {facts['runs_remaining']} run(s) left of max_runs, and stops when they are made"
    return text + "."


def _finished(job: dict[str, Any], facts: dict[str, Any]) -> str:
    state = facts["job_state"]
    why = ""
    if state == JobState.COMPLETED.value and job.get("max_runs") is not None \
            and job.get("runs_made", 0) >= job["max_runs"]:
        why = f" (it made all {job['max_runs']} runs of its max_runs)"
    return (f"The job had finished: it is {state} since {facts['job_updated_at']} at the latest{why}, and a "
            f"finished job has no more occurrences.")


def _paused(job: dict[str, Any], facts: dict[str, Any], at_us: int, now_us: int) -> str:
    if at_us > now_us:
        return "The job is paused: this occurrence runs only if the job is resumed before it."
    if job["schedule"]["kind"] == "at":
        return ("The job was paused before its time was claimed: a resume claims it as a missed occurrence, "
                f"and its misfire_policy ({job['misfire_policy']}) decides whether it runs late.")
    return (f"The job is paused, and was then (since {facts['job_updated_at']} at the latest): occurrences inside "
            f"a pause do not run, and a resume does not catch them up.")


def _pruned(job: dict[str, Any], facts: dict[str, Any]) -> str:
    rules = []
    if "history_limit" in facts["pruned_by"]:
        rules.append(f"keeps about its newest {job['history_limit']} runs (history_limit)")
    if "history_ttl" in facts["pruned_by"]:
        rules.append(f"deletes runs that ended more than {facts['history_ttl_s']} s ago (history_ttl_s)")
    oldest = f"the oldest it keeps is from {facts['oldest_kept_time']}" if facts["oldest_kept_time"] else \
        "it keeps none that pruning would have deleted first"
    return (f"Its run record, if it had one, is gone: the job {' and '.join(rules)}, and {oldest}. The records "
            f"keep nothing of what was deleted, so they cannot tell whether it had one (a pause over it, or an "
            f"earlier schedule, leaves none either).")


def _schedule_text(job: dict[str, Any]) -> str:
    schedule = job["schedule"]
    if schedule["kind"] == "cron":
        return f"cron {schedule['cron']} in {schedule['timezone']}"
    if schedule["kind"] == "every":
        # The grid an interval fires on is counted from its anchor: the creation, a PATCH of
        # the schedule, or one interval before its start_at.
        return f"every {_seconds(schedule['every_us'])} s, counted from {timefmt.to_iso(schedule['anchor_us'])}"
    return f"at {timefmt.to_iso(schedule['at_us'])}"


def _seconds(us: int) -> int | float:
    return us // US_PER_S if us % US_PER_S == 0 else us / US_PER_S
