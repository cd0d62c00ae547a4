"""A real open node against what a web page could send it: a cross-site text/plain
POST changes nothing (the state digest is unchanged), a rebinding Host is refused,
and the node's own options open what an operator means to open."""
from __future__ import annotations

import http.client
import json
import subprocess
import sys
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.integration.harness import ROOT

pytestmark = pytest.mark.integration

FORGED_JOB = json.dumps({"job_id": "x", "schedule": {"every": "1h"}, "queue": "hooks",
                         "target": {"kind": "http", "url": "http://169.254.169.254/latest/meta-data/"}})


def raw(url: str, method: str, path: str, body: str | None = None, headers: dict[str, str] | None = None) \
        -> tuple[int, dict[str, str], Any]:
    """One request with exactly these headers (urllib would add a Content-Type of its own)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, dict(resp.headers), json.loads(data) if data else None
    finally:
        conn.close()


def digest(node: Any) -> list[dict[str, Any]]:
    status, body = node.get("/v1/cluster/digest")
    assert status == 200, body
    return body["groups"]


def test_a_cross_site_page_changes_nothing(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    assert node.post("/v1/jobs", {"job_id": "nightly", "schedule": {"cron": "0 2 * * *"}})[0] == 201
    before = digest(node)
    page = {"Origin": "https://evil.example", "Content-Type": "text/plain", "Sec-Fetch-Site": "cross-site"}
    assert raw(node.url, "POST", "/v1/jobs", FORGED_JOB, page)[0] == 403
    for verb in ("pause", "resume", "trigger"):
        status, _, body = raw(node.url, "POST", f"/v1/jobs/nightly/{verb}", "{}", page)
        assert status == 403 and body["error"]["code"] == "cross_site", body
    assert raw(node.url, "DELETE", "/v1/jobs/nightly", None, {"Origin": "https://evil.example"})[0] == 403
    # Without an Origin, text/plain is still not JSON: 415 names what is.
    status, _, body = raw(node.url, "POST", "/v1/jobs", FORGED_JOB, {"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in body["error"]["message"]
    status, _, body = raw(node.url, "POST", "/v1/tasks/poll", '{"worker_id": "w", "queues": ["q"]}',
                          {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 415
    # DNS rebinding: the attacker's name, resolved to 127.0.0.1, reads nothing either.
    status, _, body = raw(node.url, "GET", "/v1/jobs", None, {"Host": f"rebind.evil.example:{node.http_port}"})
    assert status == 421 and body["error"]["code"] == "misdirected_host"
    assert digest(node) == before, "a refused request changed the replicated state"
    # The metadata target itself is refused even as plain JSON from the CLI's side.
    status, _, body = raw(node.url, "POST", "/v1/jobs", FORGED_JOB, {"Content-Type": "application/json"})
    assert status == 400 and "169.254.0.0/16" in body["error"]["message"]
    assert digest(node) == before


def test_own_origin_and_listed_names_pass(make_cluster) -> None:
    node = make_cluster(1, ["--allowed-hosts", "sched.example.test", "--allowed-origins",
                            "https://ops.example.test"]).nodes[0]
    job = json.dumps({"job_id": "j", "schedule": {"every": "1h"}})
    own = {"Origin": node.url, "Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"}
    assert raw(node.url, "POST", "/v1/jobs", job, own)[0] == 201
    named = {"Host": "sched.example.test", "Origin": "http://sched.example.test",
             "Content-Type": "application/json"}
    assert raw(node.url, "POST", "/v1/jobs/j/pause", "{}", named)[0] == 200
    listed = {"Origin": "https://ops.example.test", "Sec-Fetch-Site": "cross-site"}
    status, headers, _ = raw(node.url, "OPTIONS", "/v1/jobs/j/resume", None,
                             {**listed, "Access-Control-Request-Method": "POST"})
    assert status == 204 and headers["Access-Control-Allow-Methods"] == "POST"
    status, headers, body = raw(node.url, "POST", "/v1/jobs/j/resume", None, listed)
    assert status == 200 and body["state"] == "scheduled"
    assert headers["Access-Control-Allow-Origin"] == "https://ops.example.test"


def test_one_idempotency_key_and_405_names_the_methods(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    status, _, body = raw(node.url, "POST", "/v1/jobs", json.dumps({"schedule": {"every": "1h"},
                                                                    "idempotency_key": "b"}),
                          {"Content-Type": "application/json", "Idempotency-Key": "a"})
    assert status == 400 and "'a'" in body["error"]["message"] and "'b'" in body["error"]["message"]
    assert node.get("/v1/jobs")[1]["jobs"] == []
    status, headers, body = raw(node.url, "TRACE", "/v1/jobs")
    assert status == 405 and headers["Allow"] == "GET, HEAD, POST"


@pytest.mark.parametrize("args, message", [
    (["--allowed-hosts", "bad host"], "allowed host"),
    (["--allowed-origins", "ops.example.test"], "allowed origin"),
    (["--target-allow", "10.0.0.0/33"], "target policy entry"),
])
def test_a_bad_option_stops_the_node_naming_it(tmp_path, args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "schedulerd.main", "--data-dir", str(tmp_path / "d"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and message in done.stderr, done.stderr
