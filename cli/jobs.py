"""`schedctl` commands on jobs: create, get, list, update, pause, resume,
trigger, cancel."""
from __future__ import annotations

from typing import Any

import click

from cli.options import job_fields, job_options
from cli.output import format_fields, jobs_table, more_hint, run_fields
from cli.session import Session

JOB_STATES = ("scheduled", "paused", "completed", "cancelled")


@click.command()
@job_options(for_create=True)
@click.pass_obj
def create(session: Session, **flags: Any) -> None:
    """Create a job: exactly one of --at, --cron, --every.

    Options left out get the server's defaults. With --idempotency-key a repeat
    of the same command returns the job the first one made."""
    spec = job_fields(flags, schedule_required=True)
    session.show(session.client.create_job(spec), format_fields)


@click.command()
@click.argument("job_id")
@job_options(for_create=False)
@click.pass_obj
def update(session: Session, job_id: str, **flags: Any) -> None:
    """Change a job: only the options given are sent (PATCH).

    A new schedule is one of --at, --cron (with --tz), --every; the next fire
    time is recomputed from now. Any --backoff-* flag sends `backoff` with just
    the parts given, and the server fills the others with its defaults, not
    with the job's current values: to keep a part, give it again."""
    changes = job_fields(flags, schedule_required=False)
    if not changes:
        raise click.UsageError("nothing to update: give at least one option "
                               "(see `schedctl update --help`)")
    session.show(session.client.update_job(job_id, changes), format_fields)


@click.command()
@click.argument("job_id")
@click.pass_obj
def get(session: Session, job_id: str) -> None:
    """Show one job."""
    session.show(session.client.get_job(job_id), format_fields)


@click.command("list")
@click.option("--state", type=click.Choice(JOB_STATES))
@click.option("--queue")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="Jobs per page.")
@click.option("--all", "all_pages", is_flag=True, help="Follow cursors: every matching job.")
@click.pass_obj
def list_(session: Session, state: str | None, queue: str | None, limit: int,
          all_pages: bool) -> None:
    """List jobs, ordered by job id."""
    client = session.client
    if all_pages:
        jobs = list(client.iter_jobs(state=state, queue=queue, page_size=limit))
        page: dict[str, Any] = {"jobs": jobs, "next_cursor": None}
    else:
        page = client.list_jobs(state=state, queue=queue, limit=limit)
    session.show(page, jobs_table)
    if not session.as_json:
        more_hint(page, "jobs")


@click.command()
@click.argument("job_id")
@click.pass_obj
def pause(session: Session, job_id: str) -> None:
    """Stop new occurrences of a job until it is resumed."""
    session.show(session.client.pause_job(job_id), format_fields)


@click.command()
@click.argument("job_id")
@click.pass_obj
def resume(session: Session, job_id: str) -> None:
    """Re-arm a paused job from now; occurrences inside the pause are not caught up."""
    session.show(session.client.resume_job(job_id), format_fields)


@click.command()
@click.argument("job_id")
@click.pass_obj
def trigger(session: Session, job_id: str) -> None:
    """Run a job once more, now, besides its schedule; prints the new run.

    Not retried once a request may have reached a server: if this ends in
    `outcome_unknown`, look at `schedctl runs JOB_ID` before triggering again."""
    session.show(session.client.trigger_job(job_id), run_fields)


@click.command()
@click.argument("job_id")
@click.pass_obj
def cancel(session: Session, job_id: str) -> None:
    """Cancel a job: no new runs; queued runs are cancelled."""
    session.show(session.client.cancel_job(job_id), format_fields)


COMMANDS = (create, get, list_, update, pause, resume, trigger, cancel)
