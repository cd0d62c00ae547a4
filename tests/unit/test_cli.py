"""`schedctl` (cli/main.py) through click's CliRunner, against the fake cluster."""
from __future__ import annotations

import json
from typing import Iterator

import pytest
from click.testing import CliRunner, Result

from cli.main import format_table, schedctl
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


def test_cluster_prints_the_node_then_one_line_per_group(one):
    _, server = one
    assert run(server, "cluster").stdout.splitlines() == [
        "node: 127.0.0.1:9080",
        "GROUP  LEADER          TERM  COMMIT  APPLIED",
        "0      127.0.0.1:9080  3     120     120",
        "1      127.0.0.1:9080  4     121     121",
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
