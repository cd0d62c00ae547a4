"""`schedctl apply` and `export` against a real node: the jobs-as-code loop. The diff
rules one by one are tests/unit/test_cli_apply.py."""
from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import urllib.request
from typing import Any

import pytest

from tests.integration.harness import NodeProc, http

pytestmark = pytest.mark.integration

WRITE_METHODS = ("POST", "PATCH", "PUT", "DELETE")
HOOK_URL = "https://hooks.example/close-day"
SECRET = "Bearer s3cret"


def schedctl(url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedulerd.cli.main", "--server", url, *args],
                          capture_output=True, text=True, timeout=60, input=stdin)


def writes(node: NodeProc) -> int:
    """Write requests the node has answered, by its request metric: apply's reads are GETs."""
    with urllib.request.urlopen(node.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    pattern = r'^schedulerd_http_request_duration_seconds_count\{(.*)\} (\S+)$'  # a route may hold {job_id}
    return int(sum(float(value) for labels, value in re.findall(pattern, text, flags=re.M)
                   if re.search(r'method="(%s)"' % "|".join(WRITE_METHODS), labels)))


def job(node: NodeProc, job_id: str) -> dict[str, Any]:
    status, body = node.get(f"/v1/jobs/{job_id}")
    assert status == 200, body
    return body


def ok(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, (result.stdout, result.stderr)
    return result.stdout.splitlines()


JOBS_YAML = """\
jobs:
  - job_id: hourly
    schedule: {every: 60m}
    queue: reports
    payload: {report: sales, day: 2027-01-01, ratio: 1.0}
    labels: {managed-by: git}
    timeout_s: 30.0
    backoff: {factor: 3}
  - job_id: nightly
    paused: true
    schedule: {cron: "0 2 * * *", timezone: Europe/Berlin}
    labels: {managed-by: git}
"""


def test_apply_creates_then_changes_only_what_differs_prunes_and_names_a_cancelled_job(
        make_cluster, tmp_path: pathlib.Path) -> None:
    node = make_cluster(1).nodes[0]
    for job_id, owner in (("stray", "git"), ("by-hand", "hand")):
        assert node.post("/v1/jobs", {"job_id": job_id, "schedule": {"every": "1h"},
                                      "labels": {"managed-by": owner}})[0] == 201
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "a.yaml").write_text(JOBS_YAML)
    (jobs / "b.json").write_text(json.dumps([{"job_id": "weekly", "schedule": {"cron": "0 3 * * 1"},
                                              "labels": {"managed-by": "git"}}]))

    assert ok(schedctl(node.url, "apply", "-f", str(jobs))) == [
        "hourly: created", "nightly: created, paused", "weekly: created", "applied: 3 created, 1 paused"]
    assert job(node, "nightly")["state"] == "paused" and job(node, "hourly")["payload"]["day"] == "2027-01-01"

    before = {job_id: job(node, job_id) for job_id in ("hourly", "nightly", "weekly")}
    sent = writes(node)
    assert ok(schedctl(node.url, "apply", "-f", str(jobs))) == [
        "hourly: unchanged", "nightly: unchanged", "weekly: unchanged", "applied: 3 unchanged"]
    assert writes(node) == sent, "a second apply of the same files sent a write"
    assert {job_id: job(node, job_id) for job_id in before} == before

    (jobs / "a.yaml").write_text(JOBS_YAML.replace("queue: reports", "queue: reports-v2"))
    assert ok(schedctl(node.url, "apply", "-f", str(jobs), "--dry-run")) == [
        "hourly: would update", '    queue: "reports" -> "reports-v2"', "nightly: unchanged", "weekly: unchanged",
        "dry run, nothing changed: 1 to update, 2 unchanged"]
    assert writes(node) == sent and job(node, "hourly") == before["hourly"]

    assert ok(schedctl(node.url, "apply", "-f", str(jobs)))[0] == "hourly: updated (queue)"
    after = job(node, "hourly")
    # Only the queue: the schedule was not sent, or an `every` would count again from now.
    assert {k: v for k, v in after.items() if after[k] != before["hourly"][k]}.keys() == {"queue", "updated_at"}
    assert writes(node) == sent + 1

    pruned = ok(schedctl(node.url, "apply", "-f", str(jobs), "--prune", "-l", "managed-by=git"))
    assert pruned[3:] == ["stray: cancelled (pruned: selected by -l, named in no file)",
                          "applied: 3 unchanged, 1 pruned"]
    assert job(node, "stray")["state"] == "cancelled" and job(node, "by-hand")["state"] == "scheduled"
    assert [job(node, j)["state"] for j in before] == ["scheduled", "paused", "scheduled"]

    assert http("DELETE", f"{node.url}/v1/jobs/weekly")[0] == 200
    refused = schedctl(node.url, "apply", "-f", str(jobs))
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        "error: conflict: weekly: the job is cancelled on the server, and a cancelled job cannot be changed or "
        "resumed: `schedctl cancel weekly --purge` frees its id, then apply creates it"]
    assert refused.stdout.splitlines() == ["hourly: unchanged", "nightly: unchanged", "applied: 2 unchanged, 1 failed"]


def test_export_round_trips_paused_jobs_and_secret_headers_are_placeholders_that_apply_keeps(
        make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    billing = {"team": "billing"}
    assert node.post("/v1/jobs", {"job_id": "hook", "schedule": {"every": "1h"}, "labels": billing,
                                  "payload": {"on": "yes", "at": "2027-01-01T00:00:00Z", "n": 1.0},
                                  "target": {"kind": "http", "url": HOOK_URL,
                                             "headers": {"Authorization": SECRET}}})[0] == 201
    assert node.post("/v1/jobs", {"job_id": "resting", "schedule": {"cron": "0 4 * * *"}, "labels": billing,
                                  "description": "paused while the ledger moves"})[0] == 201
    assert node.post("/v1/jobs/resting/pause", {})[0] == 200
    assert node.post("/v1/jobs", {"job_id": "gone", "schedule": {"every": "1h"}, "labels": billing})[0] == 201
    assert http("DELETE", f"{node.url}/v1/jobs/gone")[0] == 200

    exported = schedctl(node.url, "export", "-l", "team=billing")
    text = "\n".join(ok(exported))
    assert SECRET not in text and "Authorization: (redacted)" in text and "paused: true" in text
    assert "gone" not in text and "state:" not in text and "next_fire_time" not in text
    assert exported.stderr == "(left out 1 completed or cancelled jobs: export writes scheduled and paused ones)\n"

    sent = writes(node)
    assert ok(schedctl(node.url, "apply", "-f", "-", stdin=exported.stdout)) == [
        "hook: unchanged", "resting: unchanged", "applied: 2 unchanged"]
    assert writes(node) == sent

    # A changed target is sent whole, with the header value the job has in place of the placeholder.
    moved = exported.stdout.replace(HOOK_URL, HOOK_URL + "-v2")
    assert ok(schedctl(node.url, "apply", "-f", "-", stdin=moved))[0] == "hook: updated (target.url)"
    target = job(node, "hook")["target"]
    assert target["url"] == HOOK_URL + "-v2" and target["headers"] == {"Authorization": SECRET}

    with_secrets = json.loads("\n".join(ok(schedctl(node.url, "export", "--format", "json", "--include-secrets")))
                              or "{}")
    assert with_secrets["jobs"][0]["target"]["headers"] == {"Authorization": SECRET}

    # Purged and applied again from the export: made anew, paused as the file says.
    assert http("DELETE", f"{node.url}/v1/jobs/resting?purge=true")[0] == 200
    assert ok(schedctl(node.url, "apply", "-f", "-", stdin=moved))[1:] == [
        "resting: created, paused", "applied: 1 created, 1 unchanged, 1 paused"]
    assert job(node, "resting")["state"] == "paused"
    assert job(node, "resting")["description"] == "paused while the ledger moves"
