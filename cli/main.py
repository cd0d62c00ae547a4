"""`schedctl`: a thin command-line client of the schedulerd HTTP API.

Human tables by default, `--json` for scripts (the server's document, as one
JSON value). Whatever fails, stderr gets exactly one line,
`error: <code>: <message>`, and the exit status is 1 for an error the server
(or the network) reported, 2 for bad usage caught before any request.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterable, Iterator, Mapping, Sequence

import click

from schedulerd import timefmt
from schedulerd.client import Client
from schedulerd.errors import SchedulerError

DEFAULT_SERVER = "http://127.0.0.1:8080"
JOB_STATES = ("scheduled", "paused", "completed", "cancelled")
EXIT_SERVER_ERROR = 1
EXIT_USAGE = 2  # what click uses for usage errors


class CliError(click.ClickException):
    """A failure shown as the one line `error: <code>: <message>`."""

    def __init__(self, code: str, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.code}: {self.message}", file=file, err=True)


@contextmanager
def _one_line_errors() -> Iterator[None]:
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise  # bare `schedctl`: click prints the help, which is what the user wants
    except click.UsageError as exc:
        raise CliError("usage", exc.format_message(), EXIT_USAGE) from exc
    except SchedulerError as exc:
        raise CliError(exc.code, exc.message, EXIT_SERVER_ERROR) from exc


class _Group(click.Group):
    """A click group whose errors, its own and its commands', are one line each.

    Click's usage errors come from parsing (here and in the subcommand, which
    `invoke` parses) and print several lines; the client raises typed errors."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        with _one_line_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _one_line_errors():
            return super().invoke(ctx)


@dataclass(frozen=True)
class _Session:
    client: Client
    as_json: bool

    def show(self, document: Any, human: Callable[[Any], str]) -> None:
        click.echo(json.dumps(document, indent=2) if self.as_json else human(document))


# -- output -----------------------------------------------------------------

def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list, bool)):
        return json.dumps(value, separators=(",", ":"))
    # One value, one line: a newline inside a cell would break the columns.
    return str(value).replace("\n", "\\n")


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns left-aligned to their widest cell, two spaces apart."""
    lines = [list(headers)] + [[_cell(value) for value in row] for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
        for line in lines
    )


def format_fields(document: Mapping[str, Any]) -> str:
    """`key: value` lines, values aligned."""
    width = max((len(key) for key in document), default=0) + 1
    return "\n".join(f"{key + ':':<{width}} {_cell(value)}" for key, value in document.items())


def _schedule_text(schedule: Mapping[str, Any]) -> str:
    if "cron" in schedule:
        return f"cron {schedule['cron']} ({schedule.get('timezone', 'UTC')})"
    if "every" in schedule:
        return f"every {schedule['every']}"
    if "at" in schedule:
        return f"at {schedule['at']}"
    return _cell(schedule)


def _jobs_table(page: Mapping[str, Any]) -> str:
    rows = [(job["job_id"], job["state"], job.get("queue"),
             _schedule_text(job.get("schedule") or {}), job.get("next_fire_time"))
            for job in page["jobs"]]
    return format_table(("JOB_ID", "STATE", "QUEUE", "SCHEDULE", "NEXT_FIRE"), rows)


def _runs_table(page: Mapping[str, Any]) -> str:
    rows = [(run["run_id"], run["scheduled_time"], run["state"], run["attempt"],
             run.get("worker_id"), run.get("finished_at")) for run in page["runs"]]
    return format_table(("RUN_ID", "SCHEDULED", "STATE", "ATTEMPT", "WORKER", "FINISHED"), rows)


def _cluster_text(info: Mapping[str, Any]) -> str:
    rows = [(group["group"], group.get("leader"), group.get("term"),
             group.get("commit_index"), group.get("last_applied"))
            for group in info["groups"]]
    table = format_table(("GROUP", "LEADER", "TERM", "COMMIT", "APPLIED"), rows)
    return f"node: {info.get('node')}\n{table}"


def _more_hint(page: Mapping[str, Any], what: str) -> None:
    # On stderr so the table on stdout stays whole for `| column`, `| grep`.
    if page.get("next_cursor") is not None:
        click.echo(f"(more {what} than --limit; not shown)", err=True)


# -- local input --------------------------------------------------------------

def _schedule(at: str | None, cron: str | None, tz: str | None,
              every: str | None) -> dict[str, str]:
    given = [flag for flag, value in (("--at", at), ("--cron", cron), ("--every", every))
             if value is not None]
    if len(given) != 1:
        got = f" (got {' and '.join(given)})" if given else ""
        raise click.UsageError(f"give exactly one of --at, --cron, --every{got}")
    if tz is not None and cron is None:
        raise click.UsageError("--tz applies only to --cron")
    if cron is not None:
        return {"cron": cron, "timezone": tz or "UTC"}
    if every is not None:
        return {"every": every}
    try:
        # Sent as UTC: the wire format is UTC, and a naive time is refused here
        # rather than guessed in some zone.
        return {"at": str(timefmt.to_iso(timefmt.from_iso(at)))}
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--at'") from None


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
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"{source}not valid JSON: {exc}",
                                 param_hint="'--payload'") from None


# -- commands -------------------------------------------------------------------

@click.group(cls=_Group)
@click.option("--server", envvar="SCHEDCTL_SERVER", default=DEFAULT_SERVER, show_default=True,
              metavar="URL[,URL...]", help="Server base URLs, tried in turn (env SCHEDCTL_SERVER).")
@click.option("--json", "as_json", is_flag=True, help="Print the server's JSON document.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, metavar="SECONDS",
              help="Overall time per command, failover and retries included.")
@click.pass_context
def schedctl(ctx: click.Context, server: str, as_json: bool, timeout: float) -> None:
    """Schedule jobs on a schedulerd cluster and look at them."""
    try:
        client = Client(server, timeout_s=timeout)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--server'") from None
    ctx.obj = _Session(client, as_json)


@schedctl.command()
@click.option("--at", metavar="ISO8601", help="Fire once at this time (with Z or an offset).")
@click.option("--cron", metavar="EXPR", help="Fire on this cron expression (5 or 6 fields).")
@click.option("--tz", metavar="ZONE", help="Time zone of --cron, e.g. Europe/Berlin [UTC].")
@click.option("--every", metavar="DURATION", help="Fire at this interval, e.g. 30s, 5m, 1h.")
@click.option("--queue", default="default", show_default=True)
@click.option("--payload", metavar="JSON|@FILE", help="JSON payload, or @FILE to read it.")
@click.option("--id", "job_id", metavar="JOB_ID", help="Job id (generated when absent).")
@click.option("--max-attempts", type=click.IntRange(min=1), metavar="N")
@click.option("--priority", type=click.IntRange(0, 9), metavar="0-9", help="9 is served first.")
@click.pass_obj
def create(session: _Session, at: str | None, cron: str | None, tz: str | None,
           every: str | None, queue: str, payload: str | None, job_id: str | None,
           max_attempts: int | None, priority: int | None) -> None:
    """Create a job: exactly one of --at, --cron, --every."""
    spec: dict[str, Any] = {"schedule": _schedule(at, cron, tz, every), "queue": queue}
    if payload is not None:
        spec["payload"] = _payload(payload)
    optional = {"job_id": job_id, "max_attempts": max_attempts, "priority": priority}
    spec.update({key: value for key, value in optional.items() if value is not None})
    session.show(session.client.create_job(spec), format_fields)


@schedctl.command()
@click.argument("job_id")
@click.pass_obj
def get(session: _Session, job_id: str) -> None:
    """Show one job."""
    session.show(session.client.get_job(job_id), format_fields)


@schedctl.command("list")
@click.option("--state", type=click.Choice(JOB_STATES))
@click.option("--queue")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="Jobs per page.")
@click.option("--all", "all_pages", is_flag=True, help="Follow cursors: every matching job.")
@click.pass_obj
def list_(session: _Session, state: str | None, queue: str | None, limit: int,
          all_pages: bool) -> None:
    """List jobs, ordered by job id."""
    client = session.client
    if all_pages:
        jobs = list(client.iter_jobs(state=state, queue=queue, page_size=limit))
        page: dict[str, Any] = {"jobs": jobs, "next_cursor": None}
    else:
        page = client.list_jobs(state=state, queue=queue, limit=limit)
    session.show(page, _jobs_table)
    if not session.as_json:
        _more_hint(page, "jobs")


@schedctl.command()
@click.argument("job_id")
@click.pass_obj
def cancel(session: _Session, job_id: str) -> None:
    """Cancel a job: no new runs; queued runs are cancelled."""
    session.show(session.client.cancel_job(job_id), format_fields)


@schedctl.command()
@click.argument("job_id")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.pass_obj
def runs(session: _Session, job_id: str, limit: int) -> None:
    """List a job's runs, oldest first."""
    page = session.client.job_runs(job_id, limit=limit)
    session.show(page, _runs_table)
    if not session.as_json:
        _more_hint(page, "runs")


@schedctl.command()
@click.pass_obj
def cluster(session: _Session) -> None:
    """Show this node's Raft groups: leader, term, commit and applied index."""
    session.show(session.client.cluster(), _cluster_text)


def main() -> None:
    schedctl.main(prog_name="schedctl")


if __name__ == "__main__":
    main()
