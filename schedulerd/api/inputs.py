"""Parsing request bodies and query strings: every field checked, every error
naming the field and what is allowed."""
from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from aiohttp import web

from schedulerd.errors import InvalidRequest, LimitExceeded, SlowRequest, TooLarge
from schedulerd.api.exposure import require_json
from schedulerd.limits import Limits
from schedulerd.strict_json import integral, parse_json


LIMITS = web.AppKey("limits", Limits)
PAGE_QUERY = frozenset({"limit", "cursor"})
# One encoder for every ack's result: json.dumps with separators builds one per call.
_COMPACT = json.JSONEncoder(separators=(",", ":"))


async def body(request: web.Request) -> dict[str, Any]:
    """The JSON object of the request; a client that dribbles it slower than body_read_s_max gets 408."""
    if not request.body_exists:  # a body that came is checked by exposure.middleware already
        require_json(request)
    read_s_max = request.app.get(LIMITS, Limits()).body_read_s_max
    try:
        raw = await asyncio.wait_for(request.read(), read_s_max)
    except asyncio.TimeoutError:
        raise SlowRequest(f"the request body took longer than body_read_s_max ({read_s_max:g} s)") from None
    try:
        data = parse_json(raw)
    except ValueError as exc:  # JSONDecodeError among them
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("body must be a JSON object")
    return data


def string(data: dict[str, Any], name: str, *, max_len: int = 256, default: str | None = None) -> str:
    value = data.get(name, default)
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise InvalidRequest(f"{name} must be a non-empty string of at most {max_len} characters")
    return value


def integer(data: dict[str, Any], name: str, *, low: int, high: int, default: int | None = None,
            limit_name: str | None = None) -> int:
    value = integral(data.get(name, default))
    if value is None:
        raise InvalidRequest(f"{name} must be an integer")
    if not low <= value <= high:
        if limit_name and value > high:
            raise LimitExceeded(f"{name}={value} is over {limit_name} ({high})")
        raise InvalidRequest(f"{name} must be from {low} to {high}")
    return value


def number(data: dict[str, Any], name: str, *, low: float, high: float, default: float,
           limit_name: str) -> float:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a number")
    if value > high:
        raise LimitExceeded(f"{name}={value} is over {limit_name} ({high})")
    if value < low:
        raise InvalidRequest(f"{name} must be at least {low}")
    return float(value)


def items(data: dict[str, Any], name: str, *, max_items: int, limit_name: str) -> list[Any]:
    value = data.get(name)
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"{name} must be a non-empty list")
    if len(value) > max_items:
        raise LimitExceeded(f"{name} has {len(value)} items; {limit_name} is {max_items}")
    return value


def check_query(request: web.Request, allowed: frozenset[str]) -> None:
    """Refuse a query parameter the route does not read, or one given twice: a
    misspelt `stat=` would list every job, and `limit=5&limit=500` one of them."""
    unknown = sorted(request.query.keys() - allowed)
    if unknown:
        raise InvalidRequest(f"unknown query parameter(s): {', '.join(unknown)}; "
                             f"allowed: {', '.join(sorted(allowed)) or 'none'}")
    repeated = sorted({k for k in request.query.keys() if len(request.query.getall(k)) > 1})
    if repeated:
        raise InvalidRequest(f"query parameter(s) given more than once: {', '.join(repeated)}")


def query_int(request: web.Request, name: str, *, default: int, low: int, high: int, limit_name: str) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"query parameter {name} must be an integer") from None
    return integer({name: value}, name, low=low, high=high, limit_name=limit_name)


def query_bool(request: web.Request, name: str) -> bool:
    """A flag in the query string: true or false (absent: false)."""
    raw = request.query.get(name, "false")
    if raw not in ("true", "false"):
        raise InvalidRequest(f"query parameter {name} must be true or false, got {raw!r}")
    return raw == "true"


def fence(data: dict[str, Any]) -> int:
    return integer(data, "fence", low=0, high=2**63 - 1)


def result_json(data: dict[str, Any], max_bytes: int) -> str | None:
    if "result" not in data:
        return None
    encoded = _COMPACT.encode(data["result"])
    if len(encoded.encode()) > max_bytes:
        raise TooLarge(f"result is {len(encoded.encode())} bytes encoded; result_bytes_max is {max_bytes}")
    return encoded
