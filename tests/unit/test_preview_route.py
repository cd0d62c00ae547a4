"""GET /v1/preview (schedulerd/api/preview.py) on aiohttp's test server, with a
stub node: a fixed clock and the default limits, no Raft."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from schedulerd.api import app as api
from schedulerd.api import preview
from schedulerd.api.keys import NODE
from schedulerd.limits import Limits
from schedulerd.timefmt import from_iso

NOW = "2026-10-31T12:00:00Z"


class FixedClock:
    def __init__(self, now: str) -> None:
        self.now = from_iso(now)

    def now_us(self) -> int:
        return self.now


def stub_node(now: str = NOW) -> SimpleNamespace:
    clock = FixedClock(now)
    config = SimpleNamespace(limits=Limits(), lease_s=30.0, http_host="127.0.0.1", allowed_hosts=(),
                             allowed_origins=())
    return SimpleNamespace(clock=clock, now_us=clock.now_us, config=config, propose=None,
                           groups=[], applied_listeners=[], group_listeners=[])


def get(query: dict[str, Any] | str, now: str = NOW) -> tuple[int, Any]:
    """One GET /v1/preview against a fresh app: (status, JSON body)."""

    async def go() -> tuple[int, Any]:
        app = web.Application(middlewares=[api.errors_middleware])
        app[NODE] = stub_node(now)  # type: ignore[assignment]
        app.router.add_get("/v1/preview", preview.preview)
        async with TestClient(TestServer(app)) as client:
            path = f"/v1/preview?{query}" if isinstance(query, str) else "/v1/preview"
            params = None if isinstance(query, str) else query
            resp = await client.get(path, params=params)
            return resp.status, await resp.json()

    return asyncio.run(go())


def fire_times(query: dict[str, Any], now: str = NOW) -> list[str]:
    status, body = get(query, now)
    assert status == 200, body
    assert "fire_times" in body
    return body["fire_times"]


def error(query: dict[str, Any] | str) -> tuple[int, str, str]:
    status, body = get(query)
    return status, body["error"]["code"], body["error"]["message"]


# -- answers --------------------------------------------------------------------------

def test_cron_in_a_zone_follows_the_dst_rules():
    # 30 1 * * * in New York: once on the fall-back night, at 01:30 EDT.
    assert fire_times({"cron": "30 1 * * *", "timezone": "America/New_York", "n": 3}) == [
        "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z", "2026-11-03T06:30:00Z"]


def test_defaults_are_ten_fire_times_in_utc():
    times = fire_times({"cron": "0 2 * * *"})
    assert len(times) == 10
    assert times[:2] == ["2026-11-01T02:00:00Z", "2026-11-02T02:00:00Z"]


def test_six_field_cron_has_seconds():
    assert fire_times({"cron": "*/20 * * * * *", "n": 3}) == [
        "2026-10-31T12:00:20Z", "2026-10-31T12:00:40Z", "2026-10-31T12:01:00Z"]


def test_every_counts_from_now():
    assert fire_times({"every": "1h30m", "n": 2}) == ["2026-10-31T13:30:00Z", "2026-10-31T15:00:00Z"]
    assert fire_times({"every": "250ms1s", "n": 1}, now="2026-10-31T12:00:00.5Z") == [
        "2026-10-31T12:00:01.750000Z"]


def test_from_previews_after_another_instant():
    assert fire_times({"cron": "0 2 * * *", "n": 2, "from": "2027-03-01T03:00:00Z"}) == [
        "2027-03-02T02:00:00Z", "2027-03-03T02:00:00Z"]
    assert fire_times({"every": "1h", "n": 1, "from": "2027-03-01T03:00:00Z"}) == ["2027-03-01T04:00:00Z"]
    assert error({"cron": "0 2 * * *", "from": "yesterday"})[:2] == (400, "invalid_job")


@pytest.mark.parametrize("alias,first", [
    ("@hourly", "2026-10-31T13:00:00Z"), ("@daily", "2026-11-01T00:00:00Z"), ("@midnight", "2026-11-01T00:00:00Z"),
    ("@weekly", "2026-11-01T00:00:00Z"), ("@monthly", "2026-11-01T00:00:00Z"), ("@yearly", "2027-01-01T00:00:00Z"),
    ("@annually", "2027-01-01T00:00:00Z")])
def test_cron_shorthands_stand_for_their_expressions(alias, first):
    assert fire_times({"cron": alias, "n": 1}) == [first]


def test_a_fixed_offset_zone_is_accepted_with_a_warning_and_abbreviations_get_a_hint():
    status, body = get({"cron": "0 9 * * *", "timezone": "EST", "n": 1})
    assert status == 200 and body["fire_times"] == ["2026-10-31T14:00:00Z"]
    assert body["warnings"] == ["timezone 'EST' is a fixed offset (UTC-05:00) with no daylight saving time; for "
                                "New York's local time (EDT in summer) use 'America/New_York'"]
    assert "warnings" not in get({"cron": "0 9 * * *", "timezone": "America/New_York", "n": 1})[1]
    assert error({"cron": "0 9 * * *", "timezone": "PST"}) == (
        400, "invalid_job", "schedule: unknown time zone 'PST'; use an IANA name like 'America/Los_Angeles' for "
                            "the local time 'PST' is used for")
    assert error({"cron": "@reboot"})[2] == (
        "schedule: cron '@reboot' is not a shorthand schedulerd knows; use one of @yearly, @annually, @monthly, "
        "@weekly, @daily, @midnight, @hourly or 5 fields like '0 2 * * *'")


def test_limit_bounds_are_accepted():
    assert len(fire_times({"every": "1s", "n": 100})) == 100
    assert len(fire_times({"every": "1s", "n": 1})) == 1


def test_a_cron_that_never_matches_is_refused_as_a_create_would_be():
    assert error({"cron": "0 0 30 2 *"}) == (400, "invalid_job", "schedule.cron '0 0 30 2 *' never fires "
                                                                 "(a day that no month has?)")


# -- errors ---------------------------------------------------------------------------

def test_n_over_the_limit_names_the_limit():
    assert error({"every": "1s", "n": 101}) == (
        400, "limit_exceeded", "n=101 is over preview_n_max (100)")


@pytest.mark.parametrize("n", ["0", "-3", "ten", ""])
def test_bad_n_is_invalid(n):
    status, code, message = error({"every": "1s", "n": n})
    assert (status, code) == (400, "invalid_job")
    assert message.startswith("n must be an integer from 1 to 100")


@pytest.mark.parametrize("query, message", [
    ({}, "give exactly one of cron=EXPR (with optional timezone=ZONE) or every=DURATION"),
    ({"cron": "* * * * *", "every": "5s"}, "give exactly one of cron=EXPR"),
    ({"timezone": "UTC"}, "give exactly one of cron=EXPR"),
    ({"every": "5s", "timezone": "UTC"}, "timezone applies only to cron"),
    ({"cron": "0 25 * * *"}, "schedule: cron '0 25 * * *' is not a valid expression"),
    ({"cron": "0 2 * *"}, "schedule: cron '0 2 * *' has 4 fields"),
    ({"cron": ""}, "schedule: cron must be a non-empty string"),
    ({"cron": "0 2 * * *", "timezone": "Mars/Olympus"}, "schedule: unknown time zone 'Mars/Olympus'"),
    ({"every": "5 minutes"}, "schedule.every '5 minutes' is not a duration"),
    ({"every": "0s"}, "schedule.every '0s' must be between 1s and 366d"),
])
def test_bad_schedules_are_invalid_job_with_a_clear_message(query, message):
    status, code, text = error(query)
    assert (status, code) == (400, "invalid_job")
    assert text.startswith(message), text


@pytest.mark.parametrize("query, message", [
    ({"cron": "0 2 * * *", "tz": "Europe/Berlin"}, "unknown query parameter(s): tz; allowed: cron, every, from, n, timezone"),
    ("cron=0+2+*+*+*&n=3&n=50", "query parameter(s) given more than once: n"),
])
def test_a_query_the_route_does_not_read_is_refused(query, message):
    # A misspelt or doubled parameter would preview a schedule other than the caller's.
    assert error(query) == (400, "invalid_request", message)


# -- wiring -----------------------------------------------------------------------------

def test_make_app_serves_the_preview_route():
    app = api.make_app(stub_node(), leases=None)  # type: ignore[arg-type]
    paths = {getattr(r.resource, "canonical", None) for r in app.router.routes()}
    assert "/v1/preview" in paths
