"""`schedctl apply` and `export` without a server: reading job files, the diff as the
server normalizes fields, the plan, what is printed, and the export -> apply round trip.
The live loop is tests/integration/test_cli_apply.py."""
from __future__ import annotations

import pathlib
from typing import Any

import click
import pytest
from click.testing import CliRunner

from schedulerd import views
from schedulerd.cli.apply import (PLACEHOLDER, FileJob, Outcome, Plan, carry_out, counts, outcome_lines, plan_job,
                                  plan_prune, read_file_jobs, schedule_key, summary_line)
from schedulerd.cli.export import dump_jobs, exported
from schedulerd.cli.files import read_jobs
from schedulerd.cli.main import schedctl
from schedulerd.errors import Conflict, InvalidJob, Unavailable
from tests.unit.fakeserver import closed_port_url


def job_view(**fields: Any) -> dict[str, Any]:
    """A job as GET /v1/jobs/{id} shows it (schedulerd/views.job), status fields included."""
    view = {"job_id": "j", "state": "scheduled", "schedule": {"every": "60s"}, "queue": "default",
            "payload": {"n": 1}, "max_attempts": 3, "priority": 0, "misfire_policy": "fire_once",
            "catchup_limit": 100, "starting_deadline_s": None, "overlap_policy": "allow",
            "backoff": {"base_ms": 1000, "factor": 2.0, "max_ms": 300000}, "timeout_s": 30, "jitter_s": 0.5,
            "history_limit": 100, "finished_ttl_s": 604800, "history_ttl_s": 604800, "keep_dead_letters": False,
            "target": None, "idempotency_key": None, "next_fire_time": "2026-12-07T03:00:00Z",
            "last_run": None, "last_success_time": None, "labels": {"team": "billing"}, "description": None,
            "max_runs": 10, "runs_remaining": 7, "created_at": "2026-12-07T02:00:00Z",
            "updated_at": "2026-12-07T02:00:00Z", "namespace": "default"}
    view.update(fields)
    return view


def file_job(paused: bool | None = None, **fields: Any) -> FileJob:
    return FileJob("j", {"job_id": "j", **fields}, paused)


TARGET = {"kind": "http", "url": "https://billing.example/close", "method": "POST",
          "headers": {"Authorization": "Bearer s3cret", "X-Team": "billing"}, "body": None, "timeout_s": None}


# -- reading files -------------------------------------------------------------------

def test_a_job_without_a_job_id_refuses_the_file_naming_it_and_the_index(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text("- job_id: a\n  schedule: {every: 1h}\n- schedule: {every: 2h}\n")
    with pytest.raises(click.BadParameter, match=r"jobs.yaml' jobs\[1\] has no job_id"):
        read_file_jobs(str(path))


@pytest.mark.parametrize("text, message", [
    ("- job_id: 7\n", r"jobs\[0\]: job_id must be a string"),
    ("- job_id: a\n  paused: maybe\n", r"jobs\[0\] \(job_id 'a'\): paused must be true or false"),
    ("- job_id: a\n- job_id: a\n", r"job_id 'a' is given twice: .*jobs\[0\] and .*jobs\[1\]"),
])
def test_file_level_problems_are_usage_errors(tmp_path: pathlib.Path, text: str, message: str) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(text)
    with pytest.raises(click.BadParameter, match=message):
        read_file_jobs(str(path))


def test_a_directory_is_its_job_files_by_name_and_paused_is_taken_out_of_the_fields(tmp_path: pathlib.Path) -> None:
    (tmp_path / "b.yml").write_text("- job_id: b\n  paused: true\n")
    (tmp_path / "a.json").write_text('{"jobs": [{"job_id": "a", "paused": false}]}')
    (tmp_path / "c.yaml").write_text("- job_id: c\n")
    (tmp_path / "README.md").write_text("not jobs")
    (tmp_path / "sub.yaml").mkdir()
    jobs = read_file_jobs(str(tmp_path))
    assert [(j.job_id, j.paused, j.fields) for j in jobs] == [
        ("a", False, {"job_id": "a"}), ("b", True, {"job_id": "b"}), ("c", None, {"job_id": "c"})]
    (tmp_path / "d.yaml").write_text("- job_id: a\n")
    with pytest.raises(click.BadParameter, match=r"'a' is given twice: .*a.json' jobs\[0\] and .*d.yaml' jobs\[0\]"):
        read_file_jobs(str(tmp_path))


def test_a_directory_without_job_files_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(click.BadParameter, match="holds no .yaml, .yml, .json file"):
        read_file_jobs(str(tmp_path))


# -- comparing as the server reads ---------------------------------------------------

@pytest.mark.parametrize("given, stored", [
    ({"every": "1m"}, {"every": "60s"}),
    ({"every": "1h30m"}, {"every": "90m"}),
    ({"cron": "0  2 * * *"}, {"cron": "0 2 * * *", "timezone": "UTC"}),
    ({"cron": "@daily", "timezone": "Europe/Berlin"}, {"cron": "0 0 * * *", "timezone": "Europe/Berlin"}),
    ({"at": "2027-01-01T01:00:00+01:00"}, {"at": "2027-01-01T00:00:00Z"}),
    ({"every": "1h", "start_at": "2027-01-01T00:00:00+00:00"}, {"every": "60m", "start_at": "2027-01-01T00:00:00Z"}),
])
def test_schedules_the_server_reads_alike_are_the_same(given: dict[str, Any], stored: dict[str, Any]) -> None:
    assert schedule_key(given) == schedule_key(stored)
    assert plan_job(file_job(schedule=given), job_view(schedule=stored)).actions == ()


@pytest.mark.parametrize("given, stored", [
    ({"every": "61s"}, {"every": "60s"}),
    ({"cron": "0 2 * * *", "timezone": "Europe/Berlin"}, {"cron": "0 2 * * *"}),
    ({"at": "2027-01-01T00:00:00+01:00"}, {"at": "2027-01-01T00:00:00Z"}),
    ({"every": "1h", "end_at": "2027-01-01T00:00:00Z"}, {"every": "1h"}),
    ({"every": "not a duration"}, {"every": "60s"}),
])
def test_schedules_that_differ_are_sent(given: dict[str, Any], stored: dict[str, Any]) -> None:
    plan = plan_job(file_job(schedule=given), job_view(schedule=stored))
    assert plan.patch == {"schedule": given}


def test_a_file_just_applied_shows_no_difference_whatever_its_number_spelling() -> None:
    given = {"timeout_s": 30.0, "jitter_s": 0.5, "max_attempts": 3.0, "max_runs": 10, "backoff": {"factor": 2},
             "payload": {"n": 1}, "labels": {"team": "billing"}, "starting_deadline_s": None, "description": None,
             "finished_ttl_s": 604800.0, "queue": "default", "keep_dead_letters": False}
    assert plan_job(file_job(**given), job_view()) == Plan("j", patch={})


@pytest.mark.parametrize("given, stored", [
    (0.000249, 0.000248),  # applied: the server kept int(0.000249 * 1e6) = 248 µs
    (0.000249, 0.000249),  # exported: the view's own text back
    (1e-7, 0),
])
def test_seconds_compare_to_the_microsecond_the_server_keeps(given: float, stored: float) -> None:
    assert plan_job(file_job(jitter_s=given), job_view(jitter_s=stored)).actions == ()


@pytest.mark.parametrize("given, stored", [(0.00025, 0.000249), (True, 1), (1, None), (None, 0)])
def test_seconds_a_microsecond_apart_or_of_another_kind_differ(given: Any, stored: Any) -> None:
    assert plan_job(file_job(timeout_s=given), job_view(timeout_s=stored)).patch == {"timeout_s": given}


def test_a_payload_compares_as_json_key_order_aside() -> None:
    stored = job_view(payload={"a": 1, "b": [1.0, True, None, "x"]})
    assert plan_job(file_job(payload={"b": [1.0, True, None, "x"], "a": 1}), stored).actions == ()
    # Each of these reaches a worker as other JSON text: a real difference.
    for other in ({"a": 1, "b": [1, True, None, "x"]}, {"a": 1, "b": [1.0, 1, None, "x"]}, {"a": True, "b": []}):
        assert plan_job(file_job(payload=other), stored).patch == {"payload": other}


def test_only_the_fields_that_differ_are_sent_and_a_backoff_only_in_the_parts_that_differ() -> None:
    plan = plan_job(file_job(queue="reports", priority=0, timeout_s=45, backoff={"factor": 3, "base_ms": 1000}),
                    job_view())
    assert plan.patch == {"queue": "reports", "timeout_s": 45, "backoff": {"factor": 3}}
    assert [(c.field, c.old, c.new) for c in plan.changes] == [
        ("queue", '"default"', '"reports"'), ("timeout_s", "30", "45"), ("backoff.factor", "2.0", "3")]


def test_bad_values_and_fields_no_patch_takes_are_sent_for_the_server_to_refuse() -> None:
    plan = plan_job(file_job(priority=True, timeout_s="30", state="paused", color="red"), job_view())
    assert plan.patch == {"priority": True, "timeout_s": "30", "state": "paused", "color": "red"}


def test_a_field_the_file_leaves_out_is_left_alone() -> None:
    assert plan_job(file_job(), job_view(queue="elsewhere", labels={"x": "y"})).actions == ()


# -- target headers and the placeholder ----------------------------------------------

def test_a_placeholder_keeps_the_header_value_and_is_never_sent() -> None:
    stored = job_view(target=TARGET)
    placeholders = {**TARGET, "headers": {"Authorization": PLACEHOLDER, "X-Team": "billing"}}
    assert plan_job(file_job(target=placeholders), stored).actions == ()
    # A short form of the same target: the server's defaults fill the rest.
    short = {"kind": "http", "url": TARGET["url"], "headers": {"Authorization": PLACEHOLDER, "X-Team": "billing"}}
    assert plan_job(file_job(target=short), stored).actions == ()
    moved = plan_job(file_job(target={**placeholders, "url": "https://billing.example/v2"}), stored)
    # Sent whole, with the job's own header values in place of the placeholder.
    assert moved.patch == {"target": {**TARGET, "url": "https://billing.example/v2"}}
    assert [(c.field, c.old, c.new) for c in moved.changes] == [
        ("target.url", '"https://billing.example/close"', '"https://billing.example/v2"')]


def test_a_changed_header_is_sent_but_never_printed() -> None:
    plan = plan_job(file_job(target={**TARGET, "headers": {"Authorization": "Bearer n3w"}}), job_view(target=TARGET))
    assert plan.patch == {"target": {**TARGET, "headers": {"Authorization": "Bearer n3w"}}}
    assert [(c.field, c.old, c.new) for c in plan.changes] == [
        ("target.headers.Authorization", PLACEHOLDER, "(a new value)"), ("target.headers.X-Team", PLACEHOLDER, "-")]
    text = "\n".join(outcome_lines(Outcome(plan), dry_run=True))
    assert "s3cret" not in text and "n3w" not in text


def test_a_placeholder_with_nothing_to_keep_is_refused() -> None:
    target = {**TARGET, "headers": {"Authorization": PLACEHOLDER}}
    for view in (None, job_view(), job_view(target={**TARGET, "headers": {}})):
        plan = plan_job(file_job(target=target), view)
        assert plan.actions == () and plan.problem is not None
        assert plan.problem[0] == "invalid_job" and "--include-secrets" in plan.problem[1]


def test_a_changed_target_is_refused_when_this_token_cannot_read_the_values_to_keep() -> None:
    redacted = job_view(target={**TARGET, "headers": {"Authorization": PLACEHOLDER}})
    given = {**TARGET, "url": "https://billing.example/v2", "headers": {"Authorization": PLACEHOLDER}}
    plan = plan_job(file_job(target=given), redacted)
    assert plan.actions == () and plan.problem is not None and plan.problem[0] == "forbidden"


def test_the_placeholder_is_what_a_read_only_caller_sees() -> None:
    assert PLACEHOLDER == views.REDACTED


# -- what apply cannot do, pause, prune ----------------------------------------------

def test_a_cancelled_job_is_an_error_that_names_the_purge() -> None:
    plan = plan_job(file_job(queue="default"), job_view(state="cancelled"))
    assert plan.actions == () and plan.problem is not None
    code, message = plan.problem
    assert code == "conflict" and "cancelled" in message and "schedctl cancel j --purge" in message


def test_an_idempotency_key_no_patch_can_change_is_an_error_with_the_way_out() -> None:
    plan = plan_job(file_job(idempotency_key="k2", queue="other"), job_view(idempotency_key="k1"))
    assert plan.actions == () and plan.problem is not None
    assert "idempotency_key differs" in plan.problem[1] and "--purge" in plan.problem[1]
    # The view shows a key as stored, behind its namespace's name.
    assert plan_job(file_job(idempotency_key="k"), job_view(idempotency_key="billing/k"), "billing").actions == ()
    assert plan_job(file_job(idempotency_key="k"), job_view(idempotency_key="k")).actions == ()


@pytest.mark.parametrize("paused, state, actions", [
    (True, "scheduled", ("pause",)), (True, "paused", ()), (False, "paused", ("resume",)),
    (False, "scheduled", ()), (None, "paused", ()), (None, "scheduled", ()),
])
def test_the_paused_key_pauses_or_resumes_and_leaving_it_out_leaves_the_job_be(
        paused: bool | None, state: str, actions: tuple[str, ...]) -> None:
    assert plan_job(file_job(paused=paused), job_view(state=state)).actions == actions


def test_a_new_job_is_created_then_paused_and_its_fields_go_as_written() -> None:
    plan = plan_job(file_job(paused=True, schedule={"every": "1h"}), None)
    assert plan.actions == ("create", "pause") and plan.create == {"job_id": "j", "schedule": {"every": "1h"}}


def test_a_prune_cancels_only_live_selected_jobs_no_file_names() -> None:
    selected = [job_view(job_id="kept"), job_view(job_id="gone"), job_view(job_id="resting", state="paused"),
                job_view(job_id="done", state="completed"), job_view(job_id="over", state="cancelled")]
    assert [p.job_id for p in plan_prune(selected, {"kept"})] == ["gone", "resting"]


# -- carrying out and printing -------------------------------------------------------

class RecordingClient:
    """Records the writes apply sends; `refuse` maps a verb to the error it raises."""

    def __init__(self, refuse: dict[str, Exception] | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.refuse = refuse or {}

    def _call(self, verb: str, *args: Any) -> dict[str, Any]:
        self.calls.append((verb, *map(str, args)))
        if verb in self.refuse:
            raise self.refuse[verb]
        return {}

    def create_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("create", spec["job_id"])

    def update_job(self, job_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        return self._call("update", job_id, sorted(changes))

    def pause_job(self, job_id: str) -> dict[str, Any]:
        return self._call("pause", job_id)

    def resume_job(self, job_id: str) -> dict[str, Any]:
        return self._call("resume", job_id)

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return self._call("cancel", job_id)


def test_carry_out_sends_the_plan_in_order_and_a_refusal_ends_only_that_job() -> None:
    client = RecordingClient()
    plan = plan_job(file_job(paused=False, queue="q"), job_view(state="paused"))
    assert carry_out(client, plan) == Outcome(plan, ("update", "resume"))  # type: ignore[arg-type]
    assert client.calls == [("update", "j", "['queue']"), ("resume", "j")]

    refusing = RecordingClient({"update": InvalidJob("priority must be an integer from 0 to 9")})
    outcome = carry_out(refusing, plan)  # type: ignore[arg-type]
    assert outcome.done == () and outcome.error == ("invalid_job", "priority must be an integer from 0 to 9")
    assert refusing.calls == [("update", "j", "['queue']")]  # no resume after the refused update

    with pytest.raises(Unavailable):
        carry_out(RecordingClient({"update": Unavailable()}), plan)  # type: ignore[arg-type]
    problem = plan_job(file_job(), job_view(state="cancelled"))
    assert carry_out(RecordingClient(), problem).error == problem.problem  # type: ignore[arg-type]


def test_lines_and_summary_say_what_was_done_and_a_dry_run_the_diff() -> None:
    update = plan_job(file_job(queue="q", paused=True), job_view())
    create = plan_job(file_job(schedule={"every": "1h"}), None)
    same = plan_job(file_job(), job_view())
    prune = Plan("old", prune=True)
    cancelled = plan_job(file_job(), job_view(state="cancelled"))
    failed = Outcome(cancelled, error=cancelled.problem)
    done = [Outcome(update, ("update", "pause")), Outcome(create, ("create",)), Outcome(same),
            Outcome(prune, ("cancel",)), Outcome(update, ("update",), ("conflict", "job 'j' is completed")), failed]
    assert [line for o in done for line in outcome_lines(o, dry_run=False)] == [
        "j: updated (queue), paused", "j: created", "j: unchanged",
        "old: cancelled (pruned: selected by -l, named in no file)", "j: updated (queue)"]
    assert summary_line(counts(done, False), False) == \
        "applied: 1 created, 2 updated, 1 unchanged, 1 paused, 1 pruned, 2 failed"
    planned = [Outcome(update), Outcome(create), Outcome(same), Outcome(prune), failed]
    assert [line for o in planned for line in outcome_lines(o, dry_run=True)] == [
        "j: would update, would pause", '    queue: "default" -> "q"', "j: would create", "j: unchanged",
        "old: would cancel (pruned: selected by -l, named in no file)"]
    assert summary_line(counts(planned, True), True) == \
        "dry run, nothing changed: 1 to create, 1 to update, 1 unchanged, 1 to pause, 1 to prune, 1 failed"


# -- export and the round trip -------------------------------------------------------

def test_export_writes_the_create_fields_and_paused_never_the_status() -> None:
    job = exported(job_view(state="paused", idempotency_key="k", target=TARGET), include_secrets=False)
    assert list(job)[:2] == ["job_id", "paused"] and job["paused"] is True
    for status in ("state", "next_fire_time", "last_run", "last_success_time", "runs_remaining", "created_at",
                   "updated_at", "namespace", "idempotency_key", "description"):
        assert status not in job
    assert job["target"]["headers"] == {"Authorization": PLACEHOLDER, "X-Team": PLACEHOLDER}
    assert exported(job_view(target=TARGET), include_secrets=True)["target"] == TARGET
    assert "paused" not in exported(job_view(), include_secrets=False)


TRICKY = {"yes": "yes", "on": "on", "null": "null", "date": "2027-01-01", "time": "2027-01-01T00:00:00Z",
          "sci": "1e3", "octal": "017", "float": 1.0, "big": 1e20, "tiny": 5e-324, "int": 12345678901234567890,
          "unicode": "über ✓", "long": "word " * 60, "lines": "a\nb\n", "colon": "a: b", "empty": "",
          "nested": [{"k": [None, True, False, -0.5]}], "1": "one"}


@pytest.mark.parametrize("fmt, name", [("yaml", "jobs.yaml"), ("json", "jobs.json")])
def test_an_export_applied_to_the_jobs_it_came_from_changes_nothing(tmp_path: pathlib.Path, fmt: str,
                                                                    name: str) -> None:
    stored = [job_view(job_id="a", payload=TRICKY, target=TARGET, description="what: it is", state="paused"),
              job_view(job_id="b", schedule={"cron": "0 2 * * *", "timezone": "Europe/Berlin"}, payload=None,
                       labels={}, max_runs=None, starting_deadline_s=3.5),
              job_view(job_id="c", schedule={"at": "2027-01-01T00:00:00Z"}, payload=[1, "2"])]
    path = tmp_path / name
    path.write_text(dump_jobs([exported(view, include_secrets=False) for view in stored], fmt))
    jobs = read_file_jobs(str(path))
    assert jobs[0].fields["payload"] == TRICKY and jobs[0].paused is True
    assert [plan_job(job, view).actions for job, view in zip(jobs, stored)] == [(), (), ()]
    with_secrets = tmp_path / f"secret.{fmt}"
    with_secrets.write_text(dump_jobs([exported(stored[0], include_secrets=True)], fmt))
    assert read_jobs(str(with_secrets))[0]["target"] == TARGET


def test_a_step_the_server_refuses_is_that_jobs_error_with_the_servers_message() -> None:
    plan = plan_job(file_job(paused=True), job_view(state="completed"))
    outcome = carry_out(RecordingClient({"pause": Conflict("job 'j' is completed")}), plan)  # type: ignore[arg-type]
    assert outcome.error == ("conflict", "job 'j' is completed")


# -- the commands' usage errors come before any request ------------------------------

@pytest.mark.parametrize("args, message", [
    (["apply", "-f", "{file}", "--prune"], "--prune needs -l SELECTOR"),
    (["apply", "-f", "{file}", "-l", "team=a"], "-l SELECTOR scopes --prune"),
    (["apply", "-f", "{file}", "--prune", "-l", "team in ("], "selector requirement 'team in ('"),
    (["apply", "-f", "{missing}"], "cannot read"),
    (["export", "-l", ""], "empty selector"),
    (["export", "-o", "{missing}/jobs.yaml"], "cannot write"),
])
def test_usage_errors_are_one_line_and_exit_2_before_any_request(tmp_path: pathlib.Path, args: list[str],
                                                                 message: str) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text("- job_id: a\n  schedule: {every: 1h}\n")
    filled = [a.format(file=path, missing=tmp_path / "none.yaml") for a in args]
    # Nothing listens there: a request would end in exit 1 (unavailable), not 2.
    result = CliRunner().invoke(schedctl, ["--server", closed_port_url(), "--timeout", "1", *filled])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: usage: ") and result.stderr.count("\n") == 1 and message in result.stderr
