"""Scoped tokens on a real node, refusal to expose an open API or plain Raft, and
a node with the wrong cluster secret that can neither join nor disturb."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

import pytest

from schedulerd.errors import Forbidden, NotFound, Unauthorized
from schedulerd.sdk.client import Client
from schedulerd.sdk.worker import Task, Worker
from tests.integration.harness import NodeProc, free_port_runs, http, running, wait_until

pytestmark = pytest.mark.integration


def status_of(url: str, bearer: str | None = None) -> int:
    """The HTTP status of a GET, whatever the body's format."""
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def token(tokens_file: pathlib.Path, name: str, *scopes: str, namespace: str | None = None) -> str:
    args = [sys.executable, "-m", "schedulerd.main", "token", "create", "--tokens-file", str(tokens_file),
            "--name", name, *[a for s in scopes for a in ("--scope", s)],
            *(["--namespace", namespace] if namespace else [])]
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip()


def test_scopes_decide_what_each_token_may_call(make_cluster, tmp_path: pathlib.Path) -> None:
    tokens_file = tmp_path / "tokens.yaml"
    admin = token(tokens_file, "ops", "admin")
    sched = token(tokens_file, "deployer", "scheduler")
    work = token(tokens_file, "billing-worker", "worker")
    read = token(tokens_file, "dashboard", "read")
    assert admin not in tokens_file.read_text(), "only hashes are stored"
    assert oct(tokens_file.stat().st_mode & 0o777) == "0o600"

    node = make_cluster(1, ["--tokens-file", str(tokens_file)], token=admin).nodes[0]
    url = node.url
    job = {"job_id": "j", "schedule": {"at": datetime.now(timezone.utc).isoformat()}, "queue": "q"}

    status, body = http("GET", f"{url}/v1/jobs")
    assert status == 401 and body["error"]["code"] == "unauthorized"
    assert http("GET", f"{url}/v1/jobs", token="sdt_not-a-token")[0] == 401
    assert status_of(f"{url}/healthz") == 200 and status_of(f"{url}/ui") == 200
    assert status_of(f"{url}/metrics") == 401

    status, body = http("POST", f"{url}/v1/jobs", job, token=read)
    assert status == 403 and "needs scope admin or scheduler" in body["error"]["message"]
    assert "'dashboard' has read" in body["error"]["message"]
    assert http("GET", f"{url}/v1/jobs", token=read)[0] == 200
    assert status_of(f"{url}/metrics", read) == 200
    assert http("POST", f"{url}/v1/jobs", job, token=sched)[0] == 201
    assert http("GET", f"{url}/v1/jobs/j", token=sched)[0] == 200

    status, body = http("GET", f"{url}/v1/jobs", token=work)
    assert status == 403 and "billing-worker" in body["error"]["message"]
    status, body = http("POST", f"{url}/v1/tasks/poll", {"worker_id": "w", "queues": ["q"], "wait_s": 5},
                        token=work)
    assert status == 200 and [t["job_id"] for t in body["tasks"]] == ["j"]
    assert http("POST", f"{url}/v1/tasks/poll", {"worker_id": "w", "queues": ["q"]}, token=sched)[0] == 403

    # The client library and schedctl carry the token; the typed errors say which is wrong.
    assert Client(url, token=sched).get_job("j")["job_id"] == "j"
    with pytest.raises(Forbidden):
        Client(url, token=read).cancel_job("j")
    with pytest.raises(Unauthorized):
        Client(url).get_job("j")
    env = {**os.environ, "SCHEDCTL_TOKEN": read}
    out = subprocess.run([sys.executable, "-m", "schedulerd.cli.main", "--server", url, "get", "j"], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0 and "job_id:" in out.stdout
    out = subprocess.run([sys.executable, "-m", "schedulerd.cli.main", "--server", url, "--token", read, "cancel", "j"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and out.stderr.startswith("error: forbidden: ")

    # The audit log names who did what; only admin reads it.
    assert http("GET", f"{url}/v1/audit", token=sched)[0] == 403
    status, body = http("GET", f"{url}/v1/audit", token=admin)
    assert status == 200
    assert [(r["who"], r["what"], r["outcome"]) for r in body["records"]][:1] == [("deployer", "create job j", "ok")]
    out = subprocess.run([sys.executable, "-m", "schedulerd.cli.main", "--server", url, "--token", admin, "audit"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "deployer" in out.stdout and "create job j" in out.stdout

    # A target's header values are credentials for the endpoint it calls, often: shown to
    # whoever may set them, redacted for a read-only token; the worker's task has them.
    hook = {"job_id": "hook", "schedule": {"at": "2099-01-01T00:00:00Z"}, "queue": "hooks",
            "target": {"kind": "http", "url": "https://example.invalid/", "headers": {"Authorization": "Bearer s3"}}}
    assert http("POST", f"{url}/v1/jobs", hook, token=sched)[0] == 201
    assert http("GET", f"{url}/v1/jobs/hook", token=sched)[1]["target"]["headers"] == {"Authorization": "Bearer s3"}
    for seen in (http("GET", f"{url}/v1/jobs/hook", token=read)[1],
                 next(j for j in http("GET", f"{url}/v1/jobs", token=read)[1]["jobs"] if j["job_id"] == "hook")):
        assert seen["target"]["headers"] == {"Authorization": "(redacted)"}
        assert seen["target"]["url"] == "https://example.invalid/"

    # SIGHUP reloads the file: a new token works at once; a broken file keeps the old ones.
    late = token(tokens_file, "late", "read")
    assert http("GET", f"{url}/v1/jobs", token=late)[0] == 401
    node.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: http("GET", f"{url}/v1/jobs", token=late)[0] == 200, 10, "the reloaded token")
    good = tokens_file.read_text()
    tokens_file.write_text("tokens: [this is not: valid")
    node.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "tokens_reload_failed" in pathlib.Path(node.log_path).read_text(), 10, "the reload error")
    assert http("GET", f"{url}/v1/jobs", token=late)[0] == 200
    tokens_file.write_text(good)


def test_a_reload_signal_without_a_tokens_file_leaves_the_node_serving(make_cluster) -> None:
    # A unit's ExecReload sends SIGHUP whatever the node's flags; its default action would end the node.
    node = make_cluster(1).nodes[0]
    node.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reload_ignored" in pathlib.Path(node.log_path).read_text(), 10, "the ignored reload")
    assert node.proc.poll() is None
    assert http("GET", f"{node.url}/healthz")[0] == 200


def test_the_worker_sdk_sends_its_token(make_cluster, tmp_path: pathlib.Path) -> None:
    tokens_file = tmp_path / "tokens.yaml"
    admin = token(tokens_file, "ops", "admin")
    work = token(tokens_file, "w", "worker")
    node = make_cluster(1, ["--tokens-file", str(tokens_file)], token=admin).nodes[0]
    assert node.post("/v1/jobs", {"job_id": "j", "schedule": {"at": datetime.now(timezone.utc).isoformat()},
                                  "queue": "q"})[0] == 201
    worker = Worker([node.url], wait_s=1, token=work)
    worker.handler("q")(lambda task: "done")
    with running(worker):
        wait_until(lambda: worker.stats.acked == 1, 15, "the ack")


def test_exposing_an_open_api_or_plain_raft_is_refused(tmp_path: pathlib.Path) -> None:
    http_port, raft_port = free_port_runs(2, 2)
    base = [sys.executable, "-m", "schedulerd.main", "--data-dir", str(tmp_path / "d")]
    refused = subprocess.run([*base, "--http", f"0.0.0.0:{http_port}"], capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "no --tokens-file" in refused.stderr
    refused = subprocess.run([*base, "--http", f"127.0.0.1:{http_port}", "--raft", f"0.0.0.0:{raft_port}"],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "no --cluster-secret-file" in refused.stderr


def test_a_node_with_the_wrong_secret_cannot_join_or_disturb(make_cluster, tmp_path: pathlib.Path) -> None:
    secret = tmp_path / "cluster.secret"
    secret.write_text("correct horse battery staple 42")
    secret.chmod(0o600)
    cluster = make_cluster(3, ["--cluster-secret-file", str(secret)])
    leader = cluster.leader()
    term = leader.group0()["term"]
    victim = next(n for n in cluster.nodes if n is not leader)
    victim.stop()

    wrong = tmp_path / "wrong.secret"
    wrong.write_text("an impostor's guess at it")
    impostor = NodeProc("impostor", victim.http_port, victim.raft_addr, victim.peers,
                        str(tmp_path / "impostor"), str(tmp_path / "impostor.log"),
                        extra_args=["--cluster-secret-file", str(wrong)])
    impostor.start()
    try:
        wait_until(lambda: impostor.get("/healthz")[0] == 200, 20, "the impostor to answer")
        deadline = time.monotonic() + 5  # several election timeouts of the impostor's
        while time.monotonic() < deadline:
            assert leader.group0()["is_leader"], "the impostor disturbed the leader"
            time.sleep(0.2)
        assert leader.group0()["term"] == term, "the impostor's votes reached the cluster"
        assert leader.post("/v1/jobs", {"job_id": "still-writable", "schedule": {"every": "1h"}})[0] == 201
        shown = impostor.get("/v1/cluster")[1]
        # It never hears the metadata group, so it learns no placement and holds no replica.
        assert shown["cluster"] is None and shown["groups"] == [], "the impostor got the log"
        assert impostor.get("/v1/jobs/still-writable")[0] == 503
    finally:
        impostor.stop()


def test_a_slash_in_a_name_does_not_reach_another_namespace(make_cluster, tmp_path: pathlib.Path) -> None:
    """Another namespace's job is stored as `payments/nightly` and its queue as `payments/q`:
    a path or queue naming that form from the default namespace must not reach them."""
    tokens_file = tmp_path / "tokens.yaml"
    admin = token(tokens_file, "ops", "admin")
    ours = token(tokens_file, "default-deployer", "scheduler", namespace="default")
    our_worker = token(tokens_file, "default-worker", "worker", namespace="default")
    url = make_cluster(1, ["--tokens-file", str(tokens_file)], token=admin).nodes[0].url
    payments = Client(url, token=admin, namespace="payments")
    payments.create_job({"job_id": "nightly", "schedule": {"at": datetime.now(timezone.utc).isoformat()},
                         "queue": "q", "payload": "secret"})
    for method, path in (("GET", "/v1/jobs/payments%2Fnightly"), ("POST", "/v1/jobs/payments%2Fnightly/trigger"),
                         ("DELETE", "/v1/jobs/payments%2Fnightly"), ("GET", "/v1/jobs/payments%2Fnightly/runs")):
        status, body = http(method, url + path, token=ours)
        assert status == 404 and "secret" not in str(body), (method, path, status, body)
    status, body = http("POST", f"{url}/v1/tasks/poll", {"worker_id": "w", "queues": ["payments/q"]},
                        token=our_worker)
    assert status == 400 and "queue names" in body["error"]["message"], body
    assert payments.get_job("nightly")["state"] == "completed"  # its one run claimed, not cancelled
    assert [r["state"] for r in payments.job_runs("nightly")["runs"]] == ["queued"]
    # An idempotency key may hold a slash; the default namespace's "payments/k" is not payments' "k".
    at = {"at": "2999-01-01T00:00:00Z"}
    first = payments.create_job({"job_id": "a", "schedule": at, "idempotency_key": "k"})
    second = Client(url, token=ours).create_job({"job_id": "b", "schedule": at, "idempotency_key": "payments/k"})
    assert (first["namespace"], first["job_id"]) == ("payments", "a")
    assert (second["namespace"], second["job_id"]) == ("default", "b")


def test_a_token_limited_to_a_namespace_sees_nothing_else(make_cluster, tmp_path: pathlib.Path) -> None:
    tokens_file = tmp_path / "tokens.yaml"
    admin = token(tokens_file, "ops", "admin")
    team = token(tokens_file, "payments-deployer", "scheduler", namespace="payments")
    team_worker = token(tokens_file, "payments-worker", "worker", namespace="payments")
    node = make_cluster(1, ["--tokens-file", str(tokens_file)], token=admin).nodes[0]
    url = node.url
    now = datetime.now(timezone.utc).isoformat()
    job = {"job_id": "nightly", "schedule": {"at": now}, "queue": "q"}
    assert http("POST", f"{url}/v1/jobs", job, token=admin)[0] == 201  # the default namespace's
    ours = Client(url, token=team, namespace="payments")
    created = ours.create_job(dict(job, payload={"team": "payments"}))  # same id, other namespace
    assert created["namespace"] == "payments" and created["job_id"] == "nightly" and created["queue"] == "q"

    assert ours.get_job("nightly")["payload"] == {"team": "payments"}
    assert [j["job_id"] for j in ours.list_jobs()["jobs"]] == ["nightly"]
    theirs = Client(url, token=team)  # the default namespace: not this token's
    for call in (lambda: theirs.get_job("nightly"), lambda: theirs.list_jobs(), lambda: theirs.cancel_job("nightly")):
        with pytest.raises(NotFound):
            call()
    admin_default = Client(url, token=admin)
    assert admin_default.get_job("nightly")["payload"] is None, "the default namespace's job is untouched"

    status, body = http("POST", f"{url}/v1/tasks/poll", {"worker_id": "w", "queues": ["q"], "wait_s": 5},
                        token=team_worker)
    assert status == 404, "the worker token's namespace is not the default one"
    worker = Worker([url], wait_s=1, token=team_worker, namespace="payments")
    seen: list[Task] = []
    worker.handler("q")(lambda task: seen.append(task))
    with running(worker):
        wait_until(lambda: worker.stats.acked == 1, 15, "the payments task")
    assert [t.payload for t in seen] == [{"team": "payments"}] and seen[0].queue == "q"
    default_run = admin_default.job_runs("nightly")["runs"][0]
    assert default_run["state"] == "queued", "the default namespace's run was not handed to payments"
    with pytest.raises(NotFound):
        ours.get_run(default_run["run_id"])  # guessing a run id of another namespace: 404

    # The audit log and the metrics name every namespace's jobs and queues: not for this token.
    team_admin = token(tokens_file, "payments-admin", "admin", namespace="payments")
    node.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: status_of(f"{url}/v1/cluster", team_admin) == 200, 10, "the reloaded tokens")
    assert status_of(f"{url}/v1/audit", team_admin) == 403
    assert status_of(f"{url}/metrics", team) == 403
    assert status_of(f"{url}/metrics", admin) == 200
