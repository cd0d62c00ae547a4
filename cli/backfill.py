"""`schedctl backfill`: run the past occurrences of a job's schedule in a range."""
from __future__ import annotations

from typing import Any, Mapping

import click

from schedulerd.cli.options import OVERLAP_POLICIES
from schedulerd.cli.output import format_table
from schedulerd.cli.session import Session


@click.command()
@click.argument("job_id")
@click.option("--start", required=True, metavar="TIME", help="First instant of the range (ISO 8601, included).")
@click.option("--end", required=True, metavar="TIME", help="End of the range (ISO 8601, excluded; not in the future).")
@click.option("--dry-run", is_flag=True, help="List what it would run, and what already ran; change nothing.")
@click.option("--overlap", type=click.Choice(OVERLAP_POLICIES), help="Overlap policy for these runs [the job's].")
@click.pass_obj
def backfill(session: Session, job_id: str, start: str, end: str, dry_run: bool, overlap: str | None) -> None:
    """Run each occurrence of JOB_ID's schedule in [--start, --end) that has no run yet,
    released a little apart, each with its own scheduled time and idempotency key. An
    occurrence that already has a run is not run again, so a repeated backfill is safe.

    \b
    Examples:
        schedctl backfill nightly-report --start 2026-11-01T00:00:00Z --end 2026-11-08T00:00:00Z --dry-run
        schedctl backfill nightly-report --start 2026-11-01T00:00:00Z --end 2026-11-08T00:00:00Z
    """
    answer = session.client.backfill(job_id, start, end, dry_run=dry_run, overlap_policy=overlap)
    session.show(answer, backfill_text)


def backfill_text(document: Mapping[str, Any]) -> str:
    rows = [(o["scheduled_time"], "already had a run" if o["already_had_run"] else
             ("would run" if document["dry_run"] else "backfilled"), o.get("run_id", ""),
             o.get("state", "") + (f" ({o['reason']})" if o.get("reason") else ""))
            for o in document["occurrences"]]
    made = (f"would create {document['would_create']}" if document["dry_run"]
            else f"created {document['created']}")
    summary = f"job {document['job_id']}: {made} runs; {document['already_had_run']} occurrences already had one"
    return (format_table(("SCHEDULED", "", "RUN_ID", "STATE"), rows) + "\n" if rows else "") + summary
