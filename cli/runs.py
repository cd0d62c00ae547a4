"""`schedctl` commands on runs and schedules: runs, cancel-run, dead-letter list|retry|discard, preview."""
from __future__ import annotations

import click

from schedulerd.cli.live import follow_runs
from schedulerd.cli.output import (dead_letters_table, job_preview_table, more_hint, preview_table, run_fields,
                                   runs_table)
from schedulerd.cli.session import OneLineGroup, Session
from schedulerd.storage.model import RunState

RUN_STATES = [s.value for s in RunState]


@click.command("cancel-run")
@click.argument("run_id")
@click.pass_obj
def cancel_run(session: Session, run_id: str) -> None:
    """Cancel one run: a queued or retry-waiting one at once; a running one loses its lease,
    its worker stops it at its next heartbeat, and its ack or nack is refused.

    \b
    Example:
        schedctl cancel-run 0-1234-0
    """
    session.show(session.client.cancel_run(run_id), run_fields)


@click.command()
@click.argument("job_id", required=False)
@click.option("--state", type=click.Choice(RUN_STATES), help="Runs in this state across every job instead.")
@click.option("--queue", help="With --state: of this queue only.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--follow", "-f", is_flag=True,
              help="Keep watching: a line per run as it appears or changes state (--json: JSON lines).")
@click.option("--interval", type=click.FloatRange(min=0.2), default=1.0, show_default=True, metavar="SECONDS",
              help="How often --follow asks.")
@click.pass_obj
def runs(session: Session, job_id: str | None, state: str | None, queue: str | None, limit: int, follow: bool,
         interval: float) -> None:
    """List a job's runs, or follow them as they happen (Ctrl-C stops); or, with
    --state, the runs in that state across every job.

    \b
    Examples:
        schedctl runs backup
        schedctl runs backup --follow
        schedctl runs --state running --queue backups
    """
    if (job_id is None) == (state is None):
        raise click.UsageError("give a JOB_ID, or --state for runs across jobs")
    if state is not None:
        if follow:
            raise click.UsageError("--follow follows one job's runs: give its JOB_ID")
        page = session.client.list_runs(state, queue=queue, limit=limit)
    else:
        if queue is not None:
            raise click.UsageError("--queue applies to --state")
        if follow:
            follow_runs(session, job_id, interval)
            return
        page = session.client.job_runs(job_id, limit=limit)
    session.show(page, runs_table)
    if not session.as_json:
        more_hint(page, "runs")


@click.group("dead-letter", cls=OneLineGroup)
def dead_letter() -> None:
    """Runs that used up their attempts: list them, re-drive or discard one.

    \b
    Examples:
        schedctl dead-letter list --queue backups
        schedctl dead-letter retry 0-1234-0
        schedctl dead-letter discard 0-1234-0
    """


@dead_letter.command("list")
@click.option("--queue", help="Only this queue.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.pass_obj
def dead_letter_list(session: Session, queue: str | None, limit: int) -> None:
    """List dead-lettered runs, oldest first.

    \b
    Examples:
        schedctl dead-letter list
        schedctl --json dead-letter list --queue backups
    """
    page = session.client.dead_letters(queue=queue, limit=limit)
    session.show(page, dead_letters_table)
    if not session.as_json:
        more_hint(page, "dead letters")


@dead_letter.command("retry")
@click.argument("run_id")
@click.pass_obj
def dead_letter_retry(session: Session, run_id: str) -> None:
    """Queue a dead-lettered run again, with a fresh set of attempts.

    \b
    Example:
        schedctl dead-letter retry 0-1234-0
    """
    session.show(session.client.retry_run(run_id), run_fields)


@dead_letter.command("discard")
@click.argument("run_id")
@click.pass_obj
def dead_letter_discard(session: Session, run_id: str) -> None:
    """Delete a dead-lettered run: it leaves the list and its job's history.

    \b
    Example:
        schedctl dead-letter discard 0-1234-0
    """
    session.show(session.client.discard_run(run_id), run_fields)


@click.command()
@click.argument("cron", required=False)
@click.option("--tz", metavar="ZONE", help="Time zone of CRON, e.g. Europe/Berlin [UTC].")
@click.option("--every", metavar="DURATION", help="Preview an interval instead, e.g. 90s.")
@click.option("--from", "after", metavar="TIME", help="Fire times after this ISO 8601 instant [now].")
@click.option("--job", "job_id", metavar="ID", help="Preview an existing job instead, its jitter applied.")
@click.option("-n", "count", type=click.IntRange(min=1), default=10, show_default=True,
              help="How many fire times (the server allows up to 100).")
@click.pass_obj
def preview(session: Session, cron: str | None, tz: str | None, every: str | None, after: str | None,
            job_id: str | None, count: int) -> None:
    """Show the next fire times of "CRON" (or --every DURATION) from now, as the
    server computes them, DST rules included, or an existing job's next
    occurrences (--job ID). Creates nothing. CRON may be a shorthand: @hourly,
    @daily, @weekly, @monthly, @yearly.

    \b
    Examples:
        schedctl preview '30 2 * * *' --tz Europe/Berlin -n 5
        schedctl preview @daily --tz America/New_York --from 2027-03-13T00:00:00Z
        schedctl preview --every 90m
        schedctl preview --job nightly-backup -n 3
    """
    if job_id is not None:
        if cron is not None or every is not None or tz is not None or after is not None:
            raise click.UsageError("--job previews the job's own schedule: give no CRON, --every, --tz or --from")
        session.show(session.client.preview_job(job_id, n=count), job_preview_table)
        return
    if (cron is None) == (every is None):
        raise click.UsageError('give exactly one of "CRON", --every DURATION or --job ID')
    if tz is not None and cron is None:
        raise click.UsageError("--tz applies only to CRON")
    document = session.client.preview(cron=cron, timezone=tz, every=every, n=count, after=after)
    session.show(document, lambda doc: preview_table(doc, tz))


COMMANDS = (runs, cancel_run, dead_letter, preview)
