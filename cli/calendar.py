"""`schedctl calendar set|get|list|delete`: holiday calendars, which a job names with
`--skip-calendar` to skip the occurrences on their days."""
from __future__ import annotations

import datetime
import json
from typing import Any, Mapping

import click
import yaml

from schedulerd import strict_yaml
from schedulerd.cli.output import format_fields, format_table
from schedulerd.cli.session import OneLineGroup, Session
from schedulerd.strict_json import parse_json


@click.group(cls=OneLineGroup)
def calendar() -> None:
    """Holiday calendars: named days and ranges of days, in a zone of their own. A job
    naming one (create or update --skip-calendar NAME) skips its occurrences on those days
    (a skipped run with reason calendar).

    \b
    Examples:
        schedctl calendar set holidays-de --timezone Europe/Berlin --date 2026-12-25
        schedctl update nightly-report --skip-calendar holidays-de
    """


@calendar.command("set")
@click.argument("name")
@click.option("--date", "dates", metavar="YYYY-MM-DD", multiple=True, help="A day; repeat for more.")
@click.option("--range", "ranges", metavar="FROM:TO", multiple=True,
              help="Days FROM to TO, both included (YYYY-MM-DD:YYYY-MM-DD); repeat for more.")
@click.option("--timezone", metavar="ZONE", help="The IANA zone the days are in [UTC, or the file's].")
@click.option("-f", "--file", "path", metavar="FILE",
              help="A JSON or YAML file {timezone, dates: [day | {from, to}, ...]} ('-': stdin); "
                   "--date and --range add to it.")
@click.pass_obj
def set_calendar(session: Session, name: str, dates: tuple[str, ...], ranges: tuple[str, ...],
                 timezone: str | None, path: str | None) -> None:
    """Create or replace calendar NAME with these days (it replaces the days it had). The
    jobs that name it follow the new days from their next claim on.

    \b
    Examples:
        schedctl calendar set holidays-de --timezone Europe/Berlin --date 2026-10-03 --range 2026-12-24:2026-12-31
        schedctl calendar set holidays-us -f holidays-us.yaml
    """
    document = _read(path) if path else {}
    listed: list[Any] = list(document.get("dates", [])) + list(dates)
    for text in ranges:
        first, sep, last = text.partition(":")
        if not sep:
            raise click.BadParameter(f"{text!r} is not FROM:TO", param_hint="'--range'")
        listed.append({"from": first, "to": last})
    zone = timezone or document.get("timezone") or "UTC"
    session.show(session.client.set_calendar(name, listed, zone), calendar_text)


@calendar.command("get")
@click.argument("name")
@click.pass_obj
def get_calendar(session: Session, name: str) -> None:
    """Show calendar NAME, and some of the jobs that name it.

    \b
    Example:
        schedctl calendar get holidays-de
    """
    session.show(session.client.get_calendar(name), calendar_text)


@calendar.command("list")
@click.pass_obj
def list_calendars(session: Session) -> None:
    """Every calendar, with its zone and how many ranges of days it holds.

    \b
    Example:
        schedctl calendar list
    """
    session.show(session.client.list_calendars(), lambda document: format_table(
        ("NAME", "TIMEZONE", "RANGES", "UPDATED"),
        [(c["name"], c["timezone"], len(c["dates"]), c["updated_at"]) for c in document["calendars"]]))


@calendar.command("delete")
@click.argument("name")
@click.pass_obj
def delete_calendar(session: Session, name: str) -> None:
    """Delete calendar NAME; refused while a scheduled or paused job names it.

    \b
    Example:
        schedctl calendar delete holidays-de
    """
    session.show(session.client.delete_calendar(name), lambda document: f"calendar {document['name']} deleted")


def calendar_text(document: Mapping[str, Any]) -> str:
    days = ", ".join(d["from"] if d["from"] == d["to"] else f"{d['from']}:{d['to']}" for d in document["dates"])
    fields: dict[str, Any] = {"name": document["name"], "timezone": document["timezone"], "dates": days or "(none)",
                              "updated_at": document["updated_at"]}
    if "used_by" in document:
        fields["used_by"] = ", ".join(document["used_by"]) or "(no job)"
    return format_fields(fields)


def _read(path: str) -> dict[str, Any]:
    try:
        with click.open_file(path, "r", encoding="utf-8") as f:
            text = f.read()
        data = parse_json(text) if path.endswith(".json") else strict_yaml.load(text)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, yaml.YAMLError) as exc:
        raise click.BadParameter(f"cannot read {path!r}: {exc}", param_hint="'--file'") from None
    if not isinstance(data, dict) or not data.keys() <= {"timezone", "dates"}:
        raise click.BadParameter(f"{path!r} must hold an object {{timezone, dates}}", param_hint="'--file'")
    # YAML reads an unquoted 2026-12-25 as a date; the API wants the text.
    return json.loads(json.dumps(data, default=lambda value: value.isoformat()
                                 if isinstance(value, datetime.date) else str(value)))
