"""The dashboard in a real headless Chromium against a running 3-node cluster:
a job made through the API shows with its runs, its pause, resume and trigger
buttons work from the node's own origin, a dead letter is re-driven with its
button and runs, and a page of another origin cannot change anything. A screenshot is kept as a test artifact
(test-artifacts/dashboard.png, or $SCHEDULERD_TEST_ARTIFACTS)."""
from __future__ import annotations

import os
import pathlib
import threading
from datetime import datetime, timezone
from typing import Any

import pytest

from schedulerd.sdk.worker import Task, Worker
from tests.integration.harness import http, running, wait_until
from tests.integration.webdriver import Browser, find_browser

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = pathlib.Path(os.environ.get("SCHEDULERD_TEST_ARTIFACTS", ROOT / "test-artifacts"))


@pytest.fixture
def browser() -> Any:
    found = find_browser()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are missing; .ci/run installs them")
        pytest.skip("chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")
    b = Browser(*found, height=1700)
    yield b
    b.close()


def test_dashboard_shows_jobs_runs_and_redrives_a_dead_letter(make_cluster, browser: Browser) -> None:
    cluster = make_cluster(3)
    leader = cluster.leader()
    now = datetime.now(timezone.utc).isoformat()
    for job_id in ("nightly-report", "charge-card"):
        status, body = leader.post("/v1/jobs", {"job_id": job_id, "schedule": {"at": now}, "queue": "ui",
                                                "payload": {"job": job_id}, "max_attempts": 1})
        assert status == 201, body
    assert leader.post("/v1/jobs", {"job_id": "hourly-sync", "schedule": {"cron": "0 * * * *",
                                                                          "timezone": "Europe/Berlin"}})[0] == 201

    # A limit on the ui queue, which the queue table shows (refused until every voter is known to read it).
    wait_until(lambda: http("PUT", f"{leader.url}/v1/queues/ui", {"max_running": 5, "max_starts_per_s": 20})[0] == 200,
               15, "the ui queue's limits set")
    card_declined = threading.Event()
    card_declined.set()
    worker = Worker(cluster.urls, concurrency=2, wait_s=1)

    @worker.handler("ui")
    def handle(task: Task) -> str:
        if task.job_id == "charge-card" and card_declined.is_set():
            raise RuntimeError("card declined")
        return "ok"

    with running(worker):
        wait_until(lambda: leader.get("/v1/dead-letter")[1]["runs"], 20, "charge-card to dead-letter")

        browser.open(f"{cluster.nodes[1].url}/ui")  # any node serves it, a follower too
        jobs = wait_until(lambda: browser.run_js(
            "return [...document.querySelectorAll('#jobs tr[data-job-id]')].map(r => r.dataset.jobId)"),
            15, "the jobs table")
        assert set(jobs) == {"nightly-report", "charge-card", "hourly-sync"}
        groups = browser.run_js("return document.querySelectorAll('#cluster tr[data-group]').length")
        assert groups == 1
        wait_until(lambda: browser.run_js(
            "return [...document.querySelectorAll('#nodes tr[data-node-id]')].map(r => r.dataset.state)")
            == ["alive"] * 3, 15, "the three nodes, alive, in the nodes table")
        assert browser.run_js("return document.getElementById('health').textContent") == "ready"
        members = browser.run_js(
            "return [...document.querySelectorAll('#data-groups tr[data-group] td')].map(td => td.textContent)")
        assert members[0] == "0" and len(members[1].split(", ")) == 3, members  # group 0 on the three nodes
        assert "voters" in browser.run_js("return document.getElementById('meta').textContent")
        # The ui queue's last 15 minutes: a line of dispatches and of lateness, from the two leases.
        wait_until(lambda: browser.run_js(
            "return document.querySelectorAll('#queue-charts [data-chart=\"ui\"] polyline.rate').length") == 1,
            15, "the ui queue's charts")
        assert browser.run_js("return document.querySelector('#queue-charts [data-chart=\"ui\"] "
                              "polyline.p99').getAttribute('points')"), "a p99 line with points"
        assert "running" in browser.run_js("return document.getElementById('queues').textContent")
        assert browser.run_js("return document.querySelector('#queues tr[data-queue=\"ui\"] td.limits')"
                              ".textContent") == "≤ 5 running · ≤ 20/s"

        browser.click('#jobs tr[data-job-id="nightly-report"]')
        wait_until(lambda: browser.run_js(
            "return [...document.querySelectorAll('#runs tr[data-run-id]')].map(r => r.dataset.state)")
            == ["succeeded"], 15, "nightly-report's run in the detail view")
        assert browser.run_js("return document.getElementById('detail-id').textContent") == "nightly-report"
        wait_until(lambda: "last runsucceeded" in browser.run_js(
            "return document.getElementById('detail-fields').textContent"), 10, "nightly-report's last run shown")

        dead = browser.run_js(
            "return [...document.querySelectorAll('#dead-letters tr[data-run-id]')].map(r => r.dataset.runId)")
        assert len(dead) == 1 and "card declined" in browser.run_js(
            "return document.getElementById('dead-letters').textContent")
        browser.click('#jobs tr[data-job-id="hourly-sync"]')
        wait_until(lambda: browser.run_js(
            "return document.getElementById('detail-fields').textContent").count("Europe/Berlin") >= 1,
            10, "hourly-sync's detail")
        fires = browser.run_js("return document.getElementById('detail-fields').textContent")
        assert "next fire times" in fires

        # The page's own buttons change things: Chromium sends its Origin and Sec-Fetch-Site, the node's own.
        browser.click("#pause")
        wait_until(lambda: leader.get("/v1/jobs/hourly-sync")[1]["state"] == "paused", 10, "a pause from the page")
        browser.click("#resume")
        wait_until(lambda: leader.get("/v1/jobs/hourly-sync")[1]["state"] == "scheduled", 10,
                   "a resume from the page")
        browser.click("#trigger")
        wait_until(lambda: any(r["trigger"] for r in leader.get("/v1/jobs/hourly-sync/runs")[1]["runs"]), 10,
                   "a triggered run from the page")

        card_declined.clear()
        browser.click('#jobs tr[data-job-id="charge-card"]')
        browser.click(f'button.redrive[data-run-id="{dead[0]}"]')
        wait_until(lambda: browser.run_js(
            "return [...document.querySelectorAll('#runs tr[data-run-id]')].map(r => r.dataset.state)")
            == ["succeeded"], 20, "the re-driven run to succeed, seen in the page")
        wait_until(lambda: browser.run_js(
            "return document.querySelectorAll('#dead-letters tr[data-run-id]').length") == 0, 10,
            "the dead-letter list to empty")
        assert leader.get(f"/v1/runs/{dead[0]}")[1]["state"] == "succeeded"

        # A page of another origin (node 2's) posting to node 0 as a forging page would: text/plain,
        # no preflight. The browser sends it; the node refuses it and nothing changes.
        browser.open(f"{cluster.nodes[2].url}/ui")
        outcome = browser.run_js(
            "return Promise.all(arguments[0].map(([path, body]) => fetch(arguments[1] + path, {method: 'POST', "
            "mode: 'no-cors', headers: {'Content-Type': 'text/plain'}, body: body}).then(() => 'sent', () => 'failed')))",
            [["/v1/jobs", '{"job_id": "forged", "schedule": {"every": "1h"}}'],
             ["/v1/jobs/hourly-sync/pause", "{}"]], cluster.nodes[0].url)
        assert outcome == ["sent", "sent"]
        assert leader.get("/v1/jobs/forged")[0] == 404
        assert leader.get("/v1/jobs/hourly-sync")[1]["state"] == "scheduled"
        browser.open(f"{cluster.nodes[1].url}/ui")
        wait_until(lambda: browser.run_js("return document.querySelectorAll('#jobs tr[data-job-id]').length") == 3,
                   15, "the jobs table again")

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "dashboard.png"
        browser.run_js("window.scrollTo(0, 0)")
        browser.screenshot(str(shot))
        assert shot.read_bytes().startswith(b"\x89PNG")
