"""`schedctl apply -f FILE|DIR` and `schedctl export`: jobs kept as code.

apply reads job files (cli/files.py), reads each job they name from the server, plans
per job what makes it as its file says, then carries the plan out:
- a job the server does not have is created;
- a job that differs gets one PATCH of the fields that differ, compared as the server
  reads them ('60s' is '1m', 30 is 30.0, a payload's key order is no difference);
  a field the file leaves out is left as the job has it;
- `paused: true` pauses the job, `paused: false` resumes it (apply's own key, never sent);
- with `--prune -l SELECTOR`, the live jobs the selector selects and no file names are
  cancelled.
Every read comes before the first write, so a refused selector or a job file that
cannot be planned changes nothing. export (cli/export.py) writes live jobs in the form
apply reads: `schedctl export | schedctl apply -f -` changes nothing.

Planning and rendering are pure (file jobs and job views in, plans and lines out);
tests/unit/test_cli_apply.py holds them to that."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import click

from schedulerd.cli.files import job_file_paths, read_jobs
from schedulerd.cli.session import EXIT_SERVER_ERROR, CliError, Session
from schedulerd.errors import NotFound, SchedulerError, Unavailable
from schedulerd.jobspec import BOUNDS, CREATE_FIELDS, OPTION_FIELDS, parse_duration_us
from schedulerd.sdk.client import Client
from schedulerd.storage import cron
from schedulerd.strict_json import integral
from schedulerd.timefmt import from_iso
from schedulerd.units import US_PER_S

# What a job view shows a read-only caller for a target header's value (views.REDACTED)
# and what export writes without --include-secrets; in a file, apply reads it as "keep
# the value the job has", and never sends it.
PLACEHOLDER = "(redacted)"
PAUSED = "paused"  # apply's own key: carried out by pause and resume, never sent as a field
LIVE_STATES = frozenset({"scheduled", "paused"})  # what export writes and a prune cancels
# Fields a create takes and a PATCH cannot change (api/jobs.update takes OPTION_FIELDS).
FIXED_FIELDS = CREATE_FIELDS - OPTION_FIELDS
DEFAULT_NAMESPACE = "default"  # the server's for a request without X-Namespace (namespaces.DEFAULT)
_TARGET_DEFAULTS = {"method": "POST", "headers": {}, "body": None, "timeout_s": None}  # targets.parse_target's
_MISSING = object()  # a field or part one side does not have
_PAST = {"create": "created", "update": "updated", "pause": "paused", "resume": "resumed", "cancel": "cancelled"}
_COUNTED = {"create": "created", "update": "updated", "pause": "paused", "resume": "resumed", "cancel": "pruned"}
_DRY_WORDS = {"created": "to create", "updated": "to update", "unchanged": "unchanged", "paused": "to pause",
              "resumed": "to resume", "pruned": "to prune", "failed": "failed"}
_PRUNE_NOTE = "(pruned: selected by -l, named in no file)"


@dataclass(frozen=True)
class FileJob:
    job_id: str
    fields: dict[str, Any]  # as the API takes them: job_id included, `paused` not
    paused: bool | None  # None: the file leaves the job's pause as it is


@dataclass(frozen=True)
class Change:
    field: str  # "queue", "backoff.factor", "target.headers.Authorization"
    old: str  # shown as compact JSON; header values never shown
    new: str


@dataclass(frozen=True)
class Plan:
    """The writes that make one job as its file says (none: it is already)."""

    job_id: str
    create: dict[str, Any] | None = None  # the body of a create
    patch: Mapping[str, Any] | None = None  # the body of a PATCH: only what differs
    changes: tuple[Change, ...] = ()
    pause: bool | None = None  # True: pause it, False: resume it
    prune: bool = False  # cancel it: selected by the prune's selector, named in no file
    problem: tuple[str, str] | None = None  # (code, message): what apply cannot do, so does nothing

    @property
    def actions(self) -> tuple[str, ...]:
        wanted = (("create", self.create is not None), ("update", bool(self.patch)), ("pause", self.pause is True),
                  ("resume", self.pause is False), ("cancel", self.prune))
        return tuple(verb for verb, yes in wanted if yes)


class Refused(Exception):
    """What apply cannot do for a job as its file says it: the job's error line."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def read_file_jobs(path: str) -> list[FileJob]:
    """The jobs of the file, or of each job file of the directory, in order. A job without
    a string job_id, an id given twice or a `paused` other than true or false is a usage
    error (exit 2) before any request."""
    jobs: list[FileJob] = []
    seen: dict[str, str] = {}
    for file in job_file_paths(path):
        for index, raw in enumerate(read_jobs(file)):
            where = f"{file!r} jobs[{index}]"
            job_id = raw.get("job_id")
            if job_id is None:
                raise click.BadParameter(f"{where} has no job_id: apply finds each job by its job_id, so every "
                                         "job in an apply file needs one", param_hint="'--file'")
            if not isinstance(job_id, str):
                raise click.BadParameter(f"{where}: job_id must be a string", param_hint="'--file'")
            if job_id in seen:
                raise click.BadParameter(f"job_id {job_id!r} is given twice: {seen[job_id]} and {where}",
                                         param_hint="'--file'")
            paused = raw.get(PAUSED)
            if paused is not None and not isinstance(paused, bool):
                raise click.BadParameter(f"{where} (job_id {job_id!r}): paused must be true or false",
                                         param_hint="'--file'")
            seen[job_id] = where
            jobs.append(FileJob(job_id, {k: v for k, v in raw.items() if k != PAUSED}, paused))
    return jobs


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _canonical(value: Any) -> str:
    # Sorted keys: a payload's key order is no difference; 1 and 1.0 and true still are.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _same(given: Any, stored: Any) -> bool:
    return _canonical(given) == _canonical(stored)


def _same_int(given: Any, stored: Any) -> bool:
    """3.0 is 3, as the server reads an integer option (strict_json.integral)."""
    if given is None or stored is None:
        return given is None and stored is None
    number = integral(given)
    return number is not None and number == stored


def _same_number(given: Any, stored: Any) -> bool:
    if given is None or stored is None:
        return given is None and stored is None
    return _is_number(given) and _is_number(stored) and float(given) == float(stored)


def _same_seconds(given: Any, stored: Any) -> bool:
    """Within a µs: the server keeps int(given * 1e6) µs and shows us / 1e6, and neither step
    is exact in binary floating point (0.000249 is kept as 248 µs and shown as 0.000248)."""
    if given is None or stored is None:
        return given is None and stored is None
    return _is_number(given) and _is_number(stored) and abs(given * US_PER_S - stored * US_PER_S) < 1


def schedule_key(raw: Any) -> Any:
    """A schedule as the server reads it (jobspec.parse_schedule): instants in µs, an
    interval in µs, a cron through cron.check_cron with its zone (UTC when left out).
    One that does not read is compared as written; the server says what is wrong."""
    if not isinstance(raw, dict):
        return raw
    try:
        key = {name: from_iso(value) for name, value in raw.items() if name == "at" or name in BOUNDS}
        if "every" in raw:
            key["every"] = parse_duration_us(raw["every"])
        if "cron" in raw:
            key["cron"] = cron.check_cron(raw["cron"], raw.get("timezone", "UTC"))
        known = {"at", "every", "cron", "timezone", *BOUNDS}
        key.update({name: value for name, value in raw.items() if name not in known})
        if "timezone" in raw and "cron" not in raw:
            key["timezone"] = raw["timezone"]
    except (ValueError, SchedulerError):  # cron.ScheduleError is a ValueError
        return raw
    return key


def _same_schedule(given: Any, stored: Any) -> bool:
    return _same(schedule_key(given), schedule_key(stored))


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "schedule": _same_schedule,
    **{name: _same_int for name in ("max_attempts", "priority", "catchup_limit", "history_limit", "max_runs")},
    **{name: _same_seconds for name in ("starting_deadline_s", "timeout_s", "jitter_s", "finished_ttl_s",
                                        "history_ttl_s")},
}
_BACKOFF_COMPARE = {"base_ms": _same_int, "max_ms": _same_int, "factor": _same_number}


def _compare(same: Callable[[Any, Any], bool], given: Any, stored: Any) -> bool:
    if given is _MISSING or stored is _MISSING:
        return given is stored
    return same(given, stored)


def shown(value: Any) -> str:
    return "-" if value is _MISSING else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def masked(target: Any) -> Any:
    """A target with its header values hidden: a diff ends up in CI logs."""
    if isinstance(target, dict) and isinstance(target.get("headers"), dict):
        return {**target, "headers": {name: PLACEHOLDER for name in target["headers"]}}
    return target


def headers_of(target: Any) -> dict[str, Any]:
    headers = target.get("headers") if isinstance(target, dict) else None
    return headers if isinstance(headers, dict) else {}


def resolved_target(given: Any, stored: Any) -> Any:
    """The file's target with each placeholder header value replaced by the job's value."""
    if not isinstance(given, dict) or not isinstance(given.get("headers"), dict):
        return given
    kept = headers_of(stored)
    headers = {}
    for name, value in given["headers"].items():
        if value == PLACEHOLDER:
            if name not in kept:
                raise Refused("invalid_job", f"target.headers[{name!r}] is the placeholder {PLACEHOLDER!r}, and the "
                              "job on the server has no value of it to keep (no such job or header yet): write the "
                              "value (`schedctl export --include-secrets` does)")
            value = kept[name]
        headers[name] = value
    return {**given, "headers": headers}


def _target_changes(given: Any, stored: Any) -> list[Change]:
    if not isinstance(given, dict) or not isinstance(stored, dict):
        return [] if _same(given, stored) else [Change("target", shown(masked(stored)), shown(masked(given)))]
    full = {**_TARGET_DEFAULTS, **given}
    changes = []
    for part in [*full, *(p for p in stored if p not in full)]:
        new, old = full.get(part, _MISSING), stored.get(part, _MISSING)
        if part == "headers" and isinstance(new, dict) and isinstance(old, dict):
            changes += [Change(f"target.headers.{name}", PLACEHOLDER if name in old else "-",
                               "-" if name not in new else "(a new value)" if name in old else PLACEHOLDER)
                        for name in [*new, *(n for n in old if n not in new)] if new.get(name) != old.get(name)]
        elif not _compare(_same_number if part == "timeout_s" else _same, new, old):
            changes.append(Change(f"target.{part}", shown(masked(old)), shown(masked(new))))
    return changes


def _backoff_changes(given: Any, stored: Any) -> tuple[list[Change], Any]:
    """A backoff part by part, and the parts to send: the job keeps the parts a PATCH leaves out."""
    if not isinstance(given, dict) or not isinstance(stored, dict):
        return ([] if _same(given, stored) else [Change("backoff", shown(stored), shown(given))]), given
    send = {part: value for part, value in given.items()
            if not _compare(_BACKOFF_COMPARE.get(part, _same), value, stored.get(part, _MISSING))}
    return [Change(f"backoff.{part}", shown(stored.get(part, _MISSING)), shown(value))
            for part, value in send.items()], send


def _outward_key(stored: Any, namespace: str) -> Any:
    # The view shows an idempotency key as stored: behind its namespace's name outside
    # the default one (and in it, for a key holding a '/'): namespaces.key_inside.
    prefix = f"{namespace}/"
    return stored[len(prefix):] if isinstance(stored, str) and stored.startswith(prefix) else stored


def diff(fields: Mapping[str, Any], view: Mapping[str, Any], namespace: str) -> tuple[dict[str, Any], list[Change]]:
    """The PATCH that makes the job `view` shows as `fields` say, and the changes it makes.
    A field no PATCH takes is sent as it is, so the server's 400 names it."""
    patch: dict[str, Any] = {}
    changes: list[Change] = []
    for name, given in fields.items():
        stored = view.get(name, _MISSING)
        if name in FIXED_FIELDS:
            stored = _outward_key(stored, namespace) if name == "idempotency_key" else stored
            if not _compare(_same, given, stored):
                raise Refused("conflict", f"{name} differs ({shown(stored)} -> {shown(given)}) and an update cannot "
                              f"change it: `schedctl cancel {view['job_id']} --purge`, then apply again to create "
                              "the job anew")
            continue
        if name not in OPTION_FIELDS:
            found, send = [Change(name, shown(stored), shown(given))], given
        elif name == "target":
            send = resolved_target(given, view.get("target"))
            found = _target_changes(send, view.get("target"))
            if found and PLACEHOLDER in headers_of(send).values():
                raise Refused("forbidden", f"target: this token reads the job's header values as {PLACEHOLDER!r}, "
                              "so apply cannot keep them in a changed target: use a token that may manage jobs")
        elif name == "backoff":
            found, send = _backoff_changes(given, view.get("backoff"))
        else:
            same = _compare(_COMPARE.get(name, _same), given, stored)
            found, send = ([] if same else [Change(name, shown(stored), shown(given))]), given
        if found:
            patch[name] = send
            changes += found
    return patch, changes


def plan_job(job: FileJob, view: Mapping[str, Any] | None, namespace: str = DEFAULT_NAMESPACE) -> Plan:
    """What makes the job the server has (`view`, None for none) as its file says."""
    try:
        if view is None:
            resolved_target(job.fields.get("target"), None)  # a placeholder has nothing to keep
            return Plan(job.job_id, create=dict(job.fields), pause=True if job.paused else None)
        if view.get("state") == "cancelled":
            raise Refused("conflict", "the job is cancelled on the server, and a cancelled job cannot be changed "
                          f"or resumed: `schedctl cancel {job.job_id} --purge` frees its id, then apply creates it")
        patch, changes = diff(job.fields, view, namespace)
    except Refused as refused:
        return Plan(job.job_id, problem=(refused.code, refused.message))
    paused = view.get("state") == "paused"
    pause = True if job.paused and not paused else False if job.paused is False and paused else None
    return Plan(job.job_id, patch=patch, changes=tuple(changes), pause=pause)


def plan_prune(selected: Iterable[Mapping[str, Any]], named: set[str]) -> list[Plan]:
    """The live jobs a prune's selector selects that no file names: each is cancelled."""
    return [Plan(view["job_id"], prune=True) for view in selected
            if view["job_id"] not in named and view.get("state") in LIVE_STATES]


@dataclass(frozen=True)
class Outcome:
    plan: Plan
    done: tuple[str, ...] = ()  # the plan's actions that were carried out, in order
    error: tuple[str, str] | None = None  # (code, message) of the step that failed, or of the plan's problem


_SEND: dict[str, Callable[[Client, Plan], Any]] = {
    "create": lambda client, plan: client.create_job(plan.create or {}),
    "update": lambda client, plan: client.update_job(plan.job_id, plan.patch or {}),
    "pause": lambda client, plan: client.pause_job(plan.job_id),
    "resume": lambda client, plan: client.resume_job(plan.job_id),
    "cancel": lambda client, plan: client.cancel_job(plan.job_id),
}


def carry_out(client: Client, plan: Plan) -> Outcome:
    """The plan's writes in order. A refusal (4xx) ends this job's and is its error line,
    and the next job still goes; Unavailable (the cluster cannot serve) goes up and stops all."""
    if plan.problem is not None:
        return Outcome(plan, error=plan.problem)
    done: list[str] = []
    for verb in plan.actions:
        try:
            _SEND[verb](client, plan)
        except Unavailable:
            raise
        except SchedulerError as exc:
            return Outcome(plan, tuple(done), (exc.code, exc.message))
        done.append(verb)
    return Outcome(plan, tuple(done))


def outcome_lines(outcome: Outcome, dry_run: bool) -> list[str]:
    """The job's lines on stdout: what it did (or would do), or `unchanged`; none for a job
    that failed before doing anything (its error line says it)."""
    plan = outcome.plan
    verbs = plan.actions if dry_run else outcome.done
    if not verbs:
        return [] if outcome.error else [f"{plan.job_id}: unchanged"]
    words = []
    for verb in verbs:
        word = f"would {verb}" if dry_run else _PAST[verb]
        if verb == "update" and not dry_run:
            word += f" ({', '.join(change.field for change in plan.changes)})"
        words.append(f"{word} {_PRUNE_NOTE}" if verb == "cancel" else word)
    lines = [f"{plan.job_id}: {', '.join(words)}"]
    if dry_run:
        lines += [f"    {change.field}: {change.old} -> {change.new}" for change in plan.changes]
    return lines


def counts(outcomes: Iterable[Outcome], dry_run: bool) -> dict[str, int]:
    total = dict.fromkeys(("created", "updated", "unchanged", "paused", "resumed", "pruned", "failed"), 0)
    for outcome in outcomes:
        verbs = outcome.plan.actions if dry_run else outcome.done
        for verb in verbs:
            total[_COUNTED[verb]] += 1
        if outcome.error is not None:
            total["failed"] += 1
        elif not verbs:
            total["unchanged"] += 1
    return total


def summary_line(total: Mapping[str, int], dry_run: bool) -> str:
    parts = [f"{n} {_DRY_WORDS[key] if dry_run else key}" for key, n in total.items() if n]
    return ("dry run, nothing changed: " if dry_run else "applied: ") + ", ".join(parts)


def _result(outcome: Outcome, dry_run: bool) -> dict[str, Any]:
    code, message = outcome.error or (None, None)
    return {"job_id": outcome.plan.job_id, "actions": list(outcome.plan.actions if dry_run else outcome.done),
            "changes": [{"field": c.field, "old": c.old, "new": c.new} for c in outcome.plan.changes],
            "error": None if code is None else {"code": code, "message": message}}


def run_apply(session: Session, path: str, *, dry_run: bool, prune_selector: str | None) -> None:
    jobs = read_file_jobs(path)
    client = session.client
    namespace = session.namespace or DEFAULT_NAMESPACE
    plans = [plan_job(job, _current(client, job.job_id), namespace) for job in jobs]
    if prune_selector is not None:
        plans += plan_prune(client.iter_jobs(selector=prune_selector), {job.job_id for job in jobs})
    outcomes: list[Outcome] = []
    for plan in plans:
        try:
            outcome = Outcome(plan, error=plan.problem) if dry_run else carry_out(client, plan)
        except Unavailable as exc:
            raise CliError(exc.code, f"{plan.job_id}: {exc.message} (stopped there; {len(outcomes)} of {len(plans)} "
                           "jobs were done: apply again)", EXIT_SERVER_ERROR) from None
        outcomes.append(outcome)
        if not session.as_json:
            for line in outcome_lines(outcome, dry_run):
                click.echo(line)
            if outcome.error is not None:
                click.echo(f"error: {outcome.error[0]}: {plan.job_id}: {outcome.error[1]}", err=True)
    total = counts(outcomes, dry_run)
    if session.as_json:
        click.echo(json.dumps({"dry_run": dry_run, "results": [_result(o, dry_run) for o in outcomes],
                               "summary": total}, indent=2))
    else:
        click.echo(summary_line(total, dry_run))
    if total["failed"]:
        raise click.exceptions.Exit(EXIT_SERVER_ERROR)


def _current(client: Client, job_id: str) -> dict[str, Any] | None:
    try:
        return client.get_job(job_id)
    except NotFound:
        return None
