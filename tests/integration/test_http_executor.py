"""`schedctl worker http` against a real node and a local target service that
fails on purpose: 2xx acks, errors and timeouts retry, then dead-letter; every
call of one occurrence carries the same Idempotency-Key; connections are reused."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any

import pytest
from aiohttp import web

from tests.integration.harness import wait_until

pytestmark = pytest.mark.integration


class TargetService:
    """An HTTP service in a background loop; /{job} answers by the job's script."""

    def __init__(self) -> None:
        self.calls: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.peers: set[tuple[str, int]] = set()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.add_routes([web.route("*", "/{job}", self.handle)])
        self.runner = web.AppRunner(app)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> "TargetService":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: Any) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)

    async def _start(self) -> None:
        await self.runner.setup()
        await web.SockSite(self.runner, self.sock).start()

    async def handle(self, request: web.Request) -> web.Response:
        job = request.match_info["job"]
        self.peers.add(request.transport.get_extra_info("peername"))
        calls = self.calls[job]
        calls.append({"method": request.method, "key": request.headers.get("Idempotency-Key"),
                      "auth": request.headers.get("Authorization"), "body": await request.text()})
        if job == "flaky" and len(calls) == 1:
            return web.Response(status=503, text="warming up")
        if job == "broken":
            return web.Response(status=500, text="database is on fire")
        if job == "moved":
            return web.Response(status=301, headers={"Location": "/ok"})
        if job == "slow":
            await asyncio.sleep(3)
        return web.Response(status=200, text=f"done {job}")


def _soon() -> str:
    return datetime.now(timezone.utc).isoformat()


def test_http_worker_acks_retries_dead_letters_and_sends_the_idempotency_key(make_cluster) -> None:
    cluster = make_cluster(1, ["--target-allow", "127.0.0.0/8"])  # the target service is on loopback
    node = cluster.nodes[0]
    with TargetService() as service:
        jobs = {
            "ok": {"method": "PUT", "headers": {"Authorization": "Bearer t0ken"}},
            "flaky": {},
            "broken": {},
            "slow": {"timeout_s": 0.5},
            "moved": {"headers": {"X-Api-Key": "s3cret"}},
        }
        for job_id, extra in jobs.items():
            status, body = node.post("/v1/jobs", {
                "job_id": job_id, "schedule": {"at": _soon()}, "queue": "hooks", "payload": {"job": job_id},
                "max_attempts": 2, "backoff": {"base_ms": 100, "max_ms": 200},
                "target": {"kind": "http", "url": f"{service.url}/{job_id}", **extra}})
            assert status == 201, body
        assert node.post("/v1/jobs", {"job_id": "no-target", "schedule": {"at": _soon()}, "queue": "hooks",
                                      "max_attempts": 1})[0] == 201

        worker = subprocess.Popen(
            [sys.executable, "-m", "schedulerd.cli.main", "--server", node.url, "worker", "http", "--queue", "hooks",
             "--concurrency", "4", "--allow-private-targets"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            def states() -> dict[str, str]:
                return {j: node.get(f"/v1/jobs/{j}/runs")[1]["runs"][0]["state"] for j in [*jobs, "no-target"]}

            wait_until(lambda: states() == {"ok": "succeeded", "flaky": "succeeded", "broken": "dead_letter",
                                            "slow": "dead_letter", "moved": "dead_letter", "no-target": "dead_letter"}, 30,
                       "every run to finish")
        except AssertionError:
            worker.send_signal(signal.SIGTERM)
            raise AssertionError(f"worker output:\n{worker.communicate(timeout=20)[0]}") from None
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=20)[0]
        assert worker.returncode == 0, output

        runs = {j: node.get(f"/v1/jobs/{j}/runs")[1]["runs"][0] for j in [*jobs, "no-target"]}
        ok = runs["ok"]
        assert ok["attempt"] == 1 and ok["result"] == {"status": 200, "body": "done ok"}
        [call] = service.calls["ok"]
        assert call["method"] == "PUT" and call["auth"] == "Bearer t0ken"
        assert call["key"] == f"ok:{ok['scheduled_time']}" and call["body"] == '{"job":"ok"}'

        assert runs["flaky"]["attempt"] == 2
        keys = [c["key"] for c in service.calls["flaky"]]
        assert len(keys) == 2 and keys[0] == keys[1] == f"flaky:{runs['flaky']['scheduled_time']}"

        assert len(service.calls["broken"]) == 2
        assert "HTTP 500" in runs["broken"]["error"] and "database is on fire" in runs["broken"]["error"]
        assert "no answer within 0.5s" in runs["slow"]["error"]
        assert "has no http target" in runs["no-target"]["error"]
        # A redirect is not followed: the POST would become a GET without its body, and the
        # target's headers would go to wherever it points.
        assert "HTTP 301" in runs["moved"]["error"] and "redirects are not followed" in runs["moved"]["error"]
        assert [c["method"] for c in service.calls["moved"]] == ["POST", "POST"]
        assert [c["key"] for c in service.calls["ok"]] == [f"ok:{ok['scheduled_time']}"]
        # Keep-alive: the pool reused connections instead of opening one per call.
        assert len(service.peers) < sum(len(c) for c in service.calls.values())


def test_loopback_targets_are_refused_by_the_node_and_by_the_executor(make_cluster) -> None:
    """The node refuses a metadata target at create; with loopback opened on the node, the
    executor still refuses to call it (it judges the address it would connect to), nacks
    with the rule, and the service is never called."""
    with TargetService() as service:
        opened = make_cluster(1, ["--target-allow", "127.0.0.0/8,localhost"]).nodes[0]
        status, body = opened.post("/v1/jobs:batch", {"jobs": [
            {"job_id": "fine", "schedule": {"every": "1h"}},
            {"job_id": "meta", "schedule": {"every": "1h"},
             "target": {"kind": "http", "url": "http://169.254.169.254/latest/meta-data/"}}]})
        assert status == 400 and body["error"]["message"].startswith("jobs[1] (job_id 'meta'): target.url")
        assert "169.254.0.0/16" in body["error"]["message"] and "--target-allow" in body["error"]["message"]
        assert opened.get("/v1/jobs/fine")[0] == 404, "a refused batch creates nothing"

        urls = {"literal": f"{service.url}/literal", "name": service.url.replace("127.0.0.1", "localhost") + "/name"}
        for job_id, url in urls.items():
            status, body = opened.post("/v1/jobs", {"job_id": job_id, "schedule": {"at": _soon()}, "queue": "hooks",
                                                    "max_attempts": 1, "target": {"kind": "http", "url": url}})
            assert status == 201, body
        worker = subprocess.Popen(
            [sys.executable, "-m", "schedulerd.cli.main", "--server", opened.url, "worker", "http", "--queue", "hooks"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            wait_until(lambda: all(opened.get(f"/v1/jobs/{j}/runs")[1]["runs"][0]["state"] == "dead_letter"
                                   for j in urls), 30, "both runs to be refused and dead-lettered")
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.communicate(timeout=20)
        for job_id, rule in (("literal", "127.0.0.0/8"), ("name", "localhost")):
            error = opened.get(f"/v1/jobs/{job_id}/runs")[1]["runs"][0]["error"]
            assert f"refused destination {rule} " in error and "--allow-private-targets" in error, error
        assert dict(service.calls) == {}, "nothing reached the service"
