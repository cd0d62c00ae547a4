"""Holiday calendars: their normalisation, the metadata ops that store them, and the claim
rule (an occurrence on a listed day of the calendar the job names, as the claim entry
carries it, is a `skipped` run with reason calendar), on a real store (fsm_driver)."""
from __future__ import annotations

import pathlib
from datetime import datetime, timezone
from typing import Any

import pytest

from schedulerd.storage import calendars, meta, ops
from schedulerd.storage.ops import Op
from tests.unit.fsm_driver import S, T0, Driver

MIN = 60 * S
# T0 is 2027-01-15T08:00Z: midnight starting 2027-01-15 in Los Angeles (UTC-8 in January).
TODAY = "2027-01-15"


def _utc_us(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()) * S


def _carried(*ranges: list[str], tz: str = "UTC") -> dict[str, Any]:
    return {"hol": {"timezone": tz, "ranges": [list(r) for r in ranges]}}


def _claim(d: Driver, now: int, carried: dict[str, Any] | None, version: int = ops.VERSION) -> dict[str, Any]:
    extra = {} if carried is None else {"calendars": carried}
    return d.apply(Op.CLAIM_BATCH, version=version, now=now, grace_us=5 * S,
                   claims=[list(item) for item in d.due(now)], **extra)


@pytest.fixture
def d(tmp_path: pathlib.Path) -> Driver:
    return Driver(str(tmp_path / "db"))


def _every_minute(d: Driver, job_id: str = "j", **fields: Any) -> None:
    d.create(job_id, {"kind": "every", "every_us": MIN, "anchor_us": T0}, skip_calendar="hol", **fields)


# -- normalisation -----------------------------------------------------------------------------

def test_days_and_ranges_are_merged_into_sorted_disjoint_ranges() -> None:
    dates = ["2026-12-31", {"from": "2026-12-24", "to": "2026-12-26"}, "2026-12-27", "2026-12-25",
             {"from": "2027-01-01", "to": "2027-01-01"}, "2026-11-01"]
    assert calendars.normalise(dates) == [["2026-11-01", "2026-11-01"], ["2026-12-24", "2026-12-27"],
                                          ["2026-12-31", "2027-01-01"]]
    assert calendars.normalise([]) == []


@pytest.mark.parametrize("dates, says", [
    ("2026-12-25", "must be a list"),
    (["20261225"], "dates[0] must be a date YYYY-MM-DD"),
    (["2026-02-30"], "dates[0] '2026-02-30' is not a date"),
    ([{"from": "2026-12-26", "to": "2026-12-24"}], "dates[0] ends (2026-12-24) before it starts"),
    (["2026-01-01", {"from": "2026-12-24"}], "dates[1] must be a day or a range"),
    ([7], "dates[0] must be a date"),
])
def test_bad_dates_are_refused_naming_the_item(dates: Any, says: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        calendars.normalise(dates)
    assert says in str(caught.value)


def test_the_day_is_the_calendars_own_across_daylight_saving_time() -> None:
    berlin = {"timezone": "Europe/Berlin", "ranges": [["2027-01-16", "2027-01-16"], ["2027-07-02", "2027-07-02"]]}
    # Summer, UTC+2: 22:30Z on 1 July is 00:30 on 2 July there (a fixed UTC+1 would say 23:30 on the 1st).
    assert calendars.falls_on(berlin, _utc_us("2027-07-01T22:30:00"))
    assert not calendars.falls_on(berlin, _utc_us("2027-07-01T21:30:00"))
    # Winter, UTC+1: 23:30Z on 15 January is 00:30 on the 16th there.
    assert calendars.falls_on(berlin, _utc_us("2027-01-15T23:30:00"))
    assert not calendars.falls_on(berlin, _utc_us("2027-01-15T22:30:00"))
    assert not calendars.falls_on(berlin, _utc_us("2027-07-03T00:00:00"))


# -- the metadata ops --------------------------------------------------------------------------

def _booted() -> dict[str, Any]:
    state = meta.empty()
    state["cluster"] = {"cluster_id": "c"}  # the calendar ops need a bootstrapped cluster, nothing more of it
    return state


def test_calendar_set_creates_then_replaces_and_delete_removes() -> None:
    state = _booted()
    ranges = [["2026-12-24", "2026-12-26"]]
    assert meta.apply(state, {"op": "calendar_set", "name": "hol", "timezone": "Europe/Berlin", "ranges": ranges,
                              "calendars_max": 2, "now": 5}) == {"ok": True, "created": True}
    assert state["calendars"]["hol"] == {"timezone": "Europe/Berlin", "ranges": ranges, "updated_us": 5}
    assert meta.apply(state, {"op": "calendar_set", "name": "hol", "timezone": "UTC", "ranges": [],
                              "calendars_max": 2, "now": 6}) == {"ok": True, "created": False}
    assert state["calendars"]["hol"]["timezone"] == "UTC"
    assert meta.apply(state, {"op": "calendar_delete", "name": "hol", "now": 7}) == {"ok": True}
    assert state["calendars"] == {}
    refused = meta.apply(state, {"op": "calendar_delete", "name": "hol", "now": 8})
    assert refused == {"ok": False, "error": "no calendar 'hol'"}


def test_the_count_limit_travels_in_the_command_and_a_replace_is_not_counted() -> None:
    state = _booted()
    set_ = {"op": "calendar_set", "timezone": "UTC", "ranges": [], "calendars_max": 1, "now": 1}
    assert meta.apply(state, {**set_, "name": "a"})["ok"]
    before = meta.apply(state, {**set_, "name": "b"})
    assert before == {"ok": False, "error": "there are 1 calendars, the most calendars_max allows"}
    assert sorted(state["calendars"]) == ["a"]
    assert meta.apply(state, {**set_, "name": "a"}) == {"ok": True, "created": False}


def test_an_older_build_refuses_the_op_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a replica of a build without calendars does with the entry: refuses it, as any
    unknown op, and keeps its state; it replays the entry with the new rules once upgraded."""
    old = {k: v for k, v in meta._HANDLERS.items() if not k.startswith("calendar_")}
    monkeypatch.setattr(meta, "_HANDLERS", old)
    state = _booted()
    before = dict(state)
    result = meta.apply(state, {"op": "calendar_set", "name": "hol", "timezone": "UTC", "ranges": [],
                                "calendars_max": 5, "now": 1})
    assert not result["ok"] and "unknown op 'calendar_set'" in result["error"]
    assert state == before


def test_a_claim_carries_only_the_calendars_named_and_only_their_days() -> None:
    stored = {"a": {"timezone": "UTC", "ranges": [["2027-01-01", "2027-01-02"]], "updated_us": 1},
              "b": {"timezone": "Asia/Tokyo", "ranges": [], "updated_us": 2}}
    assert calendars.carried(stored, {"a", "gone"}) == {"a": {"timezone": "UTC", "ranges": [["2027-01-01",
                                                                                            "2027-01-02"]]}}


# -- the claim rule ----------------------------------------------------------------------------

def _reasons(d: Driver, job_id: str = "j") -> list[tuple[int, str, str | None]]:
    runs = sorted(d.runs(job_id), key=lambda r: r["scheduled_us"])
    return [(r["scheduled_us"], r["state"], r["reason"]) for r in runs]


def test_an_occurrence_on_a_listed_day_is_skipped_on_time(d: Driver) -> None:
    _every_minute(d)
    result = _claim(d, T0 + MIN, _carried([TODAY, TODAY]))
    assert result["runs"] == [] and result["skipped_reasons"] == {"calendar": 1}
    assert _reasons(d) == [(T0 + MIN, "skipped", "calendar")]
    assert d.job("j")["next_fire_us"] == T0 + 2 * MIN  # and the job moves on
    # Another day listed: the next occurrence runs.
    result = _claim(d, T0 + 2 * MIN, _carried(["2027-01-16", "2027-01-20"]))
    assert len(result["runs"]) == 1 and _reasons(d)[-1] == (T0 + 2 * MIN, "queued", None)


def test_a_catch_up_skips_the_missed_occurrences_of_listed_days(d: Driver) -> None:
    """Minutes missed across midnight in Los Angeles (T0): those of 14 January there are
    listed, those of the 15th run (fire_all)."""
    d.create("j", {"kind": "every", "every_us": MIN, "anchor_us": T0 - 4 * MIN}, now=T0 - 4 * MIN,
             skip_calendar="hol", misfire_policy="fire_all")
    _claim(d, T0 + 2 * MIN + 30 * S, _carried(["2027-01-10", "2027-01-14"], tz="America/Los_Angeles"))
    assert _reasons(d) == [(T0 - 3 * MIN, "skipped", "calendar"), (T0 - 2 * MIN, "skipped", "calendar"),
                           (T0 - MIN, "skipped", "calendar"), (T0, "queued", None), (T0 + MIN, "queued", None),
                           (T0 + 2 * MIN, "queued", None)]


def test_a_calendar_changed_applies_from_the_next_claim(d: Driver) -> None:
    _every_minute(d)
    _claim(d, T0 + MIN, _carried())  # no day listed yet
    _claim(d, T0 + 2 * MIN, _carried([TODAY, TODAY]))  # the calendar now lists today
    _claim(d, T0 + 3 * MIN, _carried())  # and no longer
    assert _reasons(d) == [(T0 + MIN, "queued", None), (T0 + 2 * MIN, "skipped", "calendar"),
                           (T0 + 3 * MIN, "queued", None)]


def test_a_calendar_the_entry_does_not_carry_skips_nothing(d: Driver) -> None:
    _every_minute(d)
    _claim(d, T0 + MIN, None)  # deleted, or unknown to the proposer
    _claim(d, T0 + 2 * MIN, {"other": {"timezone": "UTC", "ranges": [[TODAY, TODAY]]}})
    assert [state for _, state, _ in _reasons(d)] == ["queued", "queued"]


def test_an_entry_before_version_19_ignores_the_calendars_it_carries(d: Driver) -> None:
    _every_minute(d)
    _claim(d, T0 + MIN, _carried([TODAY, TODAY]), version=ops.CALENDAR_SINCE - 1)
    assert _reasons(d) == [(T0 + MIN, "queued", None)]


def test_a_trigger_ignores_the_calendar(d: Driver) -> None:
    _every_minute(d)
    result = d.apply(Op.TRIGGER_JOB, now=T0 + 30 * S, job_id="j")
    assert result["ok"] and result["run"]["state"] == "queued"


def test_a_create_leaves_the_first_occurrence_of_a_job_naming_a_calendar_to_the_scan(d: Driver) -> None:
    spec = {"kind": "at", "at_us": T0 + S}
    common = dict(now=T0, claim_ahead_us=12 * S, grace_us=5 * S)
    plain = d.apply(Op.CREATE_JOBS, jobs=[{"job_id": "p", "schedule": spec, "schedule_spec": {}}], **common)
    assert len(plain["runs"]) == 1  # due within the lookahead: claimed by the create
    named = d.apply(Op.CREATE_JOBS, jobs=[{"job_id": "c", "schedule": spec, "schedule_spec": {},
                                           "skip_calendar": "hol"}], **common)
    assert named["runs"] == [] and d.runs("c") == [] and d.job("c")["next_fire_us"] == T0 + S
    _claim(d, T0 + S, _carried([TODAY, TODAY]))
    assert _reasons(d, "c") == [(T0 + S, "skipped", "calendar")]


def test_the_users_of_a_calendar_are_its_scheduled_and_paused_jobs(d: Driver) -> None:
    for job_id in ("a", "b", "c", "d"):
        _every_minute(d, job_id)
    d.create("e", {"kind": "every", "every_us": MIN, "anchor_us": T0})
    d.apply(Op.PAUSE_JOB, now=T0, job_id="b")
    d.apply(Op.CANCEL_JOB, now=T0, job_id="c")
    with d.store.read() as txn:
        assert calendars.users(txn, d.store.tables, "hol", 10) == ["a", "b", "d"]
        assert calendars.users(txn, d.store.tables, "hol", 1) == ["a"]
        assert calendars.users(txn, d.store.tables, "other", 10) == []
