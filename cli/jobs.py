"""`schedctl` commands on jobs: create, get, list, update, pause, resume,
trigger, cancel, and apply and export (jobs kept as code)."""
from __future__ import annotations

from typing import Any

import click

from schedulerd import labels
from schedulerd.cli.apply import PLACEHOLDER, run_apply
from schedulerd.cli.export import FORMATS, run_export
from schedulerd.cli.files import create_from_file
from schedulerd.cli.options import job_fields, job_options
from schedulerd.cli.output import bulk_text, format_fields, jobs_table, more_hint, run_fields
from schedulerd.cli.session import Session
from schedulerd.errors import InvalidRequest

JOB_STATES = ("scheduled", "paused", "completed", "cancelled")


@click.command()
@job_options(for_create=True)
@click.option("--file", "file_path", metavar="PATH",
              help="Create every job in a .yaml/.yml/.json file ('-': stdin) instead; no other flags.")
@click.pass_context
def create(ctx: click.Context, file_path: str | None, **flags: Any) -> None:
    """Create a job: exactly one of --at, --cron, --every. Or many: --file.

    Options left out get the server's defaults. With --idempotency-key a repeat
    of the same command returns the job the first one made. A --file holds a
    list of jobs in the JSON form of POST /v1/jobs; they go in batches of 100
    (one Raft entry each), with a progress bar on a terminal.

    \b
    Examples:
        schedctl create --id backup --cron '30 2 * * *' --tz Europe/Berlin --queue backups
        schedctl create --at 2027-01-01T00:00:00Z --payload '{"greeting": "happy new year"}'
        schedctl create --file jobs.yaml
    """
    session: Session = ctx.obj
    if file_path is not None:
        given = [param.opts[0] for param in ctx.command.params
                 if param.name in flags and ctx.get_parameter_source(param.name) != click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"--file takes every field from the file; drop {', '.join(given)}")
        create_from_file(session, file_path)
        return
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
    the parts given; the job keeps its current values of the others.

    \b
    Examples:
        schedctl update backup --cron '0 3 * * *' --tz Europe/Berlin
        schedctl update backup --max-attempts 5 --backoff-base-ms 2000
    """
    changes = job_fields(flags, schedule_required=False)
    if not changes:
        raise click.UsageError("nothing to update: give at least one option "
                               "(see `schedctl update --help`)")
    session.show(session.client.update_job(job_id, changes), format_fields)


@click.command()
@click.argument("job_id")
@click.pass_obj
def get(session: Session, job_id: str) -> None:
    """Show one job.

    \b
    Examples:
        schedctl get backup
        schedctl --json get backup | jq .next_fire_time
    """
    session.show(session.client.get_job(job_id), format_fields)


@click.command("list")
@click.option("--state", type=click.Choice(JOB_STATES))
@click.option("--queue")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="Jobs per page.")
@click.option("--all", "all_pages", is_flag=True, help="Follow cursors: every matching job.")
@click.option("-l", "--selector", metavar="SELECTOR",
              help="Only jobs whose labels match, e.g. 'team=billing,env!=prod' (Kubernetes syntax).")
@click.pass_obj
def list_(session: Session, state: str | None, queue: str | None, limit: int,
          all_pages: bool, selector: str | None) -> None:
    """List jobs, ordered by job id.

    \b
    Examples:
        schedctl list --state paused
        schedctl list --queue backups --all
        schedctl list -l 'team=billing,env in (prod,staging)'
    """
    client = session.client
    if all_pages:
        jobs = list(client.iter_jobs(state=state, queue=queue, page_size=limit, selector=selector))
        page: dict[str, Any] = {"jobs": jobs, "next_cursor": None}
    else:
        page = client.list_jobs(state=state, queue=queue, limit=limit, selector=selector)
    session.show(page, jobs_table)
    if not session.as_json:
        more_hint(page, "jobs")


def _one_or_selected(job_id: str | None, selector: str | None) -> None:
    if (job_id is None) == (selector is None):
        raise click.UsageError("give one JOB_ID or -l SELECTOR")


SELECTOR_OPTION = click.option("-l", "--selector", metavar="SELECTOR",
                               help="Every job whose labels match instead, e.g. 'team=billing,env!=prod'.")


@click.command()
@click.argument("job_id", required=False)
@SELECTOR_OPTION
@click.pass_obj
def pause(session: Session, job_id: str | None, selector: str | None) -> None:
    """Stop new occurrences of a job (or of every job -l selects) until it is resumed.

    \b
    Examples:
        schedctl pause backup
        schedctl pause -l team=billing
    """
    _one_or_selected(job_id, selector)
    if selector is not None:
        session.show(session.client.act_on_jobs("pause", selector), bulk_text)
        return
    session.show(session.client.pause_job(job_id), format_fields)


@click.command()
@click.argument("job_id", required=False)
@SELECTOR_OPTION
@click.pass_obj
def resume(session: Session, job_id: str | None, selector: str | None) -> None:
    """Re-arm a paused job (or every paused job -l selects) from now; occurrences inside
    the pause are not caught up.

    \b
    Examples:
        schedctl resume backup
        schedctl resume -l 'team=billing,env in (staging)'
    """
    _one_or_selected(job_id, selector)
    if selector is not None:
        session.show(session.client.act_on_jobs("resume", selector), bulk_text)
        return
    session.show(session.client.resume_job(job_id), format_fields)


@click.command()
@click.argument("job_id")
@click.pass_obj
def trigger(session: Session, job_id: str) -> None:
    """Run a job once more, now, besides its schedule; prints the new run.

    Not retried once a request may have reached a server: if this ends in
    `outcome_unknown`, look at `schedctl runs JOB_ID` before triggering again.

    \b
    Example:
        schedctl trigger backup
    """
    session.show(session.client.trigger_job(job_id), run_fields)


@click.command()
@click.argument("job_id", required=False)
@SELECTOR_OPTION
@click.option("--purge", is_flag=True,
              help="Then delete the job and all its runs, dead letters included; its id may be created again.")
@click.pass_obj
def cancel(session: Session, job_id: str | None, selector: str | None, purge: bool) -> None:
    """Cancel a job (or every job -l selects): no new runs; queued runs are cancelled.

    \b
    Examples:
        schedctl cancel backup
        schedctl cancel backup --purge
        schedctl cancel -l env=staging
    """
    _one_or_selected(job_id, selector)
    if selector is not None:
        if purge:
            raise click.UsageError("--purge takes one JOB_ID")
        session.show(session.client.act_on_jobs("cancel", selector), bulk_text)
        return
    session.show(session.client.cancel_job(job_id, purge=purge), format_fields)


def _selector(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A selector the server would refuse is a usage error here, before any request."""
    if value is not None:
        try:
            labels.parse_selector(value)
        except InvalidRequest as exc:
            raise click.BadParameter(exc.message, ctx, param) from None
    return value


@click.command("apply")
@click.option("-f", "--file", "path", required=True, metavar="FILE|DIR",
              help="A .yaml/.yml/.json job file, a directory of them (each, by name) or '-' (stdin).")
@click.option("--dry-run", is_flag=True, help="Print what would change (field: old -> new); change nothing.")
@click.option("--prune", is_flag=True, help="Also cancel the scheduled and paused jobs -l selects that no file names.")
@click.option("-l", "--selector", metavar="SELECTOR", callback=_selector,
              help="The jobs --prune answers for, e.g. 'managed-by=git,team=billing'.")
@click.pass_obj
def apply_(session: Session, path: str, dry_run: bool, prune: bool, selector: str | None) -> None:
    """Make the jobs as the files say, by job_id: create what is missing, update (one PATCH
    of the fields that differ) what differs, pause or resume as `paused: true|false` says;
    one line per job, then a summary. A second apply of the same files changes nothing.

    Every job needs a job_id. A field a file leaves out is left as the job has it. A target
    header value written as "(redacted)" keeps the job's value (export writes it so without
    --include-secrets). Exit 1 when a job failed (its `error:` line on stderr says why; the
    others still go), 2 for a bad file, before any request.

    \b
    Examples:
        schedctl apply -f jobs/ --dry-run
        schedctl apply -f jobs/ --prune -l managed-by=git
        schedctl export -l team=billing | schedctl apply -f -
    """
    if prune and selector is None:
        raise click.UsageError("--prune needs -l SELECTOR: a prune cancels only jobs a selector selects")
    if selector is not None and not prune:
        raise click.UsageError("-l SELECTOR scopes --prune here; give --prune too")
    run_apply(session, path, dry_run=dry_run, prune_selector=selector)


@click.command("export")
@click.option("-l", "--selector", metavar="SELECTOR", callback=_selector,
              help="Only the jobs whose labels match, e.g. 'team=billing'.")
@click.option("-o", "--output", default="-", metavar="FILE", help="Write the file here [stdout].")
@click.option("--format", "fmt", type=click.Choice(FORMATS),
              help="[yaml; json for an -o FILE ending in .json, or with --json]")
@click.option("--include-secrets", is_flag=True,
              help=f"Write the target header values; without it each is {PLACEHOLDER!r}, which apply reads as "
                   "\"keep the job's value\".")
@click.pass_obj
def export(session: Session, selector: str | None, output: str, fmt: str | None, include_secrets: bool) -> None:
    """Write the scheduled and paused jobs (or those -l selects) as the file `apply` reads:
    each job's fields as a create takes them, defaults included, `paused: true` for a paused
    one; no state, fire times or runs. Completed and cancelled jobs are left out.

    \b
    Examples:
        schedctl export -l team=billing -o billing.yaml
        schedctl export --format json --include-secrets -o all-jobs.json
        schedctl export | schedctl apply -f - --dry-run    # changes nothing
    """
    if fmt is None:
        fmt = "json" if output.endswith(".json") or session.as_json else "yaml"
    run_export(session, selector, output, fmt, include_secrets)


COMMANDS = (create, get, list_, update, pause, resume, trigger, cancel, apply_, export)
