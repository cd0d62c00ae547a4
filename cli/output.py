"""Human output of `schedctl`: aligned tables and `key: value` blocks. Pure
functions of the server's documents, so each is tested without a server."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click

# A dead letter's error is often a traceback; the table shows its first line, cut here.
ERROR_CELL_CHARS_MAX = 60


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list, bool)):
        return json.dumps(value, separators=(",", ":"))
    # One value, one line: a newline inside a cell would break the columns.
    return str(value).replace("\n", "\\n")


# Colours of run and job states; click.echo drops them when stdout is not a terminal.
STATE_COLOURS = {"succeeded": "green", "scheduled": "green", "running": "blue", "queued": "yellow",
                 "retry_wait": "yellow", "paused": "yellow", "dead_letter": "red", "cancelled": "bright_black",
                 "skipped": "bright_black", "completed": "bright_black"}


def state_text(state: str, width: int = 0) -> str:
    return click.style(state.ljust(width), fg=STATE_COLOURS.get(state))


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns left-aligned to their widest cell, two spaces apart; a STATE column in colour."""
    lines = [list(headers)] + [[_cell(value) for value in row] for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    state = headers.index("STATE") if "STATE" in headers else None
    return "\n".join(
        "  ".join(state_text(cell, width) if i == state and n else cell.ljust(width)
                  for i, (cell, width) in enumerate(zip(line, widths))).rstrip()
        for n, line in enumerate(lines)
    )


def format_fields(document: Mapping[str, Any]) -> str:
    """`key: value` lines, values aligned."""
    width = max((len(key) for key in document), default=0) + 1
    return "\n".join(f"{key + ':':<{width}} {_cell(value)}" for key, value in document.items())


def run_fields(document: Mapping[str, Any]) -> str:
    """The run inside a `{"run": run}` answer (trigger, retry), as fields."""
    return format_fields(document["run"])


def _schedule_text(schedule: Mapping[str, Any]) -> str:
    if "cron" in schedule:
        return f"cron {schedule['cron']} ({schedule.get('timezone', 'UTC')})"
    if "every" in schedule:
        return f"every {schedule['every']}"
    if "at" in schedule:
        return f"at {schedule['at']}"
    return _cell(schedule)


def jobs_table(page: Mapping[str, Any]) -> str:
    rows = [(job["job_id"], job["state"], job.get("queue"),
             _schedule_text(job.get("schedule") or {}), job.get("next_fire_time"))
            for job in page["jobs"]]
    return format_table(("JOB_ID", "STATE", "QUEUE", "SCHEDULE", "NEXT_FIRE"), rows)


def runs_table(page: Mapping[str, Any]) -> str:
    rows = [(run["run_id"], run["scheduled_time"], run["state"], run["attempt"],
             run.get("worker_id"), run.get("finished_at")) for run in page["runs"]]
    return format_table(("RUN_ID", "SCHEDULED", "STATE", "ATTEMPT", "WORKER", "FINISHED"), rows)


def first_line(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= ERROR_CELL_CHARS_MAX else line[: ERROR_CELL_CHARS_MAX - 3] + "..."


def dead_letters_table(page: Mapping[str, Any]) -> str:
    rows = [(run["run_id"], run["job_id"], run.get("queue"), run["scheduled_time"],
             run["attempt"], run.get("reason"), first_line(run.get("error")))
            for run in page["runs"]]
    return format_table(
        ("RUN_ID", "JOB_ID", "QUEUE", "SCHEDULED", "ATTEMPT", "REASON", "ERROR"), rows)


def preview_table(document: Mapping[str, Any], tz: str | None) -> str:
    """Fire times in UTC and, for a zone other than UTC, on that zone's wall clock:
    the column that shows what DST did."""
    times = document["fire_times"]
    zone = _zone(tz)
    if zone is None:
        return format_table(("FIRE_TIME",), [(t,) for t in times])
    local = [datetime.fromisoformat(t.replace("Z", "+00:00")).astimezone(zone).isoformat()
             for t in times]
    return format_table(("FIRE_TIME", f"LOCAL ({tz})"), zip(times, local))


def bulk_text(document: Mapping[str, Any]) -> str:
    return (f"{document['action']} -l {document['selector']}: {document['matched']} jobs selected, "
            f"{document['changed']} changed")


def job_preview_table(document: Mapping[str, Any]) -> str:
    rows = [(o["scheduled_time"], o["start_time"], o.get("run_id", "")) for o in document["occurrences"]]
    return (f"job {document['job_id']} ({document['state']})\n"
            + format_table(("SCHEDULED", "STARTS", "RUN_ID"), rows))


def explain_text(document: Mapping[str, Any]) -> str:
    """`schedctl explain`: the server's sentence, then the facts it rests on."""
    facts = {key: value for key, value in document.items() if key != "explanation"}
    return f"{document['explanation']}\n\n{format_fields(facts)}"


def _zone(tz: str | None) -> ZoneInfo | None:
    if tz is None or tz == "UTC":
        return None
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        return None  # the server knew the zone and this machine does not: UTC only


def cluster_text(info: Mapping[str, Any]) -> str:
    rows = [(group["group"], group.get("leader"), group.get("term"),
             group.get("commit_index"), group.get("last_applied"), _entry_versions(group))
            for group in info["groups"]]
    table = format_table(("GROUP", "LEADER", "TERM", "COMMIT", "APPLIED", "ENTRIES"), rows)
    text = f"node: {info.get('node')}" + (f" ({info['node_id']})" if info.get("node_id") else "") + f"\n{table}"
    if info.get("nodes"):
        nodes = format_table(("NODE", "STATE", "HTTP", "RAFT", "GROUPS", "LEADS"), [
            (n["node_id"], n["state"], n["http"], n["raft"], _numbers(n["groups"]), _numbers(n["leads"]))
            for n in info["nodes"]])
        shape = info.get("cluster") or {}
        meta = info.get("meta") or {}
        text += (f"\n\nnodes (replication factor {shape.get('replication_factor', '-')}, placement epoch "
                 f"{info.get('placement_epoch')}; metadata group on {', '.join(meta.get('members', [])) or '-'}, "
                 f"led by {meta.get('leader_node') or '-'}):\n{nodes}")
    return text


def _numbers(values: list[int]) -> str:
    return ",".join(str(v) for v in values) or "-"


def _entry_versions(group: Mapping[str, Any]) -> str:
    """The entry version the node writes, and the newest its build reads when that is more
    (a rolling upgrade not finished); builds from before the entry-version gate say neither."""
    writes, newest = group.get("entry_version"), group.get("entry_version_newest")
    if writes is None:
        return "-"
    return f"v{writes}" if newest in (None, writes) else f"v{writes} (reads v{newest})"


def more_hint(page: Mapping[str, Any], what: str) -> None:
    # On stderr so the table on stdout stays whole for `| column`, `| grep`.
    if page.get("next_cursor") is not None:
        click.echo(f"(more {what} than --limit; not shown)", err=True)
