"""The job flags `create` and `update` share, and turning them into the JSON
fields of docs/api.md. Everything here runs before any request: a bad flag is
a usage error (exit 2) and nothing is sent."""
from __future__ import annotations

from typing import Any, Callable, Mapping, TypeVar

import click

from schedulerd import timefmt
from schedulerd.jobspec import RANGES
from schedulerd.storage.model import OverlapPolicy
from schedulerd.strict_json import parse_json

F = TypeVar("F", bound=Callable[..., Any])


def _ints(option: str) -> click.IntRange:
    """The range the API allows the option (schedulerd/jobspec.py), so a flag out of it is a usage error."""
    return click.IntRange(*RANGES[option])


MISFIRE_POLICIES = ("fire_all", "fire_once", "skip")
OVERLAP_POLICIES = tuple(p.value for p in OverlapPolicy)
TARGET_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
# flag's parameter name -> field name on the wire, for the options sent as they are.
PLAIN_FIELDS = {
    "job_id": "job_id", "queue": "queue", "max_attempts": "max_attempts",
    "priority": "priority", "misfire": "misfire_policy", "catchup_limit": "catchup_limit",
    "starting_deadline": "starting_deadline_s", "overlap": "overlap_policy",
    "timeout_s": "timeout_s", "jitter_s": "jitter_s", "history_limit": "history_limit",
    "idempotency_key": "idempotency_key", "finished_ttl_s": "finished_ttl_s", "history_ttl_s": "history_ttl_s",
    "keep_dead_letters": "keep_dead_letters", "max_runs": "max_runs", "description": "description",
    "pause_on_failure": "pause_on_failure", "skip_calendar": "skip_calendar",
}
# Parts of `backoff`; only the given ones are sent, the server fills the rest
# (create) or keeps them (update).
BACKOFF_PARTS = {"backoff_base_ms": "base_ms", "backoff_factor": "factor",
                 "backoff_max_ms": "max_ms"}


def job_options(*, for_create: bool) -> Callable[[F], F]:
    """The flags of `create` (for_create) or `update`; ranges are docs/api.md's."""
    options = [
        click.option("--at", metavar="ISO8601", help="Fire once at this time (with Z or an offset)."),
        click.option("--cron", metavar="EXPR", help="Fire on this cron expression (5 or 6 fields)."),
        click.option("--tz", metavar="ZONE", help="Time zone of --cron, e.g. Europe/Berlin [UTC]."),
        click.option("--every", metavar="DURATION", help="Fire at this interval, e.g. 30s, 5m, 1h."),
        click.option("--start-at", metavar="ISO8601",
                     help="No occurrence of --cron or --every before this (an --every counts from it)."),
        click.option("--end-at", metavar="ISO8601",
                     help="No occurrence of --cron or --every after this; the job then completes."),
        click.option("--queue", default="default" if for_create else None,
                     show_default=for_create),
        click.option("--payload", metavar="JSON|@FILE", help="JSON payload, or @FILE to read it."),
    ]
    if for_create:
        options.append(click.option("--id", "job_id", metavar="JOB_ID",
                                    help="Job id (generated when absent)."))
    options += [
        click.option("--max-attempts", type=_ints("max_attempts"), metavar="N"),
        click.option("--priority", type=_ints("priority"), metavar="0-9",
                     help="9 is served first."),
        click.option("--misfire", type=click.Choice(MISFIRE_POLICIES),
                     help="Occurrences missed while the cluster was down [fire_once]."),
        click.option("--catchup-limit", type=_ints("catchup_limit"), metavar="N",
                     help="Missed occurrences considered [100]."),
        click.option("--starting-deadline", type=_ints("starting_deadline_s"), metavar="SECONDS",
                     help="Skip a run that would start later than this after its time."),
        click.option("--overlap", type=click.Choice(OVERLAP_POLICIES),
                     help="A new occurrence while a run is open: runs, is skipped, waits behind it "
                          "(buffer_one, buffer_all) or cancels it (cancel_other) [allow]."),
        click.option("--backoff-base-ms", type=_ints("backoff.base_ms"), metavar="MS",
                     help="First retry delay [1000]."),
        click.option("--backoff-factor", type=click.FloatRange(*RANGES["backoff.factor"]), metavar="X",
                     help="Delay multiplier per retry [2.0]."),
        click.option("--backoff-max-ms", type=_ints("backoff.max_ms"), metavar="MS",
                     help="Longest retry delay [300000]."),
        click.option("--timeout-s", type=_ints("timeout_s"), metavar="SECONDS",
                     help="Hard cap on one attempt."),
        click.option("--jitter-s", type=_ints("jitter_s"), metavar="SECONDS",
                     help="Start each occurrence up to this much later [0]."),
        click.option("--history-limit", type=_ints("history_limit"), metavar="N",
                     help="Finished runs kept [100]."),
        click.option("--label", "labels", metavar="KEY=VALUE", multiple=True,
                     help="A label, e.g. team=billing; repeat for more (an update replaces them all)."),
        click.option("--description", metavar="TEXT", help="What the job is for, in a sentence."),
        click.option("--skip-calendar", metavar="NAME",
                     help="Skip the occurrences on the days of this calendar (schedctl calendar set)."),
        click.option("--max-runs", type=_ints("max_runs"), metavar="N",
                     help="Complete the job once N of its occurrences have run (triggers not counted)."),
        click.option("--finished-ttl-s", type=_ints("finished_ttl_s"), metavar="SECONDS",
                     help="Delete the job with its runs this long after it finished; 0: keep it "
                          "[the server's --finished-ttl]."),
        click.option("--history-ttl-s", type=_ints("history_ttl_s"), metavar="SECONDS",
                     help="Delete runs this long after they ended, whatever --history-limit allows "
                          "[--finished-ttl-s]."),
        click.option("--keep-dead-letters/--no-keep-dead-letters", default=None,
                     help="Keep dead letters (and the job) until re-driven or discarded [no]."),
        click.option("--pause-on-failure/--no-pause-on-failure", default=None,
                     help="Pause the job when one of its runs is dead-lettered [no]."),
        click.option("--target-url", metavar="URL",
                     help="Run with the built-in HTTP executor (schedctl worker http): call this URL."),
        click.option("--target-method", type=click.Choice(TARGET_METHODS), help="HTTP method [POST]."),
        click.option("--target-header", "target_headers", multiple=True, metavar="'NAME: VALUE'",
                     help="Header for the call; repeat for more."),
        click.option("--target-body", metavar="TEXT", help="Request body [the payload as JSON]."),
        click.option("--target-timeout-s", type=click.FloatRange(0, 3600, min_open=True), metavar="SECONDS",
                     help="Timeout of one call [the job's --timeout-s, else 30]."),
    ]
    if for_create:
        options.append(click.option("--idempotency-key", metavar="KEY",
                                    help="A repeat with this key returns the first job."))
    else:
        options.append(click.option("--no-skip-calendar", is_flag=True,
                                    help="Skip no calendar's days any more (the job's skip_calendar to null)."))

    def apply(fn: F) -> F:
        for option in reversed(options):  # click lists options in decorator order
            fn = option(fn)
        return fn

    return apply


def job_fields(flags: Mapping[str, Any], *, schedule_required: bool) -> dict[str, Any]:
    """The given flags as job fields; flags left out are left out of the body."""
    fields: dict[str, Any] = {}
    schedule = _schedule(flags["at"], flags["cron"], flags["tz"], flags["every"],
                         required=schedule_required)
    bounds = {name: _utc(flags[name], "--" + name.replace("_", "-"))
              for name in ("start_at", "end_at") if flags[name] is not None}
    if bounds:
        if schedule is None or "at" in schedule:
            raise click.UsageError("--start-at and --end-at bound a --cron or --every schedule, given with it")
        schedule.update(bounds)
    if schedule is not None:
        fields["schedule"] = schedule
    if flags["payload"] is not None:
        fields["payload"] = _payload(flags["payload"])  # may be JSON null: still sent
    for name, field in PLAIN_FIELDS.items():
        if flags.get(name) is not None:
            fields[field] = flags[name]
    backoff = {part: flags[name] for name, part in BACKOFF_PARTS.items()
               if flags[name] is not None}
    if backoff:
        fields["backoff"] = backoff
    target = _target(flags)
    if target is not None:
        fields["target"] = target
    if flags["labels"]:
        fields["labels"] = _labels(flags["labels"])
    if flags.get("no_skip_calendar"):
        if "skip_calendar" in fields:
            raise click.UsageError("--skip-calendar and --no-skip-calendar contradict each other: give one")
        fields["skip_calendar"] = None
    return fields


def _labels(given: tuple[str, ...]) -> dict[str, str]:
    labels = {}
    for text in given:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{text!r} is not KEY=VALUE", param_hint="'--label'")
        labels[key] = value
    return labels


def _target(flags: Mapping[str, Any]) -> dict[str, Any] | None:
    parts = {"method": flags["target_method"], "body": flags["target_body"],
             "timeout_s": flags["target_timeout_s"]}
    if flags["target_url"] is None:
        if any(v is not None for v in parts.values()) or flags["target_headers"]:
            raise click.UsageError("--target-method, --target-header, --target-body and --target-timeout-s "
                                   "need --target-url")
        return None
    headers = {}
    for text in flags["target_headers"]:
        name, sep, value = text.partition(":")
        if not sep or not name.strip():
            raise click.BadParameter(f"{text!r} is not 'NAME: VALUE'", param_hint="'--target-header'")
        headers[name.strip()] = value.strip()
    target = {"kind": "http", "url": flags["target_url"], **{k: v for k, v in parts.items() if v is not None}}
    if headers:
        target["headers"] = headers
    return target


def _schedule(at: str | None, cron: str | None, tz: str | None, every: str | None,
              *, required: bool) -> dict[str, str] | None:
    given = [flag for flag, value in (("--at", at), ("--cron", cron), ("--every", every))
             if value is not None]
    if len(given) > 1 or (required and not given):
        got = f" (got {' and '.join(given)})" if given else ""
        raise click.UsageError(f"give exactly one of --at, --cron, --every{got}")
    if tz is not None and cron is None:
        raise click.UsageError("--tz applies only to --cron")
    if cron is not None:
        return {"cron": cron, "timezone": tz or "UTC"}
    if every is not None:
        return {"every": every}
    if at is None:
        return None
    return {"at": _utc(at, "--at")}


def _utc(text: str, flag: str) -> str:
    """Sent as UTC: the wire format is UTC, and a naive time is refused here rather than
    guessed in some zone."""
    try:
        return str(timefmt.to_iso(timefmt.from_iso(text)))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'{flag}'") from None


def _payload(text: str) -> Any:
    """The JSON given inline, or read from the file named after '@' ('@-': stdin)."""
    source = ""
    if text.startswith("@"):
        path = text[1:]
        source = f"{path!r} is "
        try:
            with click.open_file(path, "r", encoding="utf-8") as file:
                text = file.read()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise click.BadParameter(f"cannot read {path!r}: {reason}",
                                     param_hint="'--payload'") from None
    try:
        return parse_json(text)
    except ValueError as exc:
        raise click.BadParameter(f"{source}not valid JSON: {exc}",
                                 param_hint="'--payload'") from None
