"""schedulerd/jobspec.py: what a request's options become in an entry."""
from __future__ import annotations

import pytest

from schedulerd.errors import InvalidJob
from schedulerd.jobspec import parse_job, parse_options
from schedulerd.limits import Limits

NOW = 1_800_000_000_000_000
STORED = {"base_ms": 1000, "factor": 2.0, "max_ms": 300_000}


def test_a_create_completes_a_partial_backoff_from_the_defaults() -> None:
    assert parse_options({"backoff": {"factor": 3}}, NOW, Limits())["backoff"] == \
        {"base_ms": 1000, "factor": 3.0, "max_ms": 300_000}


def test_an_update_sends_only_the_backoff_parts_given() -> None:
    """Apply completes them from the job as stored when the entry applies, so a concurrent
    update of another part is not overwritten with what this node read."""
    assert parse_options({"backoff": {"factor": 3}}, NOW, Limits(), backoff_base=STORED)["backoff"] == {"factor": 3.0}


def test_an_update_is_checked_against_the_backoff_this_node_reads() -> None:
    with pytest.raises(InvalidJob, match=r"backoff.max_ms \(500\) must be at least backoff.base_ms \(1000\)"):
        parse_options({"backoff": {"max_ms": 500}}, NOW, Limits(), backoff_base=STORED)


@pytest.mark.parametrize("at", ["1969-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "3000-01-01T00:00:00Z",
                                "9999-12-31T23:59:59-01:00"])
def test_a_time_outside_1970_to_2999_is_refused(at: str) -> None:
    """Before 1970 no storage key can hold it (the entry would stop every replica); near
    year 9999 the views could not render what follows from it."""
    with pytest.raises(InvalidJob, match=r"outside 1970-01-01T00:00:00Z \.\. 2999-12-31T23:59:59Z"):
        parse_options({"schedule": {"at": at}}, NOW, Limits())


def test_the_first_and_last_allowed_times_are_taken() -> None:
    assert parse_options({"schedule": {"at": "1970-01-01T00:00:00Z"}}, NOW, Limits())["schedule"]["at_us"] == 0
    assert parse_options({"schedule": {"at": "2999-12-31T23:59:59Z"}}, NOW, Limits())["schedule"]["at_us"] > NOW


def test_a_cron_that_never_fires_is_refused() -> None:
    with pytest.raises(InvalidJob, match=r"'0 0 30 2 \*' never fires"):
        parse_options({"schedule": {"cron": "0 0 30 2 *"}}, NOW, Limits())
    assert parse_options({"schedule": {"cron": "0 0 29 2 *"}}, NOW, Limits())["schedule"]["kind"] == "cron"


@pytest.mark.parametrize("zone", ["America", "x" * 300, "../../etc"])
def test_a_zone_that_is_a_folder_or_too_long_is_unknown(zone: str) -> None:
    with pytest.raises(InvalidJob, match="unknown time zone"):
        parse_options({"schedule": {"cron": "0 3 * * *", "timezone": zone}}, NOW, Limits())


@pytest.mark.parametrize("raw, message", [
    ({"job_id": "x\n"}, "job_id must be"), ({"job_id": ""}, "job_id must be"), ({"job_id": 0}, "job_id must be"),
    ({"job_id": False}, "job_id must be"), ({"queue": "q\n"}, "queue must be"),
    ({"schedule": {"every": "\u0665s"}}, "is not a duration"), ({"payload": float("nan")}, "NaN and Infinity"),
    ({"payload": {"x": float("inf")}}, "NaN and Infinity"),
])
def test_ids_queues_durations_and_payloads_are_checked_exactly(raw: dict, message: str) -> None:
    with pytest.raises(InvalidJob, match=message):
        parse_job({"schedule": {"every": "1h"}, **raw}, NOW, Limits())


def test_a_job_without_an_id_gets_one() -> None:
    assert len(parse_job({"schedule": {"every": "1h"}, "job_id": None}, NOW, Limits())["job_id"]) == 32


def test_jitter_reaching_the_starting_deadline_is_refused() -> None:
    """The deadline counts from the unjittered time: each occurrence jittered past it would
    be skipped, on a cluster with nothing else to do."""
    with pytest.raises(InvalidJob, match=r"jitter_s \(60\) must be less than starting_deadline_s \(60\)"):
        parse_job({"schedule": {"every": "1h"}, "jitter_s": 60, "starting_deadline_s": 60}, NOW, Limits())
    parse_job({"schedule": {"every": "1h"}, "jitter_s": 59, "starting_deadline_s": 60}, NOW, Limits())
    parse_job({"schedule": {"every": "1h"}, "jitter_s": 600}, NOW, Limits())


def test_one_idempotency_key_per_request() -> None:
    job = {"schedule": {"every": "1h"}, "idempotency_key": "from-body"}
    with pytest.raises(InvalidJob, match=r"header \('from-header'\) and the body's idempotency_key \('from-body'\)"):
        parse_job(job, NOW, Limits(), idempotency_key="from-header")
    assert parse_job(job, NOW, Limits(), idempotency_key="from-body")["idempotency_key"] == "from-body"
    assert parse_job({"schedule": {"every": "1h"}}, NOW, Limits(), idempotency_key="k")["idempotency_key"] == "k"
    assert parse_job(job, NOW, Limits())["idempotency_key"] == "from-body"


def test_a_key_without_a_job_id_names_the_same_job_on_every_retry() -> None:
    """The key is kept in the group of the job it made: a retry that made another id could
    land in another group and create a second job (the membership nemesis, 3 groups)."""
    job = {"schedule": {"every": "1h"}}
    first = parse_job(job, NOW, Limits(), idempotency_key="k-1")["job_id"]
    assert parse_job(dict(job, idempotency_key="k-1"), NOW, Limits())["job_id"] == first
    assert parse_job(job, NOW, Limits(), idempotency_key="k-2")["job_id"] != first
    assert parse_job(dict(job, job_id="mine"), NOW, Limits(), idempotency_key="k-1")["job_id"] == "mine"
    assert parse_job(job, NOW, Limits())["job_id"] != parse_job(job, NOW, Limits())["job_id"]


def _schedule(**raw: str) -> dict:
    return parse_options({"schedule": raw}, NOW, Limits())["schedule"]


def test_bounds_are_taken_for_cron_and_every_and_an_every_counts_from_its_start() -> None:
    bounded = _schedule(cron="0 2 * * *", start_at="2027-01-01T00:00:00Z", end_at="2027-02-01T00:00:00Z")
    assert (bounded["start_us"], bounded["end_us"]) == (1_798_761_600_000_000, 1_801_440_000_000_000)
    every = _schedule(every="1h", start_at="2027-01-01T09:00:00Z")
    assert every["anchor_us"] + every["every_us"] == every["start_us"] and "end_us" not in every


@pytest.mark.parametrize("raw, message", [
    ({"at": "2027-01-01T00:00:00Z", "end_at": "2027-02-01T00:00:00Z"},
     "schedule.start_at and end_at bound a cron or every schedule; a one-off has its own time"),
    ({"cron": "0 2 * * *", "start_at": "2027-02-01T00:00:00Z", "end_at": "2027-01-01T00:00:00Z"},
     "schedule.end_at (2027-01-01T00:00:00Z) must be after start_at (2027-02-01T00:00:00Z)"),
    ({"every": "1h", "end_at": "2020-01-01T00:00:00Z"},
     "schedule has no occurrence from now to end_at '2020-01-01T00:00:00Z'"),
    ({"cron": "0 2 * * *", "start_at": "tomorrow"}, "schedule.start_at: "),
    ({"cron": "0 2 * * *", "stop_at": "2027-01-01T00:00:00Z"}, "stop_at"),
])
def test_bad_bounds_are_refused_clearly(raw: dict, message: str) -> None:
    with pytest.raises(InvalidJob) as refused:
        _schedule(**raw)
    assert message in str(refused.value)
