"""`schedctl explain`: why a job did or did not run at an instant."""
from __future__ import annotations

import click

from schedulerd.cli.output import explain_text
from schedulerd.cli.session import Session


@click.command()
@click.argument("job_id")
@click.argument("time")
@click.pass_obj
def explain(session: Session, job_id: str, time: str) -> None:
    """Say why JOB_ID did or did not run at TIME, an ISO 8601 instant with Z or an
    offset: it ran, was skipped (and why), is not an occurrence (the nearest ones),
    is still to come, lies outside the schedule's bounds or the job's life, or its
    record is gone. Read from the cluster's records; changes nothing.

    \b
    Examples:
        schedctl explain backup 2026-11-30T02:30:00+01:00
        schedctl --json explain backup 2026-11-30T01:30:00Z | jq .verdict
    """
    session.show(session.client.explain_occurrence(job_id, time), explain_text)
