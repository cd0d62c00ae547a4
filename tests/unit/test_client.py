"""schedulerd.sdk.client against the in-memory fake cluster (tests/unit/fakeserver.py).

A test that needs an answer inside a deadline gives it seconds, not tenths. The fake
server's threads share a loaded 2-core box with the rest of the suite. With deadlines of
0.3 s and 1 s (half of it per attempt), one of these tests failed once in a full run."""
from __future__ import annotations

import time
from typing import Iterator

import pytest

from schedulerd.sdk import client as client_module
from schedulerd.sdk.client import Client
from schedulerd.errors import (
    Conflict,
    LimitExceeded,
    NotFound,
    OutcomeUnknown,
    SchedulerError,
    StaleFence,
    Unavailable,
)
from tests.unit.fakeserver import (
    DROP,
    HANG,
    HTML_500,
    OUTCOME_UNKNOWN,
    UNAVAILABLE,
    FakeCluster,
    FakeServer,
    closed_port_url,
    fake_cluster,
)

AT = {"at": "2026-12-01T02:00:00Z"}


@pytest.fixture
def one() -> Iterator[tuple[FakeCluster, FakeServer]]:
    with fake_cluster(1) as (cluster, servers):
        yield cluster, servers[0]


@pytest.fixture
def two() -> Iterator[tuple[FakeCluster, list[FakeServer]]]:
    with fake_cluster(2) as (cluster, servers):
        yield cluster, servers


# -- failover and retry ------------------------------------------------------

def test_fails_over_from_a_closed_port_to_a_working_server(one):
    cluster, server = one
    client = Client([closed_port_url(), server.url], timeout_s=2.0)
    job = client.create_job({"job_id": "j1", "schedule": AT})
    assert job["job_id"] == "j1"
    assert client.get_job("j1") == job


def test_accepts_a_comma_separated_server_string(one):
    _, server = one
    client = Client(f" {closed_port_url()} , {server.url}/ ")
    assert client.health() == {"ok": True}


def test_starts_with_the_server_that_answered_last(two):
    cluster, (first, second) = two
    cluster.fail_next("GET", "/healthz", UNAVAILABLE, port=first.port)
    client = Client([first.url, second.url], timeout_s=2.0)
    client.health()
    client.health()
    assert len(cluster.requests("GET", "/healthz")) == 3
    assert [s.port for s in cluster.requests("GET", "/healthz")] == [
        first.port, second.port, second.port]


def test_retries_a_503_on_the_same_server_after_backing_off(one):
    cluster, server = one
    Client(server.url).create_job({"job_id": "j1", "schedule": AT})
    cluster.fail_next("GET", "/v1/jobs/j1", UNAVAILABLE, times=2)
    assert Client(server.url, timeout_s=2.0).get_job("j1")["job_id"] == "j1"
    assert len(cluster.requests("GET", "/v1/jobs/j1")) == 3


def test_a_503_until_the_deadline_raises_unavailable(one):
    cluster, server = one
    cluster.fail_next("GET", "/healthz", UNAVAILABLE, times=1000)
    started = time.monotonic()
    with pytest.raises(Unavailable, match="no leader"):
        Client(server.url, timeout_s=0.3).health()
    assert time.monotonic() - started < 1.0


class _OversleepingTime:
    """The client's clock, with a sleep that overshoots as on a loaded box."""
    monotonic = staticmethod(time.monotonic)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds + 0.4)


def test_a_pause_that_oversleeps_the_deadline_gives_up_as_unavailable(one, monkeypatch: pytest.MonkeyPatch) -> None:
    """No attempt is made with no time left (a socket refuses a timeout of 0 or less)."""
    cluster, server = one
    cluster.fail_next("GET", "/healthz", UNAVAILABLE, times=1000)
    monkeypatch.setattr(client_module, "time", _OversleepingTime)
    with pytest.raises(Unavailable, match="no leader"):
        Client(server.url, timeout_s=0.3).health()


def test_no_reachable_server_names_every_url():
    urls = [closed_port_url(), closed_port_url()]
    started = time.monotonic()
    with pytest.raises(Unavailable) as caught:
        Client(urls, timeout_s=0.3).health()
    assert time.monotonic() - started < 1.0
    assert caught.value.message.startswith("no server reachable: ")
    for url in urls:
        assert f"{url}: connection refused" in caught.value.message


def test_a_cluster_without_quorum_is_told_apart_from_one_that_is_down(one):
    """Two of three nodes down: the one left answers 503 (no leader); the error says it
    answered and what, beside the refused connections."""
    cluster, server = one
    cluster.fail_next("POST", "/v1/jobs", UNAVAILABLE, times=1000)
    down = [closed_port_url(), closed_port_url()]
    with pytest.raises(Unavailable) as caught:
        Client([server.url, *down], timeout_s=0.3).create_job({"job_id": "j1", "schedule": AT})
    message = caught.value.message
    assert message.startswith("the cluster could not serve this: 1 of the 3 servers tried answered")
    assert f"{server.url}: answered 503: no leader for group 0" in message
    for url in down:
        assert f"{url}: connection refused" in message


def test_a_failing_server_sends_the_client_to_the_nodes_the_cluster_lists(two):
    cluster, (a, b) = two
    cluster.nodes = [{"node_id": "a", "http": a.url.removeprefix("http://"), "state": "alive"},
                     {"node_id": "b", "http": b.url.removeprefix("http://"), "state": "alive"},
                     {"node_id": "c", "http": "127.0.0.1:1", "state": "removed"}]
    client = Client(a.url, timeout_s=5.0)
    client.create_job({"job_id": "j1", "schedule": AT})
    cluster.fail_next("GET", "/v1/jobs/j1", UNAVAILABLE, port=a.port, times=100)
    assert client.get_job("j1")["job_id"] == "j1"
    assert [s.port for s in cluster.requests("GET", "/v1/jobs/j1")] == [a.port, b.port]
    assert [s.url for s in client._servers] == [a.url, b.url]  # the removed node is not tried
    client.get_job("j1")  # the node that answered last is asked first
    assert [s.port for s in cluster.requests("GET", "/v1/jobs/j1")] == [a.port, b.port, b.port]


def test_a_silent_server_times_out_and_the_next_one_answers(two):
    cluster, (silent, good) = two
    cluster.fail_next("GET", "/healthz", HANG, port=silent.port)
    started = time.monotonic()
    assert Client([silent.url, good.url], timeout_s=3.0).health() == {"ok": True}
    # The silent server got half the deadline, not all of it.
    assert time.monotonic() - started < 2.9


# -- errors ---------------------------------------------------------------------

def test_404_raises_not_found_with_the_servers_message(one):
    _, server = one
    with pytest.raises(NotFound, match=r"^no job 'nope'$"):
        Client(server.url).get_job("nope")


def test_a_non_json_500_raises_scheduler_error_without_retrying(one):
    cluster, server = one
    cluster.fail_next("GET", "/healthz", HTML_500)
    with pytest.raises(SchedulerError, match=r"^HTTP 500: <html>") as caught:
        Client(server.url).health()
    assert type(caught.value) is SchedulerError
    assert len(cluster.requests("GET", "/healthz")) == 1


def test_path_parts_are_url_quoted(one):
    cluster, server = one
    with pytest.raises(NotFound, match=r"no job 'a/b\?c'"):
        Client(server.url).get_job("a/b?c")
    assert cluster.requests("GET", "/v1/jobs/a%2Fb%3Fc")


def test_bad_server_urls_are_refused_up_front():
    with pytest.raises(ValueError, match="bad server URL"):
        Client("ftp://example.org")
    with pytest.raises(ValueError, match="no server URL"):
        Client(" , ")


# -- create is safe to retry -------------------------------------------------

def test_create_retried_after_a_dropped_connection_returns_the_first_attempts_job(one):
    cluster, server = one
    cluster.fail_next("POST", "/v1/jobs", DROP)
    job = Client(server.url, timeout_s=2.0).create_job({"schedule": AT, "payload": {"n": 1}})
    posts = cluster.requests("POST", "/v1/jobs")
    assert len(posts) == 2
    # The id was chosen before the first attempt, and both attempts carried it.
    assert posts[0].body["job_id"] == posts[1].body["job_id"] == job["job_id"]
    assert list(cluster.jobs) == [job["job_id"]]
    assert job["payload"] == {"n": 1}
    assert cluster.requests("GET", f"/v1/jobs/{job['job_id']}")


def test_create_retried_after_a_timeout_returns_the_job_from_another_server(two):
    cluster, (silent, good) = two
    cluster.fail_next("POST", "/v1/jobs", HANG, port=silent.port)
    job = Client([silent.url, good.url], timeout_s=3.0).create_job(
        {"job_id": "j1", "schedule": AT})
    assert job["job_id"] == "j1"
    assert [s.port for s in cluster.requests("POST", "/v1/jobs")] == [silent.port, good.port]


def test_create_conflict_after_a_refused_connection_is_a_real_conflict(one):
    cluster, server = one
    Client(server.url).create_job({"job_id": "taken", "schedule": AT})
    # A refused connection never reached a server, so the 409 is someone else's job.
    with pytest.raises(Conflict, match="exists"):
        Client([closed_port_url(), server.url]).create_job({"job_id": "taken", "schedule": AT})


def test_create_that_never_gets_an_answer_says_which_job_id_to_retry(one):
    cluster, server = one
    cluster.fail_next("POST", "/v1/jobs", OUTCOME_UNKNOWN, times=1000)
    with pytest.raises(OutcomeUnknown) as caught:
        Client(server.url, timeout_s=1.0).create_job({"schedule": AT})
    [job_id] = cluster.jobs
    assert f"job {job_id!r} may have been created" in caught.value.message


def test_create_does_not_change_the_callers_spec(one):
    _, server = one
    spec = {"schedule": AT}
    Client(server.url).create_job(spec)
    assert spec == {"schedule": AT}


# -- jobs, runs, cluster ------------------------------------------------------

def test_list_pages_and_iter_jobs_follows_cursors(one):
    _, server = one
    client = Client(server.url)
    for name in ("e", "c", "a", "d", "b"):
        client.create_job({"job_id": name, "schedule": AT, "queue": "q" if name < "c" else "r"})
    page = client.list_jobs(limit=2)
    assert [job["job_id"] for job in page["jobs"]] == ["a", "b"]
    assert page["next_cursor"] == "b"
    assert [job["job_id"] for job in client.iter_jobs(page_size=2)] == ["a", "b", "c", "d", "e"]
    assert [job["job_id"] for job in client.iter_jobs(queue="q")] == ["a", "b"]


def test_cancel_runs_and_get_run(one):
    cluster, server = one
    client = Client(server.url)
    client.create_job({"job_id": "j1", "schedule": AT})
    run = cluster.add_run("j1")
    assert client.job_runs("j1") == {"runs": [run], "next_cursor": None}
    assert client.get_run(run["run_id"]) == run
    assert client.cancel_job("j1")["state"] == "cancelled"
    with pytest.raises(NotFound):
        client.get_run("0-999-0")


def test_cluster_and_health(one):
    _, server = one
    client = Client(server.url)
    assert client.cluster()["node"] == "127.0.0.1:9080"
    assert client.health() == {"ok": True}


def test_token_is_sent_as_a_bearer_header(one):
    cluster, server = one
    Client(server.url, token="s3cret").health()
    assert cluster.requests("GET", "/healthz")[0].headers["Authorization"] == "Bearer s3cret"


# -- worker calls -----------------------------------------------------------------

def test_poll_heartbeat_ack_and_stale_fence(one):
    cluster, server = one
    client = Client(server.url)
    client.create_job({"job_id": "j1", "schedule": AT, "payload": {"x": 1}})
    run = cluster.add_run("j1")
    [task] = client.poll("w1", "default", max_tasks=5)["tasks"]
    assert (task["run_id"], task["fence"], task["payload"]) == (run["run_id"], 1, {"x": 1})
    assert task["idempotency_key"] == f"j1:{run['scheduled_time']}"
    assert client.heartbeat(task["run_id"], "w1", task["fence"])["lease_until"]
    with pytest.raises(StaleFence):
        client.ack(task["run_id"], "w1", task["fence"] + 1)
    done = client.ack(task["run_id"], "w1", task["fence"], result={"ok": 1})["run"]
    assert (done["state"], done["result"]) == ("succeeded", {"ok": 1})


def test_nack_records_the_error(one):
    cluster, server = one
    client = Client(server.url)
    client.create_job({"job_id": "j1", "schedule": AT})
    cluster.add_run("j1")
    [task] = client.poll("w1", ["default"])["tasks"]
    run = client.nack(task["run_id"], "w1", task["fence"], "boom")["run"]
    assert (run["state"], run["error"]) == ("retry_wait", "boom")


def test_a_long_poll_may_outlast_the_request_timeout(one):
    _, server = one
    # The fake holds an empty poll for wait_s; 0.3 s is more than the 0.1 s
    # a plain request gets from a 0.2 s timeout, so only wait_s + margin passes.
    assert Client(server.url, timeout_s=0.2).poll("w1", ["default"], wait_s=0.3) == {"tasks": []}


# -- job changes: update, pause, resume, trigger ---------------------------------------

def test_update_job_patches_only_the_given_fields(one):
    cluster, server = one
    client = Client(server.url)
    client.create_job({"job_id": "j1", "schedule": AT, "priority": 1})
    changes = {"priority": 5, "backoff": {"max_ms": 1000}}
    job = client.update_job("j1", changes)
    [patch] = cluster.requests("PATCH", "/v1/jobs/j1")
    assert patch.body == changes
    assert (job["priority"], job["backoff"], job["queue"]) == (5, {"max_ms": 1000}, "default")


def test_update_of_a_missing_or_cancelled_job_raises_the_typed_error(one):
    _, server = one
    client = Client(server.url)
    with pytest.raises(NotFound, match="no job 'nope'"):
        client.update_job("nope", {"priority": 1})
    client.create_job({"job_id": "j1", "schedule": AT})
    client.cancel_job("j1")
    with pytest.raises(Conflict, match="cancelled"):
        client.update_job("j1", {"priority": 1})


def test_pause_and_resume_are_posts_that_return_the_job(one):
    cluster, server = one
    client = Client(server.url)
    client.create_job({"job_id": "j1", "schedule": AT})
    assert client.pause_job("j1")["state"] == "paused"
    assert client.pause_job("j1")["state"] == "paused"  # idempotent on the server
    assert client.resume_job("j1")["state"] == "scheduled"
    assert [s.path for s in cluster.seen if s.method == "POST"][1:] == [
        "/v1/jobs/j1/pause", "/v1/jobs/j1/pause", "/v1/jobs/j1/resume"]
    with pytest.raises(NotFound):
        client.pause_job("a/b")
    assert cluster.seen[-1].path == "/v1/jobs/a%2Fb/pause"


def test_trigger_returns_the_new_run(one):
    cluster, server = one
    client = Client(server.url)
    client.create_job({"job_id": "j1", "schedule": AT})
    document = client.trigger_job("j1")
    assert list(document) == ["run"]
    assert document["run"] == cluster.runs[document["run"]["run_id"]]
    assert document["run"]["trigger"] is True


def test_trigger_is_retried_when_nothing_was_applied(one):
    cluster, server = one
    client = Client(server.url, timeout_s=2.0)
    client.create_job({"job_id": "j1", "schedule": AT})
    cluster.fail_next("POST", "/v1/jobs/j1/trigger", UNAVAILABLE)
    client.trigger_job("j1")
    assert len(cluster.requests("POST", "/v1/jobs/j1/trigger")) == 2
    assert len(cluster.runs) == 1


@pytest.mark.parametrize("fault", [DROP, OUTCOME_UNKNOWN])
def test_trigger_is_not_resent_after_an_attempt_that_may_have_landed(one, fault):
    cluster, server = one
    client = Client(server.url, timeout_s=2.0)
    client.create_job({"job_id": "j1", "schedule": AT})
    cluster.fail_next("POST", "/v1/jobs/j1/trigger", fault)
    with pytest.raises(OutcomeUnknown, match="job 'j1' may have been triggered"):
        client.trigger_job("j1")
    # One request, one run: a resend would have made a second extra run.
    assert len(cluster.requests("POST", "/v1/jobs/j1/trigger")) == 1
    assert len(cluster.runs) == 1


# -- idempotent create -------------------------------------------------------------------

def test_idempotency_key_goes_in_the_header_and_stays_in_the_body(one):
    cluster, server = one
    client = Client(server.url)
    spec = {"schedule": AT, "idempotency_key": "nightly-2026-12-01"}
    job = client.create_job(spec)
    [post] = cluster.requests("POST", "/v1/jobs")
    assert post.headers["Idempotency-Key"] == "nightly-2026-12-01"
    assert post.body == spec  # no job_id generated: the server dedupes by key
    # A second call, as from a re-run script, gets the same job back.
    assert client.create_job(spec) == job
    assert list(cluster.jobs) == [job["job_id"]]


def test_create_without_a_key_sends_no_idempotency_header(one):
    cluster, server = one
    Client(server.url).create_job({"schedule": AT})
    assert "Idempotency-Key" not in cluster.requests("POST", "/v1/jobs")[0].headers


def test_create_with_a_key_after_a_dropped_connection_returns_the_first_job(one):
    cluster, server = one
    cluster.fail_next("POST", "/v1/jobs", DROP)
    job = Client(server.url, timeout_s=2.0).create_job({"schedule": AT, "idempotency_key": "k"})
    assert len(cluster.requests("POST", "/v1/jobs")) == 2
    assert list(cluster.jobs) == [job["job_id"]]


def test_create_with_a_reused_key_and_another_body_is_a_conflict(one):
    _, server = one
    client = Client(server.url)
    client.create_job({"schedule": AT, "idempotency_key": "k"})
    with pytest.raises(Conflict, match="idempotency key 'k'"):
        client.create_job({"schedule": AT, "idempotency_key": "k", "priority": 3})


def test_create_with_a_key_that_never_gets_an_answer_says_to_retry_with_the_key(one):
    cluster, server = one
    cluster.fail_next("POST", "/v1/jobs", OUTCOME_UNKNOWN, times=1000)
    with pytest.raises(OutcomeUnknown, match="idempotency_key 'k' may have been created"):
        Client(server.url, timeout_s=1.0).create_job({"schedule": AT, "idempotency_key": "k"})


# -- dead letters and preview --------------------------------------------------------------

def test_dead_letters_filter_page_and_retry(one):
    cluster, server = one
    client = Client(server.url)
    client.create_job({"job_id": "j1", "schedule": AT, "queue": "q1"})
    client.create_job({"job_id": "j2", "schedule": AT, "queue": "q2"})
    first = cluster.add_run("j1", state="dead_letter", reason="max_attempts", error="boom")
    cluster.add_run("j1", state="succeeded")
    third = cluster.add_run("j2", state="dead_letter", reason="timeout")
    page = client.dead_letters(limit=1)
    assert (page["runs"], page["next_cursor"]) == ([first], first["run_id"])
    assert client.dead_letters(cursor=page["next_cursor"])["runs"] == [third]
    assert client.dead_letters(queue="q2")["runs"] == [third]
    assert cluster.requests("GET", "/v1/dead-letter")[-1].query == {"queue": "q2", "limit": "100"}
    assert client.retry_run(first["run_id"])["run"]["state"] == "queued"
    with pytest.raises(Conflict, match="not dead_letter"):
        client.retry_run(first["run_id"])


def test_retry_run_after_a_dropped_connection_returns_the_run(one):
    cluster, server = one
    client = Client(server.url, timeout_s=2.0)
    client.create_job({"job_id": "j1", "schedule": AT})
    run = cluster.add_run("j1", state="dead_letter")
    cluster.fail_next("POST", f"/v1/runs/{run['run_id']}/retry", DROP)
    # The first attempt re-drove it; the second gets 409, the client fetches the run.
    assert client.retry_run(run["run_id"])["run"]["state"] == "queued"


def test_preview_sends_only_the_given_parameters(one):
    cluster, server = one
    client = Client(server.url)
    document = client.preview(cron="30 1 * * *", timezone="America/New_York", n=3)
    assert document == {"fire_times": ["2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z",
                                       "2026-01-01T00:03:00Z"]}
    client.preview(every="90s")
    assert [s.query for s in cluster.requests("GET", "/v1/preview")] == [
        {"cron": "30 1 * * *", "timezone": "America/New_York", "n": "3"},
        {"every": "90s", "n": "10"}]


def test_preview_over_the_limit_raises_limit_exceeded(one):
    _, server = one
    with pytest.raises(LimitExceeded, match="preview_n_max"):
        Client(server.url).preview(every="1s", n=101)
