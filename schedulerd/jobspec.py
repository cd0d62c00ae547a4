"""Validating a job definition from the API into the normalized form storage/
applies. Bad input raises InvalidJob/TooLarge naming the field and what is
allowed; nothing is proposed until the whole job is valid."""
from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import Any

from schedulerd import labels, targets
from schedulerd.errors import InvalidJob, TooLarge
from schedulerd.limits import Limits
from schedulerd.storage import cron, retry
from schedulerd.storage.jobs import SPEC_DEFAULTS
from schedulerd.storage.model import MisfirePolicy, OverlapPolicy
from schedulerd.strict_json import integral
from schedulerd.timefmt import from_iso
from schedulerd.units import US_PER_S

ID_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}\Z")
QUEUE_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}\Z")
CALENDAR_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}\Z")
_DURATION_PART = re.compile(r"([0-9]{1,12})(ms|s|m|h|d)")
_UNIT_US = {"ms": 1_000, "s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000, "d": 86_400_000_000}
EVERY_US_MIN = US_PER_S
EVERY_US_MAX = 366 * 86_400 * US_PER_S
IDEMPOTENCY_KEY_CHARS_MAX = 256
# The namespace of the job ids made from idempotency keys (uuid5): fixed, so every node
# and every build makes the same id from the same key.
_KEYED_IDS = uuid.UUID("6f0c2d1e-5b1a-4c47-9a52-2f3d8e0b7c11")
TTL_S_MAX = 10 * 366 * 86_400  # ten years; 0 keeps forever

RETENTION_FIELDS = {"finished_ttl_s", "history_ttl_s", "keep_dead_letters"}
OPTION_FIELDS = {"schedule", "queue", "payload", "max_attempts", "priority", "misfire_policy", "catchup_limit",
                 "starting_deadline_s", "overlap_policy", "backoff", "timeout_s", "jitter_s", "history_limit",
                 "target", "max_runs", "labels", "description", "pause_on_failure", "skip_calendar"} | RETENTION_FIELDS
CREATE_FIELDS = OPTION_FIELDS | {"job_id", "idempotency_key"}


BOUNDS = frozenset({"start_at", "end_at"})  # of a cron or every schedule


def parse_duration_us(text: Any, what: str = "schedule.every") -> int:
    """'90s', '5m', '1h30m', '250ms' -> microseconds; `what` names the value in errors."""
    if not isinstance(text, str) or not text:
        raise InvalidJob(f"{what} must be a duration string like '30s', '5m' or '1h30m'")
    pos, total = 0, 0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            break
        total += int(m.group(1)) * _UNIT_US[m.group(2)]
        pos = m.end()
    if pos != len(text):
        raise InvalidJob(f"{what} {text!r} is not a duration; use units ms, s, m, h, d (e.g. '1h30m')")
    return total


def parse_schedule(raw: Any, now_us: int, limits: Limits) -> dict[str, Any]:
    if not isinstance(raw, dict) or len(raw.keys() & {"at", "cron", "every"}) != 1:
        raise InvalidJob("schedule must be exactly one of {\"at\": ISO8601}, "
                         "{\"cron\": EXPR, \"timezone\": ZONE} or {\"every\": DURATION}")
    if "at" in raw:
        if raw.keys() & BOUNDS:
            raise InvalidJob("schedule.start_at and end_at bound a cron or every schedule; a one-off has its own time")
        _only(raw, {"at"}, "schedule")
        try:
            return {"kind": "at", "at_us": from_iso(raw["at"])}
        except ValueError as exc:
            raise InvalidJob(f"schedule.at: {exc}") from None
    bounds = _bounds(raw)
    if "every" in raw:
        _only(raw, {"every", *BOUNDS}, "schedule")
        every = parse_duration_us(raw["every"])
        if not EVERY_US_MIN <= every <= EVERY_US_MAX:
            raise InvalidJob(f"schedule.every {raw['every']!r} must be between 1s and 366d")
        start = bounds.get("start_us")
        # Anchored as apply will anchor it (jobs.anchored), so the checks below see its real times.
        schedule = {"kind": "every", "every_us": every, "anchor_us": now_us if start is None else start - every,
                    **bounds}
    else:
        _only(raw, {"cron", "timezone", *BOUNDS}, "schedule")
        if isinstance(raw["cron"], str) and len(raw["cron"]) > limits.cron_chars_max:
            raise InvalidJob(f"schedule.cron is {len(raw['cron'])} characters; cron_chars_max is "
                             f"{limits.cron_chars_max}")
        tz = raw.get("timezone", "UTC")
        if not isinstance(tz, str):
            raise InvalidJob("schedule.timezone must be an IANA zone name like 'Europe/Berlin'")
        try:
            schedule = {**cron.check_cron(raw["cron"], tz), **bounds}
        except cron.ScheduleError as exc:
            raise InvalidJob(f"schedule: {exc}") from None
    if cron.first_fire(schedule, now_us) is None:
        if "end_us" in bounds:
            raise InvalidJob(f"schedule has no occurrence from now to end_at {raw['end_at']!r}")
        raise InvalidJob(f"schedule.cron {raw['cron']!r} never fires (a day that no month has?)")
    return schedule


def _bounds(raw: dict[str, Any]) -> dict[str, int]:
    """A schedule's start_at and end_at, as start_us and end_us (only those given)."""
    out = {}
    for name, key in (("start_at", "start_us"), ("end_at", "end_us")):
        if name in raw:
            try:
                out[key] = from_iso(raw[name])
            except ValueError as exc:
                raise InvalidJob(f"schedule.{name}: {exc}") from None
    if len(out) == 2 and out["end_us"] <= out["start_us"]:
        raise InvalidJob(f"schedule.end_at ({raw['end_at']}) must be after start_at ({raw['start_at']})")
    return out


def warned(answer: dict[str, Any], schedule: dict[str, Any] | None) -> dict[str, Any]:
    """The answer that accepted `schedule`, with `warnings` when it deserves one (a
    fixed-offset zone named where a region's local time was likely meant)."""
    warning = cron.zone_warning(schedule["timezone"]) if schedule is not None and schedule["kind"] == "cron" else None
    return {**answer, "warnings": [warning]} if warning else answer


def parse_job(raw: Any, now_us: int, limits: Limits, idempotency_key: str | None = None) -> dict[str, Any]:
    """A user's job JSON -> the spec a create entry carries: job_id, schedule and the
    storage form of each option given. Apply fills in the others from SPEC_DEFAULTS."""
    if not isinstance(raw, dict):
        raise InvalidJob("a job must be a JSON object")
    _only(raw, CREATE_FIELDS, "job")
    if "schedule" not in raw:
        raise InvalidJob("schedule is required")
    in_body = raw.get("idempotency_key")
    if idempotency_key is not None and in_body is not None and in_body != idempotency_key:
        raise InvalidJob(f"the Idempotency-Key header ({idempotency_key!r}) and the body's idempotency_key "
                         f"({in_body!r}) differ: send one key, in either place")
    key = idempotency_key if idempotency_key is not None else in_body
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= IDEMPOTENCY_KEY_CHARS_MAX):
        raise InvalidJob(f"idempotency key must be 1..{IDEMPOTENCY_KEY_CHARS_MAX} characters")
    job_id = raw.get("job_id")
    if job_id is None:
        # A key's keeper is the group of the job it made: every retry of a key without a
        # job_id must name the same job, or a retry landing in another group makes a second.
        job_id = uuid.uuid4().hex if key is None else uuid.uuid5(_KEYED_IDS, key).hex
    if not isinstance(job_id, str) or not ID_RE.match(job_id):
        raise InvalidJob("job_id must be 1-128 characters of A-Z a-z 0-9 _ . -")
    spec = {"job_id": job_id, **parse_options(raw, now_us, limits)}
    check_together(spec)
    if key is not None:
        body = {k: v for k, v in raw.items() if k != "idempotency_key"}
        spec["idempotency_key"] = key
        spec["request_hash"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return spec


# The range allowed for each numeric option, by its name on the wire: schedctl's flags
# and the OpenAPI schema take theirs from here, so none accepts what the API refuses.
RANGES: dict[str, tuple[int, int]] = {
    "max_attempts": (1, 100), "priority": (0, 9), "catchup_limit": (1, 1000), "history_limit": (1, 10_000),
    "starting_deadline_s": (1, 604_800), "timeout_s": (1, 86_400), "jitter_s": (0, 86_400),
    "finished_ttl_s": (0, TTL_S_MAX), "history_ttl_s": (0, TTL_S_MAX), "max_runs": (1, 1_000_000_000),
    "backoff.base_ms": (1, 3_600_000), "backoff.factor": (1, 10), "backoff.max_ms": (1, 86_400_000),
}
_INT_OPTIONS = ("max_attempts", "priority", "catchup_limit", "history_limit")
# Options given in seconds: (stored field, may be null).
_SECONDS_OPTIONS = {"starting_deadline_s": ("starting_deadline_us", True), "timeout_s": ("timeout_us", True),
                    "jitter_s": ("jitter_us", False), "finished_ttl_s": ("finished_ttl_us", False),
                    "history_ttl_s": ("history_ttl_us", False)}


def parse_options(raw: dict[str, Any], now_us: int, limits: Limits,
                  backoff_base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The storage form of each option present in raw (create fills the rest from SPEC_DEFAULTS).

    A create's partial `backoff` is completed from the defaults. An update passes the
    job's backoff as this node reads it (backoff_base): the parts given are checked
    against it at once, and only they go into the entry. Apply completes them from the
    job as stored then (storage/jobs.update_job), so two concurrent updates of different
    parts both land."""
    out: dict[str, Any] = {}
    if "schedule" in raw:
        out["schedule"] = parse_schedule(raw["schedule"], now_us, limits)
        out["schedule_spec"] = raw["schedule"]
    if "queue" in raw:
        if not isinstance(raw["queue"], str) or not QUEUE_RE.match(raw["queue"]):
            raise InvalidJob("queue must be 1-64 characters of A-Z a-z 0-9 _ . -")
        out["queue"] = raw["queue"]
    if "payload" in raw:
        out["payload_json"] = _payload_json(raw["payload"], limits)
    for name in _INT_OPTIONS:
        if name in raw:
            out[name] = _int_in(raw[name], name, *RANGES[name])
    for name, allowed in (("misfire_policy", MisfirePolicy), ("overlap_policy", OverlapPolicy)):
        if name in raw:
            if not isinstance(raw[name], str) or raw[name] not in {p.value for p in allowed}:
                raise InvalidJob(f"{name} must be one of {', '.join(p.value for p in allowed)}")
            out[name] = raw[name]
    for name, (field, nullable) in _SECONDS_OPTIONS.items():
        if name in raw:
            if raw[name] is None and nullable:
                out[field] = None
                continue
            out[field] = int(_number_in(raw[name], name, *RANGES[name]) * US_PER_S)
    if "backoff" in raw:
        backoff = _backoff(raw["backoff"], backoff_base or SPEC_DEFAULTS["backoff"])
        out["backoff"] = backoff if backoff_base is None else {part: backoff[part] for part in raw["backoff"]}
    if "target" in raw:
        out["target"] = targets.parse_target(raw["target"], limits)
    for name in ("keep_dead_letters", "pause_on_failure"):
        if name in raw:
            if not isinstance(raw[name], bool):
                raise InvalidJob(f"{name} must be true or false")
            out[name] = raw[name]
    if "labels" in raw:
        out["labels"] = labels.check_labels(raw["labels"], limits.labels_max)
    if "description" in raw:
        text = raw["description"]
        if not isinstance(text, str) or len(text) > limits.description_chars_max:
            raise InvalidJob(f"description must be text of at most {limits.description_chars_max} characters "
                             "(description_chars_max)")
        out["description"] = text
    if "skip_calendar" in raw:  # null names none; that the calendar exists is the API's check
        name = raw["skip_calendar"]
        if name is not None and (not isinstance(name, str) or not CALENDAR_NAME_RE.match(name)):
            raise InvalidJob("skip_calendar must be a calendar's name (1-64 characters of A-Z a-z 0-9 _ . -) or null")
        out["skip_calendar"] = name
    if "max_runs" in raw:  # null lifts the limit
        out["max_runs"] = None if raw["max_runs"] is None else _int_in(raw["max_runs"], "max_runs",
                                                                       *RANGES["max_runs"])
    return out


def check_together(options: dict[str, Any]) -> None:
    """Refuse options that are valid alone and not together, in storage form: a create's
    (a missing one holds its default), an update's over the job as this node reads it."""
    jitter = options.get("jitter_us", SPEC_DEFAULTS["jitter_us"])
    deadline = options.get("starting_deadline_us", SPEC_DEFAULTS["starting_deadline_us"])
    if deadline is not None and jitter >= deadline:
        raise InvalidJob(f"jitter_s ({jitter / US_PER_S:g}) must be less than starting_deadline_s "
                         f"({deadline / US_PER_S:g}): an occurrence jittered that late would be skipped as past its "
                         "deadline")


def _backoff(raw: Any, base: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidJob("backoff must be an object {base_ms, factor, max_ms}")
    _only(raw, {"base_ms", "factor", "max_ms"}, "backoff")
    b = dict(base)
    if "base_ms" in raw:
        b["base_ms"] = _int_in(raw["base_ms"], "backoff.base_ms", *RANGES["backoff.base_ms"])
    if "factor" in raw:
        b["factor"] = float(_number_in(raw["factor"], "backoff.factor", *RANGES["backoff.factor"]))
    if "max_ms" in raw:
        b["max_ms"] = _int_in(raw["max_ms"], "backoff.max_ms", *RANGES["backoff.max_ms"])
    problem = retry.backoff_problem(b)
    if problem:
        raise InvalidJob(problem)
    return b


def _payload_json(payload: Any, limits: Limits) -> str:
    try:
        encoded = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise InvalidJob("payload must be JSON: NaN and Infinity are not") from None
    if len(encoded.encode()) > limits.payload_bytes_max:
        raise TooLarge(f"payload is {len(encoded.encode())} bytes encoded; "
                       f"payload_bytes_max is {limits.payload_bytes_max}")
    return encoded


def _int_in(value: Any, name: str, low: int, high: int) -> int:
    number = integral(value)
    if number is None or not low <= number <= high:
        raise InvalidJob(f"{name} must be an integer from {low} to {high}")
    return number


def _number_in(value: Any, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InvalidJob(f"{name} must be a number from {low} to {high}")
    return value


def _only(raw: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = raw.keys() - allowed
    if unknown:
        raise InvalidJob(f"unknown field(s) in {where}: {', '.join(sorted(unknown))}; "
                         f"allowed: {', '.join(sorted(allowed))}")
