"""GET /v1/preview: the next fire times of a schedule, computed the way the state
machine will compute them (storage/cron.py), without creating anything.

Reads no Raft state: any node answers, leader or not, with its own clock."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from schedulerd import jobspec, timefmt, views
from schedulerd.api import inputs
from schedulerd.api.keys import NODE
from schedulerd.errors import InvalidJob, LimitExceeded
from schedulerd.storage import cron

PREVIEW_N_DEFAULT = 10
QUERY_PARAMS = frozenset({"cron", "timezone", "every", "n"})


async def preview(request: web.Request) -> web.Response:
    node = request.app[NODE]
    inputs.check_query(request, QUERY_PARAMS)
    query = dict(request.query)
    n = _count(query, node.config.limits.preview_n_max)
    now_us = node.now_us()  # one reading: an every interval is anchored at it
    schedule = jobspec.parse_schedule(_schedule_spec(query), now_us, node.config.limits)
    fire_times = cron.preview(schedule, now_us, n)
    return views.respond({"fire_times": [timefmt.to_iso(us) for us in fire_times]})


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
