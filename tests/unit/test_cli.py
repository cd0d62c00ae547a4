"""`schedctl` (cli/main.py) through click's CliRunner, against the fake cluster."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pytest
from click.testing import CliRunner, Result

from schedulerd.cli import worker_cmd
from schedulerd.cli.main import format_table, schedctl
from schedulerd.cli.worker_cmd import STDERR_TAIL_BYTES, STDOUT_TAIL_BYTES, CommandFailed, run_command
from schedulerd.sdk.worker import Task
from tests.integration.harness import wait_until
from tests.unit.fakeserver import FakeCluster, FakeServer, closed_port_url, fake_cluster


@pytest.fixture
def one() -> Iterator[tuple[FakeCluster, FakeServer]]:
    with fake_cluster(1) as (cluster, servers):
        yield cluster, servers[0]


def run(server: FakeServer, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(schedctl, ["--server", server.url, *args])
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


def assert_one_error_line(result: Result, expected: str) -> None:
    assert result.stderr == f"{expected}\n"
    assert result.stdout == ""


def created(cluster: FakeCluster) -> dict:
    [post] = cluster.requests("POST", "/v1/jobs")
    return post.body


# -- create -------------------------------------------------------------------------

def test_create_at_prints_the_job_as_fields(one):
    cluster, server = one
    result = run(server, "create", "--id", "j1", "--at", "2026-12-01T03:00:00+01:00")
    lines = result.stdout.splitlines()
    assert "job_id:         j1" in lines
    assert "next_fire_time: 2026-12-01T02:00:00Z" in lines
    # The local time was sent as UTC.
    assert created(cluster)["schedule"] == {"at": "2026-12-01T02:00:00Z"}


def test_create_cron_sends_the_zone_and_defaults_to_utc(one):
    cluster, server = one
    run(server, "create", "--id", "a", "--cron", "0 2 * * *", "--tz", "Europe/Berlin")
    run(server, "create", "--id", "b", "--cron", "0 2 * * *")
    assert cluster.jobs["a"]["schedule"] == {"cron": "0 2 * * *", "timezone": "Europe/Berlin"}
    assert cluster.jobs["b"]["schedule"] == {"cron": "0 2 * * *", "timezone": "UTC"}


def test_create_with_bounds_sends_them_in_utc_and_refuses_them_on_a_one_off(one):
    cluster, server = one
    run(server, "create", "--id", "q", "--every", "1h", "--start-at", "2027-01-01T09:00:00+01:00",
        "--end-at", "2027-03-31T00:00:00Z")
    assert cluster.jobs["q"]["schedule"] == {"every": "1h", "start_at": "2027-01-01T08:00:00Z",
                                             "end_at": "2027-03-31T00:00:00Z"}
    assert_one_error_line(run(server, "create", "--at", "2027-01-01T00:00:00Z", "--end-at", "2027-02-01T00:00:00Z",
                              code=2),
                          "error: usage: --start-at and --end-at bound a --cron or --every schedule, given with it")


def test_labels_and_a_description_are_sent_and_list_sends_the_selector(one):
    cluster, server = one
    run(server, "create", "--id", "l", "--every", "1h", "--label", "team=billing", "--label", "env=",
        "--description", "Nightly invoices")
    assert (cluster.jobs["l"]["labels"], cluster.jobs["l"]["description"]) == ({"team": "billing", "env": ""},
                                                                              "Nightly invoices")
    run(server, "list", "-l", "team=billing,env!=prod")
    assert cluster.requests("GET", "/v1/jobs")[-1].query == {"limit": "100", "selector": "team=billing,env!=prod"}
    assert_one_error_line(run(server, "create", "--every", "1h", "--label", "team", code=2),
                          "error: usage: Invalid value for '--label': 'team' is not KEY=VALUE")


def test_pause_resume_and_cancel_by_selector_print_what_changed(one):
    cluster, server = one
    for job_id in ("a", "b"):
        run(server, "create", "--id", job_id, "--every", "1h", "--label", "team=billing")
    assert run(server, "pause", "-l", "team=billing").stdout.strip() == \
        "pause -l team=billing: 2 jobs selected, 2 changed"
    assert cluster.requests("POST", "/v1/jobs:pause")[0].body == {"selector": "team=billing"}
    assert json.loads(run(server, "--json", "cancel", "-l", "team=billing").stdout)["changed"] == 2
    assert_one_error_line(run(server, "resume", "a", "-l", "team=billing", code=2),
                          "error: usage: give one JOB_ID or -l SELECTOR")
    assert_one_error_line(run(server, "cancel", "-l", "team=billing", "--purge", code=2),
                          "error: usage: --purge takes one JOB_ID")


def test_create_every_with_payload_from_a_file_and_all_options(one, tmp_path):
    cluster, server = one
    payload_file = tmp_path / "payload.json"
    payload_file.write_text('{"url": "https://example.org", "n": [1, 2]}')
    run(server, "--json", "create", "--every", "5m", "--queue", "mail", "--id", "j1",
        "--payload", f"@{payload_file}", "--max-attempts", "5", "--priority", "9")
    assert created(cluster) == {
        "schedule": {"every": "5m"}, "queue": "mail", "job_id": "j1",
        "payload": {"url": "https://example.org", "n": [1, 2]},
        "max_attempts": 5, "priority": 9}


def test_create_without_id_gets_a_generated_one(one):
    cluster, server = one
    result = run(server, "--json", "create", "--every", "1h", "--payload", '{"a": 1}')
    job = json.loads(result.stdout)
    assert list(cluster.jobs) == [job["job_id"]]
    assert job["payload"] == {"a": 1}


@pytest.mark.parametrize("flags, expected", [
    ([], "error: usage: give exactly one of --at, --cron, --every"),
    (["--at", "2026-12-01T02:00:00Z", "--every", "5s"],
     "error: usage: give exactly one of --at, --cron, --every (got --at and --every)"),
    (["--every", "5s", "--tz", "UTC"], "error: usage: --tz applies only to --cron"),
    (["--at", "2026-12-01T02:00:00"], "error: usage: Invalid value for '--at': time "
     "'2026-12-01T02:00:00' has no zone; add 'Z' or an offset like +01:00"),
    (["--every", "5s", "--priority", "10"],
     "error: usage: Invalid value for '--priority': 10 is not in the range 0<=x<=9."),
    (["--every", "5s", "--catchup-limit", "1001"],
     "error: usage: Invalid value for '--catchup-limit': 1001 is not in the range 1<=x<=1000."),
])
def test_bad_schedule_flags_fail_before_any_request(one, flags, expected):
    cluster, server = one
    assert_one_error_line(run(server, "create", *flags, code=2), expected)
    assert cluster.seen == []


def test_invalid_json_payload_fails_before_any_request(one):
    cluster, server = one
    result = run(server, "create", "--every", "5s", "--payload", "{nope", code=2)
    assert result.stderr.startswith("error: usage: Invalid value for '--payload': not valid JSON: ")
    assert result.stderr.count("\n") == 1
    assert cluster.seen == []


def test_unreadable_or_invalid_payload_file_fails_before_any_request(one, tmp_path):
    cluster, server = one
    missing = tmp_path / "missing.json"
    result = run(server, "create", "--every", "5s", "--payload", f"@{missing}", code=2)
    assert_one_error_line(result, "error: usage: Invalid value for '--payload': "
                          f"cannot read {str(missing)!r}: No such file or directory")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    result = run(server, "create", "--every", "5s", "--payload", f"@{broken}", code=2)
    assert result.stderr.startswith(
        f"error: usage: Invalid value for '--payload': {str(broken)!r} is not valid JSON: ")
    assert cluster.seen == []


# -- reading --------------------------------------------------------------------------

def test_get_prints_fields_and_json_prints_the_servers_document(one):
    cluster, server = one
    run(server, "create", "--id", "j1", "--every", "5s", "--payload", '{"k": "v"}')
    human = run(server, "get", "j1").stdout
    assert 'payload:        {"k":"v"}' in human.splitlines()
    assert json.loads(run(server, "--json", "get", "j1").stdout) == cluster.jobs["j1"]


def test_list_prints_an_aligned_table(one):
    _, server = one
    run(server, "create", "--id", "nightly-backup", "--cron", "0 2 * * *", "--tz", "Europe/Berlin")
    run(server, "create", "--id", "ping", "--every", "5s", "--queue", "q2")
    assert run(server, "list").stdout.splitlines() == [
        "JOB_ID          STATE      QUEUE    SCHEDULE                        NEXT_FIRE",
        "nightly-backup  scheduled  default  cron 0 2 * * * (Europe/Berlin)  2026-01-01T00:00:00Z",
        "ping            scheduled  q2       every 5s                        2026-01-01T00:00:00Z",
    ]
    assert run(server, "list", "--queue", "q2").stdout.count("\n") == 2


def test_list_limit_hints_at_more_and_all_follows_cursors(one):
    cluster, server = one
    for n in range(5):
        run(server, "create", "--id", f"j{n}", "--every", "5s")
    limited = run(server, "list", "--limit", "2")
    assert limited.stdout.count("\n") == 3
    assert limited.stderr == "(more jobs than --limit; not shown)\n"
    document = json.loads(run(server, "--json", "list", "--all", "--limit", "2").stdout)
    assert [job["job_id"] for job in document["jobs"]] == ["j0", "j1", "j2", "j3", "j4"]
    assert document["next_cursor"] is None
    assert len(cluster.requests("GET", "/v1/jobs")) == 1 + 3


def test_list_json_is_the_page_the_server_returned(one):
    cluster, server = one
    run(server, "create", "--id", "j1", "--every", "5s")
    document = json.loads(run(server, "--json", "list", "--state", "scheduled").stdout)
    assert document == {"jobs": [cluster.jobs["j1"]], "next_cursor": None}


def test_runs_prints_a_table(one):
    cluster, server = one
    run(server, "create", "--id", "j1", "--every", "5s")
    cluster.add_run("j1", state="succeeded", attempt=1, worker_id="w1",
                    finished_at="2026-01-01T00:00:01Z")
    assert run(server, "runs", "j1").stdout.splitlines() == [
        "RUN_ID  SCHEDULED             STATE      ATTEMPT  WORKER  FINISHED",
        "0-1-0   2026-01-01T00:00:00Z  succeeded  1        w1      2026-01-01T00:00:01Z",
    ]


def test_runs_by_state_across_jobs(one):
    cluster, server = one
    for job_id in ("j1", "j2"):
        run(server, "create", "--id", job_id, "--every", "5s")
        cluster.add_run(job_id, state="running", attempt=1, worker_id="w1")
    cluster.add_run("j2", state="queued")
    lines = run(server, "runs", "--state", "running").stdout.splitlines()
    assert len(lines) == 3 and all(" running " in line for line in lines[1:])
    assert cluster.requests("GET", "/v1/runs")[0].query == {"state": "running", "limit": "100"}
    assert_one_error_line(run(server, "runs", code=2), "error: usage: give a JOB_ID, or --state for runs across jobs")
    assert_one_error_line(run(server, "runs", "--state", "running", "-f", code=2),
                          "error: usage: --follow follows one job's runs: give its JOB_ID")


def test_cluster_prints_the_node_then_one_line_per_group_with_its_entry_version(one):
    _, server = one
    assert run(server, "cluster").stdout.splitlines() == [
        "node: 127.0.0.1:9080",
        "GROUP  LEADER          TERM  COMMIT  APPLIED  ENTRIES",
        "0      127.0.0.1:9080  3     120     120      v6",
        "1      127.0.0.1:9080  4     121     121      v6 (reads v7)",
    ]


def test_cancel_prints_the_cancelled_job(one):
    cluster, server = one
    run(server, "create", "--id", "j1", "--every", "5s")
    assert "state:          cancelled" in run(server, "cancel", "j1").stdout.splitlines()
    assert cluster.jobs["j1"]["state"] == "cancelled"


def test_format_table_shows_missing_values_as_dashes():
    assert format_table(("A", "BB"), [("xyz", None), ("", 1)]).splitlines() == [
        "A    BB", "xyz  -", "     1"]


# -- errors and server selection ---------------------------------------------------

def test_server_error_is_one_line_and_exit_1(one):
    _, server = one
    assert_one_error_line(run(server, "get", "x", code=1), "error: not_found: no job 'x'")


def test_conflict_is_one_line_and_exit_1(one):
    _, server = one
    run(server, "create", "--id", "j1", "--every", "5s")
    result = run(server, "create", "--id", "j1", "--every", "5s", code=1)
    assert_one_error_line(result, "error: conflict: job 'j1' exists")


def test_click_usage_errors_are_one_line_and_exit_2(one):
    _, server = one
    assert_one_error_line(run(server, "get", code=2), "error: usage: Missing argument 'JOB_ID'.")
    assert_one_error_line(run(server, "list", "--state", "odd", code=2),
                          "error: usage: Invalid value for '--state': 'odd' is not one of "
                          "'scheduled', 'paused', 'completed', 'cancelled'.")


def test_unreachable_servers_are_one_line_and_exit_1():
    url = closed_port_url()
    result = CliRunner().invoke(schedctl, ["--server", url, "--timeout", "0.2", "cluster"])
    assert result.exit_code == 1
    assert_one_error_line(
        result, f"error: unavailable: no server reachable: {url}: connection refused")


def test_server_list_fails_over_and_env_var_is_read(one):
    _, server = one
    env = {"SCHEDCTL_SERVER": f"{closed_port_url()},{server.url}"}
    result = CliRunner().invoke(schedctl, ["cluster"], env=env)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("node: 127.0.0.1:9080\n")


# -- create and update: scheduling options ---------------------------------------------

ALL_OPTION_FLAGS = ["--misfire", "skip", "--catchup-limit", "50", "--starting-deadline", "600",
                    "--overlap", "buffer_one", "--backoff-base-ms", "500", "--backoff-factor",
                    "3", "--backoff-max-ms", "60000", "--timeout-s", "120", "--jitter-s", "30",
                    "--history-limit", "20", "--finished-ttl-s", "3600", "--history-ttl-s", "86400",
                    "--keep-dead-letters"]
ALL_OPTION_FIELDS = {"misfire_policy": "skip", "catchup_limit": 50, "starting_deadline_s": 600,
                     "overlap_policy": "buffer_one",
                     "backoff": {"base_ms": 500, "factor": 3.0, "max_ms": 60000},
                     "timeout_s": 120, "jitter_s": 30, "history_limit": 20, "finished_ttl_s": 3600,
                     "history_ttl_s": 86400, "keep_dead_letters": True}


def test_create_sends_every_scheduling_option_and_the_idempotency_key(one):
    cluster, server = one
    run(server, "create", "--id", "j1", "--every", "1h", *ALL_OPTION_FLAGS,
        "--idempotency-key", "k-1")
    assert created(cluster) == {"schedule": {"every": "1h"}, "queue": "default", "job_id": "j1",
                                "idempotency_key": "k-1", **ALL_OPTION_FIELDS}
    assert cluster.requests("POST", "/v1/jobs")[0].headers["Idempotency-Key"] == "k-1"


def test_create_sends_only_the_backoff_parts_given(one):
    cluster, server = one
    run(server, "create", "--every", "1h", "--backoff-factor", "1.5")
    assert created(cluster)["backoff"] == {"factor": 1.5}
    assert "job_id" in created(cluster)  # no key: the client picks the id


def test_create_with_the_same_idempotency_key_twice_gets_one_job(one):
    cluster, server = one
    first = json.loads(run(server, "--json", "create", "--every", "1h",
                           "--idempotency-key", "k").stdout)
    second = json.loads(run(server, "--json", "create", "--every", "1h",
                            "--idempotency-key", "k").stdout)
    assert first == second
    assert list(cluster.jobs) == [first["job_id"]]


def test_update_sends_only_what_was_given(one):
    cluster, server = one
    run(server, "create", "--id", "j1", "--every", "5s")
    result = run(server, "update", "j1", "--priority", "5", "--backoff-max-ms", "1000")
    [patch] = cluster.requests("PATCH", "/v1/jobs/j1")
    assert patch.body == {"priority": 5, "backoff": {"max_ms": 1000}}
    assert "priority:       5" in result.stdout.splitlines()


def test_update_no_skip_calendar_sends_null(one):
    cluster, server = one
    run(server, "create", "--id", "j1", "--every", "5s")
    run(server, "update", "j1", "--no-skip-calendar")
    [patch] = cluster.requests("PATCH", "/v1/jobs/j1")
    assert patch.body == {"skip_calendar": None}


def test_update_with_every_option_and_a_new_schedule(one):
    cluster, server = one
    run(server, "create", "--id", "j1", "--every", "5s")
    run(server, "--json", "update", "j1", "--cron", "30 1 * * *", "--tz", "America/New_York",
        "--queue", "q2", "--payload", "null", *ALL_OPTION_FLAGS)
    [patch] = cluster.requests("PATCH", "/v1/jobs/j1")
    assert patch.body == {"schedule": {"cron": "30 1 * * *", "timezone": "America/New_York"},
                          "queue": "q2", "payload": None, **ALL_OPTION_FIELDS}
    assert cluster.jobs["j1"]["misfire_policy"] == "skip"


@pytest.mark.parametrize("flags, expected", [
    ([], "error: usage: nothing to update: give at least one option "
         "(see `schedctl update --help`)"),
    (["--cron", "* * * * *", "--every", "5s"],
     "error: usage: give exactly one of --at, --cron, --every (got --cron and --every)"),
    (["--tz", "Europe/Berlin"], "error: usage: --tz applies only to --cron"),
    (["--idempotency-key", "k"], "error: usage: No such option '--idempotency-key'."),
    (["--misfire", "sometimes"], "error: usage: Invalid value for '--misfire': 'sometimes' is "
                                 "not one of 'fire_all', 'fire_once', 'skip'."),
    (["--backoff-factor", "11"], "error: usage: Invalid value for '--backoff-factor': "
                                 "11.0 is not in the range 1<=x<=10."),
    (["--skip-calendar", "hol", "--no-skip-calendar"],
     "error: usage: --skip-calendar and --no-skip-calendar contradict each other: give one"),
])
def test_bad_update_flags_fail_before_any_request(one, flags, expected):
    cluster, server = one
    assert_one_error_line(run(server, "update", "j1", *flags, code=2), expected)
    assert cluster.seen == []


def test_update_of_an_unknown_job_is_one_line_and_exit_1(one):
    _, server = one
    assert_one_error_line(run(server, "update", "nope", "--priority", "1", code=1),
                          "error: not_found: no job 'nope'")


# -- pause, resume, trigger ----------------------------------------------------------------

def test_pause_resume_print_the_job(one):
    cluster, server = one
    run(server, "create", "--id", "j1", "--every", "5s")
    assert "state:          paused" in run(server, "pause", "j1").stdout.splitlines()
    assert cluster.jobs["j1"]["state"] == "paused"
    assert "state:          scheduled" in run(server, "resume", "j1").stdout.splitlines()


def test_resume_of_a_cancelled_job_is_a_conflict(one):
    _, server = one
    run(server, "create", "--id", "j1", "--every", "5s")
    run(server, "cancel", "j1")
    assert_one_error_line(run(server, "resume", "j1", code=1),
                          "error: conflict: job 'j1' is cancelled")


def test_trigger_prints_the_run_and_json_prints_the_document(one):
    cluster, server = one
    run(server, "create", "--id", "j1", "--every", "5s")
    lines = run(server, "trigger", "j1").stdout.splitlines()
    assert "run_id:         0-1-0" in lines
    assert "trigger:        true" in lines
    document = json.loads(run(server, "--json", "trigger", "j1").stdout)
    assert document == {"run": cluster.runs["0-2-0"]}


# -- dead letters --------------------------------------------------------------------------

def seed_dead_letters(cluster: FakeCluster, server: FakeServer) -> None:
    run(server, "create", "--id", "j1", "--every", "5s", "--queue", "mail")
    run(server, "create", "--id", "j2", "--every", "5s", "--queue", "sms")
    cluster.add_run("j1", state="dead_letter", attempt=3, reason="max_attempts",
                    error="CommandFailed: exit status 3: disk full\nTraceback (innermost last):")
    cluster.add_run("j2", state="dead_letter", attempt=1, reason="timeout")
    cluster.add_run("j2", state="succeeded", attempt=1)


def test_dead_letter_list_prints_a_table_with_the_first_error_line(one):
    cluster, server = one
    seed_dead_letters(cluster, server)
    assert run(server, "dead-letter", "list").stdout.splitlines() == [
        "RUN_ID  JOB_ID  QUEUE  SCHEDULED             ATTEMPT  REASON        ERROR",
        "0-1-0   j1      mail   2026-01-01T00:00:00Z  3        max_attempts  "
        "CommandFailed: exit status 3: disk full",
        "0-2-0   j2      sms    2026-01-01T00:00:00Z  1        timeout       -",
    ]


def test_dead_letter_list_filters_limits_and_prints_json(one):
    cluster, server = one
    seed_dead_letters(cluster, server)
    document = json.loads(run(server, "--json", "dead-letter", "list", "--queue", "sms").stdout)
    assert document == {"runs": [cluster.runs["0-2-0"]], "next_cursor": None}
    limited = run(server, "dead-letter", "list", "--limit", "1")
    assert limited.stdout.count("\n") == 2
    assert limited.stderr == "(more dead letters than --limit; not shown)\n"
    assert cluster.requests("GET", "/v1/dead-letter")[-1].query == {"limit": "1"}


def test_dead_letter_retry_prints_the_queued_run(one):
    cluster, server = one
    seed_dead_letters(cluster, server)
    assert "state:          queued" in run(server, "dead-letter", "retry", "0-1-0").stdout.splitlines()
    assert cluster.runs["0-1-0"]["state"] == "queued"
    assert_one_error_line(run(server, "dead-letter", "retry", "0-1-0", code=1),
                          "error: conflict: run '0-1-0' is queued, not dead_letter")


def test_dead_letter_usage_errors_are_one_line(one):
    _, server = one
    assert_one_error_line(run(server, "dead-letter", "retry", code=2),
                          "error: usage: Missing argument 'RUN_ID'.")
    assert_one_error_line(run(server, "dead-letter", "purge", code=2),
                          "error: usage: No such command 'purge'.")


# -- preview ---------------------------------------------------------------------------------

def test_preview_cron_with_a_zone_shows_utc_and_local_times(one):
    cluster, server = one
    result = run(server, "preview", "30 1 * * *", "--tz", "America/New_York", "-n", "2")
    assert result.stdout.splitlines() == [
        "FIRE_TIME             LOCAL (America/New_York)",
        "2026-01-01T00:01:00Z  2025-12-31T19:01:00-05:00",
        "2026-01-01T00:02:00Z  2025-12-31T19:02:00-05:00",
    ]
    assert cluster.requests("GET", "/v1/preview")[0].query == {
        "cron": "30 1 * * *", "timezone": "America/New_York", "n": "2"}


def test_preview_every_prints_utc_only_and_json_prints_the_document(one):
    cluster, server = one
    assert run(server, "preview", "--every", "90s", "-n", "1").stdout.splitlines() == [
        "FIRE_TIME", "2026-01-01T00:01:00Z"]
    assert json.loads(run(server, "--json", "preview", "* * * * *").stdout)["fire_times"][9] == \
        "2026-01-01T00:10:00Z"
    assert [s.query for s in cluster.requests("GET", "/v1/preview")] == [
        {"every": "90s", "n": "1"}, {"cron": "* * * * *", "n": "10"}]


def test_preview_from_an_instant_warns_on_stderr_and_previews_a_job(one):
    cluster, server = one
    result = run(server, "preview", "@daily", "--tz", "EST", "--from", "2027-03-13T00:00:00Z", "-n", "1")
    assert result.stdout.splitlines()[0].startswith("FIRE_TIME")
    assert result.stderr.splitlines() == ["warning: timezone 'EST' is a fixed offset"]
    assert cluster.requests("GET", "/v1/preview")[0].query == {
        "cron": "@daily", "timezone": "EST", "n": "1", "from": "2027-03-13T00:00:00Z"}
    run(server, "create", "--id", "nightly", "--cron", "0 2 * * *")
    assert run(server, "preview", "--job", "nightly", "-n", "2").stdout.splitlines() == [
        "job nightly (scheduled)",
        "SCHEDULED             STARTS                RUN_ID",
        "2026-01-01T00:01:00Z  2026-01-01T00:01:07Z",
        "2026-01-01T00:02:00Z  2026-01-01T00:02:07Z",
    ]
    assert_one_error_line(run(server, "preview", "--job", "nightly", "--every", "5s", code=2),
                          "error: usage: --job previews the job's own schedule: give no CRON, --every, --tz or --from")


@pytest.mark.parametrize("args, expected", [
    ([], 'error: usage: give exactly one of "CRON", --every DURATION or --job ID'),
    (["* * * * *", "--every", "5s"], 'error: usage: give exactly one of "CRON", --every DURATION or --job ID'),
    (["--every", "5s", "--tz", "UTC"], "error: usage: --tz applies only to CRON"),
    (["* * * * *", "-n", "0"], "error: usage: Invalid value for '-n': 0 is not in the range x>=1."),
])
def test_bad_preview_flags_fail_before_any_request(one, args, expected):
    cluster, server = one
    assert_one_error_line(run(server, "preview", *args, code=2), expected)
    assert cluster.seen == []


def test_preview_over_the_server_limit_is_one_line_and_exit_1(one):
    _, server = one
    assert_one_error_line(run(server, "preview", "--every", "1s", "-n", "101", code=1),
                          "error: limit_exceeded: n=101 is over preview_n_max (100)")


# -- worker: a command per task ------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
TASK = Task(run_id="0-7-0", job_id="j1", queue="q1",
            scheduled_time=datetime(2026, 3, 8, 7, 0, tzinfo=timezone.utc), attempt=2, fence=41,
            idempotency_key="j1:2026-03-08T07:00:00Z",
            lease_until=datetime(2026, 3, 8, 7, 0, 30, tzinfo=timezone.utc),
            payload={"x": [1, "ü"]})


def test_command_gets_the_payload_on_stdin_and_the_task_in_its_environment():
    result = run_command(["sh", "-c", 'cat; echo; env | grep ^SCHEDULERD_ | sort'], TASK)
    assert result == {"exit_code": 0, "stdout_tail": "\n".join([
        '{"x":[1,"\\u00fc"]}',  # ASCII JSON: safe whatever the command's locale
        "SCHEDULERD_ATTEMPT=2",
        "SCHEDULERD_FENCE=41",
        "SCHEDULERD_IDEMPOTENCY_KEY=j1:2026-03-08T07:00:00Z",
        "SCHEDULERD_JOB_ID=j1",
        "SCHEDULERD_QUEUE=q1",
        "SCHEDULERD_RUN_ID=0-7-0",
        "SCHEDULERD_SCHEDULED_TIME=2026-03-08T07:00:00Z",
        ""])}


def test_a_failing_command_raises_with_the_exit_status_and_the_tail_of_stderr():
    script = "cat > /dev/null; i=0; while [ $i -lt 500 ]; do echo line-$i >&2; i=$((i+1)); done; exit 3"
    with pytest.raises(CommandFailed) as caught:
        run_command(["sh", "-c", script], TASK)
    message = str(caught.value)
    assert message.startswith("exit status 3: ")
    assert message.endswith("line-498\nline-499\n")
    assert len(message.encode()) <= len("exit status 3: ") + STDERR_TAIL_BYTES


def test_outputs_are_kept_bounded_and_an_unread_payload_is_no_failure():
    big = Task(**{**TASK.__dict__, "payload": "p" * 1_000_000})  # more than a pipe buffer
    result = run_command(["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' a; echo end"], big)
    assert result["stdout_tail"] == "a" * (STDOUT_TAIL_BYTES - 4) + "end\n"


def test_a_killed_command_names_the_signal_and_a_silent_failure_has_no_colon():
    with pytest.raises(CommandFailed, match=r"^killed by signal SIGTERM$"):
        run_command(["sh", "-c", "kill -TERM $$"], TASK)
    with pytest.raises(CommandFailed, match=r"^exit status 1$"):
        run_command(["false"], TASK)


def test_a_command_past_the_jobs_timeout_is_stopped_and_fails():
    started = time.monotonic()
    with pytest.raises(CommandFailed, match=r"^timed out after 0.5s \(the job's timeout_s\), "
                                            r"killed by signal SIGTERM: started\n$"):
        run_command(["sh", "-c", "echo started >&2; exec sleep 60"], dataclasses.replace(TASK, timeout_s=0.5))
    assert time.monotonic() - started < 5


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace(monkeypatch):
    monkeypatch.setattr(worker_cmd, "KILL_GRACE_S", 0.5)
    with pytest.raises(CommandFailed, match=r"^timed out after 0.5s \(the job's timeout_s\), "
                                            r"killed by signal SIGKILL$"):
        run_command(["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"],
                    dataclasses.replace(TASK, timeout_s=0.5))


def _alive(pid: int) -> bool:
    """In the process table and not a zombie (an orphan waits there for its reaper)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _child_pid(path: Path) -> int:
    wait_until(lambda: path.exists() and path.read_text().endswith("\n"), 5, "the command's child")
    return int(path.read_text())


def _gone(pid: int) -> bool:
    wait_until(lambda: not _alive(pid), 5, f"process {pid} to end")
    return True


def test_a_command_whose_lease_is_lost_is_stopped_with_the_processes_it_started(tmp_path):
    commands = worker_cmd.Commands(["sh", "-c", f"sleep 60 & echo $! > {tmp_path}/child; wait"])
    outcome: list[BaseException] = []
    thread = threading.Thread(target=lambda: outcome.extend(_raised(commands.run, TASK)))
    thread.start()
    child = _child_pid(tmp_path / "child")
    commands.lease_lost(dataclasses.replace(TASK, fence=TASK.fence + 1))  # another lease of the run: not this one
    assert _alive(child)
    commands.lease_lost(TASK)
    thread.join(10)
    assert not thread.is_alive()
    assert [type(e) for e in outcome] == [CommandFailed]
    assert str(outcome[0]) == "lease lost, killed by signal SIGTERM"
    assert _gone(child), "the command's child outlived the stop"


def test_a_timed_out_command_goes_with_the_processes_it_started(tmp_path):
    script = f"sleep 60 & echo $! > {tmp_path}/child; wait"
    with pytest.raises(CommandFailed, match=r"^timed out after 0.5s"):
        run_command(["sh", "-c", script], dataclasses.replace(TASK, timeout_s=0.5))
    assert _gone(_child_pid(tmp_path / "child"))


def test_kill_all_ends_every_running_command(tmp_path):
    commands = worker_cmd.Commands(["sh", "-c", f"echo $$ > {tmp_path}/$SCHEDULERD_RUN_ID; exec sleep 60"])
    outcomes: list[BaseException] = []
    tasks = [dataclasses.replace(TASK, run_id=f"0-7-{i}") for i in range(2)]
    threads = [threading.Thread(target=lambda t=t: outcomes.extend(_raised(commands.run, t))) for t in tasks]
    for thread in threads:
        thread.start()
    for task in tasks:
        _child_pid(tmp_path / task.run_id)
    commands.kill_all()
    for thread in threads:
        thread.join(10)
    assert sorted(str(e) for e in outcomes) == ["killed by signal SIGKILL"] * 2


def _raised(call, *args) -> list[BaseException]:
    try:
        call(*args)
    except BaseException as exc:
        return [exc]
    return []


@pytest.mark.parametrize("args, expected", [
    (["--queue", "q1"], "error: usage: Missing argument 'COMMAND...'."),
    (["--", "true"], "error: usage: Missing option '--queue'."),
    (["--queue", "q1", "--", "no-such-command-here"],
     "error: usage: Invalid value for 'COMMAND': 'no-such-command-here' is not an "
     "executable file or on PATH"),
])
def test_worker_usage_errors_are_one_line_and_exit_2(one, args, expected):
    cluster, server = one
    assert_one_error_line(run(server, "worker", *args, code=2), expected)
    assert cluster.seen == []


def start_worker(server: FakeServer, *args: str) -> subprocess.Popen:
    """`schedctl worker` as a real process (it installs signal handlers, as in use)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "schedulerd.cli.main", "--server", server.url, "worker",
                             *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(cluster: FakeCluster, run_id: str, state: str, proc: subprocess.Popen) -> dict:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        with cluster.lock:
            if cluster.runs[run_id]["state"] == state:
                return dict(cluster.runs[run_id])
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"run {run_id} never got to {state}: {proc.communicate()}")


def stop(proc: subprocess.Popen) -> str:
    """SIGTERM, as a service manager would: the worker drains and exits 0; its log."""
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr
    return stderr


def test_worker_end_to_end_acks_on_exit_0_for_every_queue(one):
    cluster, server = one
    run(server, "create", "--id", "j1", "--every", "1h", "--queue", "q1", "--payload", '{"n": 1}')
    run(server, "create", "--id", "j2", "--every", "1h", "--queue", "q2")
    first, second = cluster.add_run("j1"), cluster.add_run("j2")
    proc = start_worker(server, "--queue", "q1", "--queue", "q2", "--concurrency", "2",
                        "--worker-id", "w-test", "--",
                        "sh", "-c", 'cat; echo " $SCHEDULERD_RUN_ID $SCHEDULERD_FENCE"')
    done = wait_for(cluster, first["run_id"], "succeeded", proc)
    assert done["result"] == {"exit_code": 0, "stdout_tail": '{"n":1} 0-1-0 1\n'}
    assert done["worker_id"] == "w-test"
    done = wait_for(cluster, second["run_id"], "succeeded", proc)
    assert done["result"] == {"exit_code": 0, "stdout_tail": "null 0-2-0 1\n"}
    assert "task_acked run_id=0-1-0" in stop(proc)


def test_worker_lets_commands_finish_on_one_sigint_and_kills_them_on_a_second(one, tmp_path):
    cluster, server = one
    run(server, "create", "--id", "j1", "--every", "1h", "--queue", "q1")
    cluster.add_run("j1")
    proc = start_worker(server, "--queue", "q1", "--", "sh", "-c", f"echo $$ > {tmp_path}/pid; exec sleep 60")
    command = _child_pid(tmp_path / "pid")
    proc.send_signal(signal.SIGINT)
    wait_until(lambda: "worker_stopping" in _read_some(proc), 10, "the drain to start")
    assert _alive(command) and proc.poll() is None, "one SIGINT lets the running command finish"
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=20)
    assert _gone(command)


def _read_some(proc: subprocess.Popen) -> str:
    """What the process has written to stderr so far, without waiting for its end."""
    os.set_blocking(proc.stderr.fileno(), False)
    chunk = proc.stderr.read() or ""
    proc.seen = getattr(proc, "seen", "") + chunk
    return proc.seen


def test_worker_end_to_end_nacks_on_a_non_zero_exit(one):
    cluster, server = one
    run(server, "create", "--id", "j1", "--every", "1h", "--queue", "q1")
    failing = cluster.add_run("j1")
    proc = start_worker(server, "--queue", "q1", "--",
                        "sh", "-c", "cat > /dev/null; echo disk full >&2; exit 3")
    done = wait_for(cluster, failing["run_id"], "retry_wait", proc)
    assert done["error"].startswith("CommandFailed: exit status 3: disk full\n")
    assert "task_nacked run_id=0-1-0" in stop(proc)
