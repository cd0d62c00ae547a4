"""GET /v1/preview: the next fire times of a schedule, computed the way the state
machine will compute them (storage/cron.py), without creating anything.

Reads no Raft state: any node answers, leader or not, with its own clock."""
from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from schedulerd import jobspec, timefmt
from schedulerd.errors import InvalidJob, LimitExceeded
from storage import cron

# Most fire times one preview returns (docs/api.md: n 1..100). A preview is
# computed inline on the event loop, so this also bounds the time it takes.
PREVIEW_N_MAX = 100
PREVIEW_N_DEFAULT = 10
QUERY_PARAMS = frozenset({"cron", "timezone", "every", "n"})


class _Clock(Protocol):
    def now_us(self) -> int: ...


class _PreviewNode(Protocol):
    """All the route needs of a node: its clock."""

    @property
    def clock(self) -> _Clock: ...


def routes(node: _PreviewNode) -> list[web.RouteDef]:
    async def preview(request: web.Request) -> web.Response:
        query = dict(request.query)
        n = _count(query)
        now_us = node.clock.now_us()  # one reading: an every interval is anchored at it
        schedule = jobspec.parse_schedule(_schedule_spec(query), now_us)
        fire_times = cron.preview(schedule, now_us, n)
        return web.json_response({"fire_times": [timefmt.to_iso(us) for us in fire_times]})

    return [web.get("/v1/preview", preview)]


def _schedule_spec(query: dict[str, str]) -> dict[str, Any]:
    """The query string as the `schedule` object of a job, for jobspec to validate."""
    # A misspelt parameter (`tz=`, `count=`) must not be silently ignored: the
    # preview would show a schedule other than the one the caller meant.
    unknown = sorted(query.keys() - QUERY_PARAMS)
    if unknown:
        raise InvalidJob(f"unknown query parameter(s): {', '.join(unknown)}; "
                         f"allowed: {', '.join(sorted(QUERY_PARAMS))}")
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


def _count(query: dict[str, str]) -> int:
    raw = query.get("n")
    if raw is None:
        return PREVIEW_N_DEFAULT
    try:
        n = int(raw)
    except ValueError:
        raise InvalidJob(f"n must be an integer from 1 to {PREVIEW_N_MAX}, got {raw!r}") from None
    if n > PREVIEW_N_MAX:
        raise LimitExceeded(f"n={n} is over preview_n_max ({PREVIEW_N_MAX})")
    if n < 1:
        raise InvalidJob(f"n must be an integer from 1 to {PREVIEW_N_MAX}, got {n}")
    return n
