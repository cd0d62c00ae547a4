"""Why an instant of a job did or did not run (storage/occurrences.py), decided on stores
built by applying commands, and said in words by schedulerd/api/occurrences.py."""
from __future__ import annotations

import pathlib
import random
from typing import Any

import pytest

from schedulerd.api import occurrences as api
from schedulerd.errors import InvalidRequest
from schedulerd.storage import cron, records
from schedulerd.storage.model import SKIP_REASONS, Reason
from schedulerd.storage.occurrences import Answer, Cause, Verdict, explain, previous_occurrence
from schedulerd.storage.ops import Op
from schedulerd.timefmt import from_iso
from tests.unit.fsm_driver import S, T0, Driver

H = 3600 * S
HOURLY = {"kind": "cron", "cron": "0 * * * *", "timezone": "UTC", "seconds": False}
EVERY5 = {"kind": "every", "every_us": 5 * S, "anchor_us": T0}


@pytest.fixture
def d(tmp_path: pathlib.Path) -> Driver:
    return Driver(str(tmp_path / "db"))


def ask(d: Driver, job_id: str, at_us: int, now_us: int) -> Answer:
    job = d.job(job_id)  # read before the txn below: the store allows one read txn per thread
    assert job is not None
    with d.store.read() as txn:
        return explain(records.Reader(txn, d.store.tables), job, at_us, now_us)


def said(d: Driver, job_id: str, at_us: int, now_us: int) -> dict[str, Any]:
    """The answer as the API sends it."""
    return api.document(d.job(job_id), at_us, ask(d, job_id, at_us, now_us), now_us)


# -- a run record answers ----------------------------------------------------------

def test_an_occurrence_that_ran_says_its_run_attempts_and_end(d: Driver) -> None:
    d.create("h", HOURLY)
    (run_id,) = d.claim_due(T0 + H)
    (task,) = d.lease(T0 + H + S)
    d.apply(Op.ACK, now=T0 + H + 2 * S, worker_id="w", acks=[[task["run_id"], task["fence"], None]])
    doc = said(d, "h", T0 + H, T0 + 2 * H)
    assert doc["verdict"] == "ran" and doc["run_id"] == run_id
    assert (doc["state"], doc["attempt"], doc["finished_at"]) == ("succeeded", 1, "2027-01-15T09:00:02Z")
    assert doc["explanation"] == f"It ran: run {run_id} succeeded at 2027-01-15T09:00:02Z after 1 attempt(s)."


def test_a_manual_trigger_is_a_run_but_not_an_occurrence(d: Driver) -> None:
    d.create("h", HOURLY)
    d.apply(Op.TRIGGER_JOB, now=T0 + 7 * S, job_id="h")
    doc = said(d, "h", T0 + 7 * S, T0 + 8 * S)
    assert doc["verdict"] == "ran" and doc["trigger"] is True and doc["state"] == "queued"
    assert doc["explanation"].endswith("; it was a manual trigger, not an occurrence of the schedule.")


def test_a_run_claimed_ahead_is_not_yet_due_with_its_jittered_start(d: Driver) -> None:
    d.create("h", HOURLY, jitter_us=30 * S)
    (run_id,) = d.claim_due(T0 + H)  # claimed at its time, asked about from before it
    run = d.run(run_id)
    doc = said(d, "h", T0 + H, T0 + H - 5 * S)
    assert doc["verdict"] == "not_yet_due" and doc["run_id"] == run_id
    assert from_iso(doc["start_time"]) == run["available_us"] > T0 + H


# -- skipped, with a sentence per reason -------------------------------------------

def test_missed_occurrences_are_skipped_by_the_misfire_policy_and_the_catch_up_summary(d: Driver) -> None:
    d.create("e", EVERY5, catchup_limit=3)
    d.claim_due(T0 + 100 * S)  # cutoff T0+95: 5..90 missed, the newest three considered, fire_once
    assert ask(d, "e", T0 + 90 * S, T0 + 100 * S).verdict == Verdict.RAN
    assert ask(d, "e", T0 + 85 * S, T0 + 100 * S).run["reason"] == Reason.MISFIRE_SKIP.value
    # 40 has no record of its own: the summary at 5 stands for 5..75.
    doc = said(d, "e", T0 + 40 * S, T0 + 100 * S)
    assert (doc["verdict"], doc["reason"], doc["skipped_count"]) == ("skipped", "catchup_limit", 15)
    assert (doc["skipped_from"], doc["skipped_until"]) == ("2027-01-15T08:00:05Z", "2027-01-15T08:01:15Z")
    assert "one of 15 missed occurrences" in doc["explanation"]
    assert said(d, "e", T0 + 85 * S, T0 + 100 * S)["explanation"].startswith(
        "It was missed (the group had no leader, or the cluster was down, at its time) and the job's "
        "misfire_policy (fire_once) did not run it late; run ")


def test_a_pause_across_an_occurrence_records_it_skipped_paused(d: Driver) -> None:
    d.create("e", EVERY5)
    d.apply(Op.PAUSE_JOB, now=T0 + 7 * S, job_id="e")  # 5 came due and was not claimed
    doc = said(d, "e", T0 + 5 * S, T0 + 8 * S)
    assert (doc["verdict"], doc["reason"]) == ("skipped", "paused")
    assert doc["explanation"].startswith("It came due before the job was paused and had not been claimed")


def test_a_schedule_patch_records_the_old_schedules_overdue_occurrence_rescheduled(d: Driver) -> None:
    d.create("e", EVERY5)
    d.apply(Op.UPDATE_JOB, now=T0 + 7 * S, job_id="e", changes={"schedule": {"kind": "every", "every_us": 60 * S}})
    doc = said(d, "e", T0 + 5 * S, T0 + 8 * S)
    assert (doc["verdict"], doc["reason"]) == ("skipped", "rescheduled")


def test_deadline_and_overlap_skips_say_the_setting(d: Driver) -> None:
    d.create("late", HOURLY, starting_deadline_us=2 * S, misfire_policy="fire_all")
    d.claim_due(T0 + H + 10 * S)  # more than misfire_grace_s late, past its deadline
    assert "starting_deadline_s (2 s)" in said(d, "late", T0 + H, T0 + 2 * H)["explanation"]
    d.create("busy", EVERY5, overlap_policy="skip")
    d.claim_due(T0 + 5 * S)
    d.claim_due(T0 + 10 * S)  # the run of 5 is still queued
    doc = said(d, "busy", T0 + 10 * S, T0 + 11 * S)
    assert (doc["reason"], doc["explanation"][:60]) == ("overlap", "A run of the job was still open at its time, and the job's o")


def test_every_skip_reason_has_its_own_sentence() -> None:
    # catchup_limit is only ever a summary, which has its own sentence.
    assert {reason.value for reason in SKIP_REASONS} - {Reason.CATCHUP_LIMIT.value} <= set(api._SKIPPED)


# -- the schedule answers ------------------------------------------------------------

def test_an_instant_between_occurrences_names_the_nearest_ones(d: Driver) -> None:
    d.create("h", HOURLY)
    doc = said(d, "h", T0 + H + 30 * 60 * S, T0)
    assert doc["verdict"] == "not_an_occurrence"
    assert (doc["previous_occurrence"], doc["next_occurrence"]) == ("2027-01-15T09:00:00Z", "2027-01-15T10:00:00Z")
    assert doc["explanation"].startswith("It is not an occurrence of the job's schedule (cron 0 * * * * in UTC)")


def test_a_cron_in_a_zone_is_judged_by_its_dst_rules(d: Driver) -> None:
    # 30 1 * * * in New York fires once on the fall-back night (2027-11-07), at 01:30 EDT.
    d.create("ny", {"kind": "cron", "cron": "30 1 * * *", "timezone": "America/New_York", "seconds": False})
    first, repeat = from_iso("2027-11-07T05:30:00Z"), from_iso("2027-11-07T06:30:00Z")
    assert ask(d, "ny", first, T0).verdict == Verdict.NOT_YET_DUE
    answer = ask(d, "ny", repeat, T0)  # 01:30 EST, the repeated hour: not fired again
    assert answer.verdict == Verdict.NOT_AN_OCCURRENCE
    assert (answer.previous_us, answer.next_us) == (first, from_iso("2027-11-08T06:30:00Z"))


def test_an_interval_counts_from_its_anchor(d: Driver) -> None:
    d.create("e", EVERY5)  # anchored at its creation, T0: first occurrence T0+5
    answer = ask(d, "e", T0 + 7 * S, T0)
    assert (answer.verdict, answer.previous_us, answer.next_us) == (Verdict.NOT_AN_OCCURRENCE, T0 + 5 * S, T0 + 10 * S)
    assert "every 5 s, counted from 2027-01-15T08:00:00Z" in said(d, "e", T0 + 7 * S, T0)["explanation"]
    d.apply(Op.UPDATE_JOB, now=T0 + 12 * S, job_id="e", changes={"schedule": EVERY5})  # re-anchored at T0+12
    assert ask(d, "e", T0 + 15 * S, T0 + 13 * S).verdict == Verdict.NOT_AN_OCCURRENCE
    assert ask(d, "e", T0 + 17 * S, T0 + 13 * S).verdict == Verdict.NOT_YET_DUE


def test_bounds_exclude_what_lies_outside_them(d: Driver) -> None:
    start, end = T0 + 100 * S, T0 + 200 * S
    d.create("b", {"kind": "every", "every_us": 10 * S, "start_us": start, "end_us": end})
    assert ask(d, "b", start, T0).verdict == Verdict.NOT_YET_DUE  # the start is the first occurrence
    doc = said(d, "b", start - 10 * S, T0)
    assert (doc["verdict"], doc["bound"], doc["start_at"]) == ("excluded_by_bounds", "start_at", "2027-01-15T08:01:40Z")
    assert said(d, "b", end + 10 * S, T0)["bound"] == "end_at"
    answer = ask(d, "b", start + 5 * S, T0)
    assert (answer.verdict, answer.previous_us, answer.next_us) == (Verdict.NOT_AN_OCCURRENCE, start, start + 10 * S)


def test_an_occurrence_before_the_job_existed(d: Driver) -> None:
    d.create("h", HOURLY, now=T0 + 10 * S)
    doc = said(d, "h", T0, T0 + 20 * S)
    assert (doc["verdict"], doc["created_at"]) == ("before_job_created", "2027-01-15T08:00:10Z")


def test_a_one_off_has_one_occurrence(d: Driver) -> None:
    d.create("once", {"kind": "at", "at_us": T0 + 60 * S})
    assert ask(d, "once", T0 + 60 * S, T0).verdict == Verdict.NOT_YET_DUE
    answer = ask(d, "once", T0 + 30 * S, T0)
    assert (answer.verdict, answer.previous_us, answer.next_us) == (Verdict.NOT_AN_OCCURRENCE, None, T0 + 60 * S)
    assert ask(d, "once", T0 + 90 * S, T0).previous_us == T0 + 60 * S
    d.apply(Op.PAUSE_JOB, now=T0 + 10 * S, job_id="once")
    assert said(d, "once", T0 + 60 * S, T0 + 70 * S)["explanation"].startswith(
        "The job was paused before its time was claimed: a resume claims it as a missed occurrence")


def test_previous_occurrence_agrees_with_a_walk_forward() -> None:
    """The bisection against the dumb reference: walk next_after forward from four days back
    (from the epoch for a one-off and a bounded interval, which have few occurrences)."""
    rng = random.Random(7)
    schedules = [
        {"kind": "cron", "cron": "30 1 * * *", "timezone": "America/New_York", "seconds": False},
        {"kind": "cron", "cron": "*/15 * * * *", "timezone": "Australia/Lord_Howe", "seconds": False},
        {"kind": "cron", "cron": "0 9-17 * * 1-5", "timezone": "Europe/Berlin", "seconds": False},
        {"kind": "every", "every_us": 7 * 60 * S + 1, "anchor_us": T0 + 3 * S},
        {"kind": "every", "every_us": 3600 * S, "anchor_us": T0 - 3600 * S, "start_us": T0, "end_us": T0 + 20 * H},
        {"kind": "at", "at_us": T0 + 5 * H}]
    for schedule in schedules:
        for _ in range(25):
            at_us = T0 + rng.randrange(0, 300 * 24 * H, S // 4)
            few = schedule["kind"] == "at" or "start_us" in schedule
            t, expected = cron.next_after(schedule, -1 if few else at_us - 4 * 24 * H), None
            while t is not None and t < at_us:
                expected, t = t, cron.next_after(schedule, t)
            assert previous_occurrence(schedule, at_us) == expected, (schedule, at_us)
    assert previous_occurrence(HOURLY, 0) is None


# -- the job's state answers ---------------------------------------------------------

def test_an_occurrence_inside_a_pause_and_one_to_come(d: Driver) -> None:
    d.create("e", EVERY5)
    d.apply(Op.PAUSE_JOB, now=T0 + 7 * S, job_id="e")
    doc = said(d, "e", T0 + 20 * S, T0 + 30 * S)
    assert (doc["verdict"], doc["job_state"], doc["job_updated_at"]) == ("job_paused", "paused", "2027-01-15T08:00:07Z")
    assert said(d, "e", T0 + 40 * S, T0 + 30 * S)["explanation"] == (
        "The job is paused: this occurrence runs only if the job is resumed before it.")


def test_occurrences_after_a_cancel_or_the_last_of_max_runs(d: Driver) -> None:
    d.create("e", EVERY5)
    d.apply(Op.CANCEL_JOB, now=T0 + 7 * S, job_id="e")
    assert ask(d, "e", T0 + 10 * S, T0 + 60 * S).verdict == Verdict.AFTER_JOB_FINISHED
    d.create("m", EVERY5, max_runs=1)
    d.claim_due(T0 + 5 * S)
    assert d.job("m")["state"] == "completed"
    doc = said(d, "m", T0 + 10 * S, T0 + 60 * S)
    assert doc["verdict"] == "after_job_finished" and "it made all 1 runs of its max_runs" in doc["explanation"]


def test_a_due_occurrence_not_yet_claimed_awaits_its_claim(d: Driver) -> None:
    d.create("e", EVERY5)
    doc = said(d, "e", T0 + 5 * S, T0 + 6 * S)
    assert (doc["verdict"], doc["next_fire_time"]) == ("awaiting_claim", "2027-01-15T08:00:05Z")
    d.create("m", EVERY5, max_runs=4)
    assert said(d, "m", T0 + 50 * S, T0)["runs_remaining"] == 4


# -- nothing recorded ---------------------------------------------------------------

def test_an_occurrence_older_than_the_kept_history_was_pruned(d: Driver) -> None:
    d.create("e", EVERY5, misfire_policy="skip", history_limit=3)
    d.claim_due(T0 + 30 * S)  # 5..20 skipped
    d.claim_due(T0 + 60 * S)  # the next claim drops the oldest first
    doc = said(d, "e", T0 + 5 * S, T0 + 61 * S)
    assert doc["verdict"] == "history_pruned" and doc["pruned_by"] == ["history_limit"]
    assert doc["kept_runs"] >= 3 and from_iso(doc["oldest_kept_time"]) > T0 + 5 * S
    assert "is gone: the job keeps about its newest 3 runs (history_limit)" in doc["explanation"]
    assert "cannot tell whether it had one" in doc["explanation"]


def test_an_occurrence_the_records_cannot_explain_lists_the_possible_causes(d: Driver) -> None:
    d.create("e", EVERY5)
    d.apply(Op.PAUSE_JOB, now=T0 + 1 * S, job_id="e")
    d.apply(Op.RESUME_JOB, now=T0 + 100 * S, job_id="e")  # 5..100 fell inside the pause: no records
    d.claim_due(T0 + 105 * S)
    answer = ask(d, "e", T0 + 50 * S, T0 + 106 * S)
    assert answer.verdict == Verdict.NO_RECORD
    # The interval is anchored at its creation: its schedule never changed.
    assert answer.causes == (Cause.HISTORY_PRUNED, Cause.PAUSED, Cause.DEAD_LETTER_DISCARDED)
    assert said(d, "e", T0 + 50 * S, T0 + 106 * S)["explanation"].startswith(
        "The records hold nothing for this past occurrence and cannot tell why: its run may have been deleted")
    # The history TTL would have deleted a run of it by now: pruned, said with the same caveat.
    d.create("t", EVERY5, history_ttl_us=20 * S)
    d.apply(Op.PAUSE_JOB, now=T0 + 1 * S, job_id="t")
    d.apply(Op.RESUME_JOB, now=T0 + 100 * S, job_id="t")
    assert ask(d, "t", T0 + 50 * S, T0 + 106 * S).pruned_by == ("history_ttl",)
    d.create("c", HOURLY)
    d.apply(Op.PAUSE_JOB, now=T0 + 1 * S, job_id="c")
    d.apply(Op.RESUME_JOB, now=T0 + 2 * H, job_id="c")
    assert Cause.SCHEDULE_CHANGED in ask(d, "c", T0 + H, T0 + 2 * H).causes


# -- the time in the path ------------------------------------------------------------

@pytest.mark.parametrize("text, us", [("2027-01-15T08:00:00Z", T0), ("2027-01-15T09:00:00+01:00", T0),
                                      ("2027-01-15T08:00:00.5Z", T0 + S // 2)])
def test_the_time_is_an_iso_instant_with_a_zone(text: str, us: int) -> None:
    assert api.parse_time(text) == us


@pytest.mark.parametrize("text", ["2027-01-15T08:00:00", "2027-01-15 08:00:00Z", "1969-12-31T23:59:59Z",
                                  "3000-01-01T00:00:00Z", "2027-02-30T00:00:00Z", "2016-12-31T23:59:60Z",
                                  "1970-01-01T00:00:00+01:00", "tomorrow", "2027-01-15T08:00:00.1234567Z"])
def test_a_time_in_another_form_is_refused_naming_the_format(text: str) -> None:
    with pytest.raises(InvalidRequest, match="is not an ISO 8601 instant from 1970-01-01T00:00:00Z to "
                                             "2999-12-31T23:59:59Z with Z or an offset"):
        api.parse_time(text)
