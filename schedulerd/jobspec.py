"""Validating a job definition from the API into the normalized form storage/
applies. Bad input raises InvalidJob/TooLarge naming the field and what is
allowed; nothing is proposed until the whole job is valid."""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

from schedulerd.errors import InvalidJob, TooLarge
from schedulerd.limits import Limits
from schedulerd.timefmt import from_iso
from storage import cron

ID_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
QUEUE_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT_US = {"ms": 1_000, "s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000, "d": 86_400_000_000}
EVERY_US_MIN = 1_000_000
EVERY_US_MAX = 366 * 86_400_000_000
ATTEMPTS_MAX = 100
PRIORITY_MAX = 9
FIELDS = {"job_id", "schedule", "queue", "payload", "max_attempts", "priority"}


def parse_duration_us(text: Any) -> int:
    """'90s', '5m', '1h30m', '250ms' -> microseconds."""
    if not isinstance(text, str) or not text:
        raise InvalidJob("schedule.every must be a duration string like '30s', '5m' or '1h30m'")
    pos, total = 0, 0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            break
        total += int(m.group(1)) * _UNIT_US[m.group(2)]
        pos = m.end()
    if pos != len(text):
        raise InvalidJob(f"schedule.every {text!r} is not a duration; use units ms, s, m, h, d (e.g. '1h30m')")
    return total


def parse_schedule(raw: Any, now_us: int) -> dict[str, Any]:
    if not isinstance(raw, dict) or len(raw.keys() & {"at", "cron", "every"}) != 1:
        raise InvalidJob("schedule must be exactly one of {\"at\": ISO8601}, "
                         "{\"cron\": EXPR, \"timezone\": ZONE} or {\"every\": DURATION}")
    if "at" in raw:
        _only(raw, {"at"}, "schedule")
        try:
            return {"kind": "at", "at_us": from_iso(raw["at"])}
        except ValueError as exc:
            raise InvalidJob(f"schedule.at: {exc}") from None
    if "every" in raw:
        _only(raw, {"every"}, "schedule")
        every = parse_duration_us(raw["every"])
        if not EVERY_US_MIN <= every <= EVERY_US_MAX:
            raise InvalidJob(f"schedule.every {raw['every']!r} must be between 1s and 366d")
        return {"kind": "every", "every_us": every, "anchor_us": now_us}
    _only(raw, {"cron", "timezone"}, "schedule")
    tz = raw.get("timezone", "UTC")
    if not isinstance(tz, str):
        raise InvalidJob("schedule.timezone must be an IANA zone name like 'Europe/Berlin'")
    try:
        return cron.check_cron(raw["cron"], tz)
    except cron.ScheduleError as exc:
        raise InvalidJob(f"schedule: {exc}") from None


def parse_job(raw: Any, now_us: int, limits: Limits) -> dict[str, Any]:
    """A user's job JSON -> the storage spec (job_id, schedule, queue, payload_json, ...)."""
    if not isinstance(raw, dict):
        raise InvalidJob("a job must be a JSON object")
    _only(raw, FIELDS, "job")
    job_id = raw.get("job_id") or uuid.uuid4().hex
    if not isinstance(job_id, str) or not ID_RE.match(job_id):
        raise InvalidJob("job_id must be 1-128 characters of A-Z a-z 0-9 _ . -")
    queue = raw.get("queue", "default")
    if not isinstance(queue, str) or not QUEUE_RE.match(queue):
        raise InvalidJob("queue must be 1-64 characters of A-Z a-z 0-9 _ . -")
    payload_json = json.dumps(raw.get("payload"), separators=(",", ":"))
    if len(payload_json.encode()) > limits.payload_bytes_max:
        raise TooLarge(f"payload is {len(payload_json.encode())} bytes encoded; "
                       f"payload_bytes_max is {limits.payload_bytes_max}")
    return {
        "job_id": job_id,
        "schedule": parse_schedule(raw.get("schedule"), now_us),
        "schedule_spec": raw.get("schedule"),
        "queue": queue,
        "payload_json": payload_json,
        "max_attempts": _int_in(raw, "max_attempts", 3, 1, ATTEMPTS_MAX),
        "priority": _int_in(raw, "priority", 0, 0, PRIORITY_MAX),
    }


def _int_in(raw: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidJob(f"{name} must be an integer from {low} to {high}")
    return value


def _only(raw: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(raw.keys() - allowed)
    if unknown:
        raise InvalidJob(f"unknown field(s) in {where}: {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
