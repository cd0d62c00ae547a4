"""Hostile input at every route of a real node (in-process, one Raft group on
loopback): random and malformed bodies, headers, ids, cron expressions, zones
and dates. Never a 500, never a hung request, and a 4xx changes nothing (the
state digest, less last_applied, is the same before and after).

SCHEDULERD_FUZZ_EXAMPLES raises the number of requests for a soak."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from typing import Any, Iterator

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedulerd.api import openapi
from schedulerd.api.app import make_app, server_options
from schedulerd.clock import Clock
from schedulerd.config import NodeConfig
from schedulerd.lease_queue import LeaseQueue
from schedulerd.limits import Limits
from schedulerd.node import Node
from schedulerd.raft.conf import RaftConfig
from schedulerd.storage.tables import DB_NAMES, LAST_APPLIED
from tests.integration.harness import free_port_runs, wait_until

pytestmark = pytest.mark.integration

REQUEST_DEADLINE_S = 10.0  # long-polls are capped at 0.5 s below, so anything slower is hung

IDS = st.one_of(st.sampled_from(["seed", "0-3-0", "missing", "a" * 300, "..", "%00", "x%2Fy", "ü", "-", "0-0-0",
                                  "\u00b2-1-0", "9" * 30 + "-1-0", "seed\n", "\ud800"]),
                st.text(min_size=1, max_size=40).map(lambda s: s.replace("/", "_") or "_"))
TIMES = st.sampled_from(["9999-12-31T23:59:59Z", "1969-12-31T23:59:59Z", "9999-12-31T23:59:59-01:00",
                         "9999-12-31T23:59:60Z", "2016-12-31T23:59:60Z", "0001-01-01T00:00:00Z",
                         "2026-03-29T02:30:00+01:00", "2026-11-01T01:30:00-04:00", "2026-02-30T00:00:00Z",
                         "not a date", "2026-11-30T12:00:00", "", "1e9", "2026-11-30T12:00:00.123456789Z"])
CRONS = st.one_of(st.sampled_from(["* * * * *", "30 2 * * *", "0 0 30 2 *", "*/0 * * * *", "61 * * * *",
                                   "* * * * * * *", "@reboot", "0 0 L * *", "0 0 * * 8", "", "x" * 5000]),
                  st.text(max_size=30))
ZONES = st.one_of(st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Mars/Base",
                                   "America", "../../etc/passwd", "", "Etc/GMT+14"]), st.text(max_size=20))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=30))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=15), inner, max_size=5)),
                    max_leaves=15)
SCHEDULES = st.one_of(st.fixed_dictionaries({"at": TIMES}),
                      st.fixed_dictionaries({"cron": CRONS}, optional={"timezone": ZONES}),
                      st.fixed_dictionaries({"every": st.one_of(st.sampled_from(["1s", "0s", "366d", "367d", "1h30m",
                                                                                 "5x", "-1s"]), st.text(max_size=8))}),
                      JSON)
JOBS = st.fixed_dictionaries({}, optional={
    "job_id": IDS, "schedule": SCHEDULES, "queue": st.one_of(st.text(max_size=70), JSON), "payload": JSON,
    "max_attempts": SCALARS, "priority": SCALARS, "misfire_policy": st.one_of(st.text(max_size=10), SCALARS),
    "overlap_policy": SCALARS, "backoff": JSON, "timeout_s": SCALARS, "jitter_s": SCALARS,
    "starting_deadline_s": SCALARS, "history_limit": SCALARS, "catchup_limit": SCALARS,
    "target": st.one_of(JSON, st.fixed_dictionaries({"kind": st.just("http"), "url": st.text(max_size=30)},
                                                    optional={"method": st.text(max_size=6), "headers": JSON})),
    "idempotency_key": st.one_of(st.text(max_size=300), SCALARS), "unknown_field": JSON})
TASK_BODIES = st.fixed_dictionaries({}, optional={
    "worker_id": st.one_of(st.text(max_size=200), SCALARS), "queues": st.one_of(st.lists(st.text(max_size=10)), JSON),
    "max_tasks": SCALARS, "wait_s": st.one_of(st.floats(-1, 0.5), SCALARS), "fence": SCALARS,
    "result": JSON, "error": st.one_of(st.text(max_size=50), SCALARS),
    "acks": st.lists(st.fixed_dictionaries({}, optional={"run_id": IDS, "fence": SCALARS, "result": JSON}),
                     max_size=3),
    "leases": st.lists(st.fixed_dictionaries({}, optional={"run_id": IDS, "fence": SCALARS}), max_size=3)})
BODIES = st.one_of(st.none(), JOBS, TASK_BODIES, st.fixed_dictionaries({"jobs": st.lists(JOBS, max_size=3)}), JSON,
                   st.binary(max_size=60), st.just(b'{"schedule": {"every": "1h"}'), st.just(b"\xff\xfe{}"),
                   st.just(b'{"job_id": "twice", "schedule": {"every": "1h"}, "job_id": "other"}'))
QUERIES = st.dictionaries(st.sampled_from(["limit", "cursor", "state", "queue", "cron", "timezone", "every", "n",
                                           "junk"]),
                          st.one_of(st.text(max_size=20), st.sampled_from(["-1", "0", "1e9", "99999999999"]),
                                    CRONS, ZONES), max_size=4)
HEADERS = st.dictionaries(st.sampled_from(["Content-Type", "Idempotency-Key", "Authorization", "X-Junk"]),
                          st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=300),
                          max_size=3)
ROUTES = sorted((method.upper(), path) for path, ops in openapi.operations(Limits()).items() for method in ops)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[asyncio.AbstractEventLoop, TestClient, Node]]:
    (port,) = free_port_runs(1, 2)  # the Raft port, and the metadata group's after it
    data = tmp_path_factory.mktemp("fuzz")
    config = NodeConfig(raft=RaftConfig(self_addr=f"127.0.0.1:{port}", data_dir=str(data)),
                        limits=Limits(long_poll_s_max=0.5, body_read_s_max=0.5))
    config.validate()
    loop = asyncio.new_event_loop()
    node = Node(config, Clock())
    node.start(loop)
    def leads() -> bool:  # the topology starts the group on the loop: let it run between looks
        loop.run_until_complete(asyncio.sleep(0.05))
        return bool(node.groups) and node.groups[0].status()["ready"] and node.groups[0].is_leader()

    wait_until(leads, 15, "the node to lead")
    server = TestServer(make_app(node, LeaseQueue(node)))
    loop.run_until_complete(server.start_server(loop=loop, **server_options(config.limits)))  # as the daemon serves
    client = TestClient(server, loop=loop)
    loop.run_until_complete(client.start_server())
    seed = {"job_id": "seed", "schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"}, "queue": "q"}
    assert loop.run_until_complete(client.post("/v1/jobs", json=seed)).status == 201
    yield loop, client, node
    loop.run_until_complete(client.close())
    node.stop()
    loop.close()


def digest(node: Node) -> str:
    """The scheduler's state: every table but the last_applied key, which any committed entry
    (even a rejected one) advances, and the audit log, which records refused attempts too."""
    h = hashlib.sha256()
    with node.read(node.groups[0]) as (txn, tables):
        for name in (n for n in DB_NAMES if n != "audit"):
            with txn.cursor(db=getattr(tables, name)) as cur:
                for key, value in cur:
                    if not (name == "meta" and key == LAST_APPLIED):
                        h.update(name.encode() + len(key).to_bytes(4, "big") + key + value)
    return h.hexdigest()


def fill(path: str, job_id: str, run_id: str, time: str = "") -> str:
    path = path.replace("{time}", time.replace("/", "_"))
    return re.sub(r"\{run_id\}", lambda _: run_id.replace("/", "_"),
                  re.sub(r"\{job_id\}", lambda _: job_id.replace("/", "_"), path))


@settings(max_examples=int(os.environ.get("SCHEDULERD_FUZZ_EXAMPLES", 300)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), job_id=IDS, run_id=IDS, body=BODIES, query=QUERIES, headers=HEADERS,
       time=TIMES)
def test_no_input_gets_a_500_hangs_or_half_applies(live: Any, route: tuple[str, str], job_id: str, run_id: str,
                                                  body: Any, query: dict[str, str], headers: dict[str, str],
                                                  time: str) -> None:
    loop, client, node = live
    method, template = route
    path = fill(template, job_id, run_id, time)
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()

    async def send() -> tuple[int, str, bytes]:
        resp = await client.request(method, path, params=query, data=data, headers=headers)
        return resp.status, resp.content_type, await resp.read()

    before = digest(node)
    status, content_type, text = loop.run_until_complete(asyncio.wait_for(send(), REQUEST_DEADLINE_S))
    assert status < 500 or status == 503, f"{method} {path} {query} {body!r} -> {status} {text[:300]!r}"
    if 400 <= status < 500:
        assert digest(node) == before, f"{method} {path} answered {status} but changed the state"
        if content_type == "application/json":
            error = json.loads(text)["error"]
            assert error["code"] and error["message"], text
        else:  # refused by the HTTP parser (a line or header over its limit) before any handler
            assert status in (400, 413, 431) and text, text


def test_a_client_that_dribbles_its_body_gets_408_and_the_limit_named(live: Any) -> None:
    loop, client, node = live

    async def slow() -> bytes:
        reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
        writer.write(b"POST /v1/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{")
        await writer.drain()
        answer = await reader.read(4096)
        writer.close()
        return answer

    answer = loop.run_until_complete(asyncio.wait_for(slow(), REQUEST_DEADLINE_S))
    assert answer.startswith(b"HTTP/1.1 408") and b"body_read_s_max" in answer


HEADER_READ_S = 0.6


def header_timed_server(live: Any) -> TestServer:
    """A second server on the live node, with a short header_read_s_max (the live one keeps the
    default, so the fuzz test's pooled connections never meet it)."""
    loop, _, node = live
    server = TestServer(make_app(node, LeaseQueue(node)))
    loop.run_until_complete(server.start_server(loop=loop, **server_options(Limits(header_read_s_max=HEADER_READ_S))))
    return server


def test_a_client_that_dribbles_its_headers_is_disconnected_at_header_read_s_max(live: Any) -> None:
    loop = live[0]
    server = header_timed_server(live)

    async def dribble() -> tuple[float, bytes]:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        started = loop.time()
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        read = asyncio.ensure_future(reader.read(4096))
        while not read.done():  # one more header byte every 50 ms: the deadline is not reset by traffic
            writer.write(b"X")
            await asyncio.wait([read], timeout=0.05)
        writer.close()
        return loop.time() - started, read.result()

    try:
        took_s, answer = loop.run_until_complete(asyncio.wait_for(dribble(), REQUEST_DEADLINE_S))
    finally:
        loop.run_until_complete(server.close())
    assert answer == b"" and HEADER_READ_S * 0.9 <= took_s < HEADER_READ_S + 3, (took_s, answer)


def test_a_silent_connection_is_closed_and_a_long_poll_outlasts_header_read_s_max(live: Any) -> None:
    loop = live[0]
    server = header_timed_server(live)

    async def silent() -> bytes:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        answer = await reader.read(4096)
        writer.close()
        return answer

    async def poll_then_reuse() -> tuple[bytes, bytes]:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        body = json.dumps({"worker_id": "w", "queues": ["nothing-here"], "wait_s": 0.5}).encode()

        async def ask(request: bytes) -> bytes:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"Content-Length: (\d+)", head, re.I).group(1))
            return head + await reader.readexactly(length)

        polled = await ask(b"POST /v1/tasks/poll HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        await asyncio.sleep(HEADER_READ_S / 3)  # idle, within the limit: the connection is still open
        health = await ask(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        writer.close()
        return polled, health

    try:
        assert loop.run_until_complete(asyncio.wait_for(silent(), REQUEST_DEADLINE_S)) == b""
        polled, health = loop.run_until_complete(asyncio.wait_for(poll_then_reuse(), REQUEST_DEADLINE_S))
    finally:
        loop.run_until_complete(server.close())
    assert polled.startswith(b"HTTP/1.1 200") and b'"tasks": []' in polled.replace(b'":[]', b'": []'), polled
    assert health.startswith(b"HTTP/1.1 200"), health


def test_limits_are_named_when_hit(live: Any) -> None:
    loop, client, node = live

    async def post(path: str, body: Any) -> tuple[int, dict]:
        resp = await client.post(path, json=body)
        return resp.status, await resp.json()

    status, body = loop.run_until_complete(post("/v1/jobs", {"schedule": {"cron": "* " * 200}}))
    assert status == 400 and "cron_chars_max is 256" in body["error"]["message"]
    status, body = loop.run_until_complete(post("/v1/tasks/poll", {"worker_id": "w", "queues": [f"q{i}" for i in range(65)]}))
    assert status == 400 and "poll_queues_max" in body["error"]["message"]
    status, body = loop.run_until_complete(post("/v1/jobs", {"schedule": {"every": "1h"}, "payload": "x" * 70_000}))
    assert status == 413 and "payload_bytes_max" in body["error"]["message"]


def test_what_a_caller_did_not_mean_is_refused_not_guessed(live: Any) -> None:
    loop, client, node = live

    async def send(method: str, path: str, data: bytes | None = None) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"} if data is not None else None
        resp = await client.request(method, path, data=data, headers=headers)
        return resp.status, await resp.json()

    def refused(method: str, path: str, data: bytes | None = None) -> str:
        status, body = loop.run_until_complete(send(method, path, data))
        assert (status, body["error"]["code"]) == (400, "invalid_request"), body
        return body["error"]["message"]

    assert "'max_attempts' appears twice" in refused(
        "POST", "/v1/jobs", b'{"schedule": {"every": "1h"}, "max_attempts": 1, "max_attempts": 9}')
    assert refused("GET", "/v1/jobs?stat=paused") == (
        "unknown query parameter(s): stat; allowed: cursor, groups, limit, queue, selector, state")
    assert refused("GET", "/v1/jobs?limit=5&limit=500") == "query parameter(s) given more than once: limit"
    assert "allowed: cursor, groups, limit, queue" in refused("GET", "/v1/dead-letter?queues=q")
    assert "allowed: cursor, limit" in refused("GET", "/v1/jobs/seed/runs?state=failed")
    assert "allowed: cursor, limit" in refused("GET", "/v1/audit?since=1")
    assert refused("GET", "/v1/jobs/seed/occurrences/2026-11-30T02:00:00Z?verbose=1") == (
        "unknown query parameter(s): verbose; allowed: none")
    assert "is not an ISO 8601 instant" in refused("GET", "/v1/jobs/seed/occurrences/2026-11-30T02:00:00")
    assert loop.run_until_complete(send("GET", "/v1/jobs?state=scheduled&limit=5"))[0] == 200
