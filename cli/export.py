"""`schedctl export`: the live jobs in the file form `schedctl apply` reads (cli/apply.py),
so that `schedctl export | schedctl apply -f -` changes nothing.

Pure but for run_export: views in, the file's text out (tests/unit/test_cli_apply.py)."""
from __future__ import annotations

import json
from typing import Any, Mapping

import click
import yaml

from schedulerd.cli.apply import LIVE_STATES, PAUSED, PLACEHOLDER, headers_of, masked
from schedulerd.cli.session import Session
from schedulerd.jobspec import CREATE_FIELDS

# The key names the request that created the job, not the job: apply finds jobs by job_id.
EXPORTED_FIELDS = CREATE_FIELDS - {"idempotency_key"}
FORMATS = ("yaml", "json")


def exported(view: Mapping[str, Any], include_secrets: bool) -> dict[str, Any]:
    """A job as apply reads it: its create fields as the view shows them (defaults too, so
    the file pins the whole job), `paused: true` when paused, header values as PLACEHOLDER
    unless include_secrets."""
    job: dict[str, Any] = {"job_id": view["job_id"]}
    if view.get("state") == "paused":
        job[PAUSED] = True
    # A view's description is null when the job has none, and the API takes no null description;
    # a null skip_calendar is left out too, so a file of a job with none applies before entry version 19.
    job.update((name, value) for name, value in view.items()
               if name in EXPORTED_FIELDS and name != "job_id"
               and not (name in ("description", "skip_calendar") and value is None))
    if not include_secrets and job.get("target"):
        job["target"] = masked(job["target"])
    return job


def dump_jobs(jobs: list[dict[str, Any]], fmt: str) -> str:
    document = {"jobs": jobs}
    if fmt == "json":
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, default_flow_style=False)


def run_export(session: Session, selector: str | None, output: str, fmt: str, include_secrets: bool) -> None:
    try:
        # Opened first, so an -o that cannot be written is a usage error before any request; atomic,
        # so a failed read leaves an earlier export in place.
        out = click.open_file(output, "w", encoding="utf-8", atomic=output != "-")
    except OSError as exc:
        raise click.BadParameter(f"cannot write {output!r}: {exc.strerror or exc}", param_hint="'--output'") from None
    with out as f:
        views = list(session.client.iter_jobs(selector=selector))
        live = [view for view in views if view.get("state") in LIVE_STATES]
        jobs = [exported(view, include_secrets) for view in live]
        f.write(dump_jobs(jobs, fmt))
    if len(live) < len(views):
        click.echo(f"(left out {len(views) - len(live)} completed or cancelled jobs: export writes scheduled and "
                   "paused ones)", err=True)
    if include_secrets and any(PLACEHOLDER in headers_of(job.get("target")).values() for job in jobs):
        click.echo(f"warning: this token reads header values as {PLACEHOLDER!r}: they are written so, and apply "
                   "keeps the values the jobs have", err=True)
