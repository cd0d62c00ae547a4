"""`schedctl create --file jobs.yaml|jobs.json`: many jobs from one file, sent
through the batch endpoint (one Raft entry per batch) with a progress bar. `schedctl
apply` (cli/apply.py) reads the same files, and directories of them.

The file holds a list of jobs (or `{"jobs": [...]}`), each in the JSON form of
`POST /v1/jobs`. YAML is read with PyYAML's safe loader (no object tags), refusing
a key given twice in one mapping as the API refuses it in JSON."""
from __future__ import annotations

import json
import os
from typing import Any

import click
import yaml

from schedulerd import strict_yaml
from schedulerd.cli.session import EXIT_SERVER_ERROR, CliError, Session
from schedulerd.errors import SchedulerError
from schedulerd.strict_json import parse_json

BATCH = 100  # the server's default create_batch_max
JOB_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def job_file_paths(path: str) -> list[str]:
    """`path` itself, or for a directory the .yaml, .yml and .json files directly in it,
    sorted by name (so the order of an apply does not depend on the file system)."""
    if path == "-" or not os.path.isdir(path):
        return [path]
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        raise click.BadParameter(f"cannot read directory {path!r}: {exc.strerror or exc}",
                                 param_hint="'--file'") from None
    paths = [os.path.join(path, name) for name in names
             if name.endswith(JOB_FILE_SUFFIXES) and os.path.isfile(os.path.join(path, name))]
    if not paths:
        raise click.BadParameter(f"directory {path!r} holds no {', '.join(JOB_FILE_SUFFIXES)} file",
                                 param_hint="'--file'")
    return paths


def read_jobs(path: str) -> list[dict[str, Any]]:
    """The jobs in a .json, .yaml or .yml file ('-': stdin, JSON or YAML)."""
    try:
        with click.open_file(path, "r", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise click.BadParameter(f"cannot read {path!r}: {reason}", param_hint="'--file'") from None
    try:
        # YAML is a superset of JSON: one parser reads both, with line numbers in its errors.
        data = parse_json(text) if path.endswith(".json") else strict_yaml.load(text)
    except (ValueError, RecursionError, yaml.YAMLError) as exc:
        raise click.BadParameter(f"{path!r} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: "
                                 f"{exc}", param_hint="'--file'") from None
    jobs = data.get("jobs") if isinstance(data, dict) else data
    if not isinstance(jobs, list) or not jobs or not all(isinstance(job, dict) for job in jobs):
        raise click.BadParameter(f"{path!r} must hold a non-empty list of job objects "
                                 "(or {\"jobs\": [...]})", param_hint="'--file'")
    return [_jsonable(job) for job in jobs]


def _jsonable(job: dict[str, Any]) -> dict[str, Any]:
    # YAML reads `at: 2027-01-01T02:00:00Z` as a datetime; the API wants the text.
    return json.loads(json.dumps(job, default=lambda value: value.isoformat()))


def create_from_file(session: Session, path: str) -> None:
    jobs = read_jobs(path)
    results: list[dict[str, Any]] = []
    with click.progressbar(length=len(jobs), label=f"creating {len(jobs)} jobs", file=click.get_text_stream("stderr"),
                           show_pos=True) as bar:
        for start in range(0, len(jobs), BATCH):
            chunk = jobs[start:start + BATCH]
            try:
                results.extend(session.client.create_jobs(chunk))
            except SchedulerError as exc:
                # Say how far it got: the batches before this one are in.
                done = sum(1 for r in results if r["ok"])
                raise CliError(exc.code, f"batch jobs[{start}..{start + len(chunk) - 1}]: {exc.message} "
                               f"({done} jobs created before this batch)", EXIT_SERVER_ERROR) from None
            bar.update(len(chunk))
    failed = [r for r in results if not r["ok"]]
    if session.as_json:
        click.echo(json.dumps({"results": results}, indent=2))
    else:
        for r in failed:
            click.echo(f"{r['job_id']}: {r['error']['code']}: {r['error']['message']}")
        click.echo(f"created {len(results) - len(failed)} of {len(results)} jobs"
                   + (f", {len(failed)} failed" if failed else ""))
    if failed:
        raise click.exceptions.Exit(EXIT_SERVER_ERROR)
