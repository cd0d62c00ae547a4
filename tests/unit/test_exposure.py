"""What a node takes from a browser: its own names only (DNS rebinding), no
cross-site writes, bodies declared JSON; listed origins get CORS answers."""
from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from schedulerd.api import app as api
from schedulerd.api import exposure
from schedulerd.api.exposure import ExposurePolicy

LOOPBACK = ExposurePolicy.build("127.0.0.1", (), ())


@pytest.mark.parametrize("host, allowed", [
    ("127.0.0.1:8080", True), ("localhost:8080", True), ("LOCALHOST", True), ("[::1]:8080", True),
    (None, True), ("evil.example:8080", False), ("127.0.0.1.evil.example", False), ("10.0.0.1:8080", False),
])
def test_a_loopback_node_answers_to_its_own_names_only(host: str | None, allowed: bool) -> None:
    assert LOOPBACK.host_allowed(host) is allowed


def test_the_machines_own_name_is_its_own() -> None:
    assert LOOPBACK.host_allowed(f"{socket.gethostname()}:8080")


def test_allowed_hosts_add_names_and_domains_and_star_turns_it_off() -> None:
    policy = ExposurePolicy.build("127.0.0.1", ("sched.example.com", ".svc.cluster.local"), ())
    assert policy.host_allowed("SCHED.example.com:443") and policy.host_allowed("api.svc.cluster.local")
    assert policy.host_allowed("svc.cluster.local") and not policy.host_allowed("evilsvc.cluster.local")
    assert ExposurePolicy.build("127.0.0.1", ("*",), ()).host_allowed("anything.example")


def test_a_wildcard_bind_takes_any_address_but_only_listed_names() -> None:
    policy = ExposurePolicy.build("0.0.0.0", ("sched.example.com",), ())
    assert policy.host_allowed("10.1.2.3:8080") and policy.host_allowed("[2001:db8::5]:8080")
    assert policy.host_allowed("sched.example.com") and policy.host_allowed("localhost")
    assert not policy.host_allowed("rebind.attacker.example")


@pytest.mark.parametrize("hosts, origins, message", [
    (("bad host",), (), "allowed host"), (("",), (), "allowed host"),
    ((), ("ops.example.com",), "allowed origin"), ((), ("https://ops.example.com/path",), "allowed origin"),
    ((), ("ftp://ops.example.com",), "allowed origin"),
])
def test_bad_entries_are_refused_naming_them(hosts: tuple, origins: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ExposurePolicy.build("127.0.0.1", hosts, origins)


def test_origins_are_normalized() -> None:
    policy = ExposurePolicy.build("127.0.0.1", (), ("HTTPS://Ops.Example.com:443", "http://127.0.0.1:3000"))
    assert policy.allowed_origins == ("https://ops.example.com", "http://127.0.0.1:3000")


def run(policy: ExposurePolicy, method: str, path: str, headers: dict[str, str], data: Any = None) \
        -> tuple[int, dict[str, str], Any, list[str]]:
    """One request to an app of one route that records what reached it."""
    reached: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        reached.append(request.method)
        return web.json_response({"ok": True})

    async def go() -> tuple[int, dict[str, str], Any]:
        app = web.Application(middlewares=[api.errors_middleware, exposure.middleware(policy)])
        app.on_response_prepare.append(exposure.cors_on_prepare(policy))
        app.router.add_route("POST", "/v1/thing", handle)
        app.router.add_route("GET", "/v1/thing", handle)
        async with TestClient(TestServer(app)) as client:
            resp = await client.request(method, path, headers=headers, data=data)
            return resp.status, dict(resp.headers), await resp.json(content_type=None)

    status, got, body = asyncio.run(go())
    return status, got, body, reached


def test_a_text_plain_body_is_415_naming_json() -> None:
    status, _, body, reached = run(LOOPBACK, "POST", "/v1/thing", {"Content-Type": "text/plain"}, b"{}")
    assert status == 415 and "application/json" in body["error"]["message"] and reached == []
    assert run(LOOPBACK, "POST", "/v1/thing", {"Content-Type": "application/json; charset=latin-1"},
               b"{}")[0] == 415
    assert run(LOOPBACK, "POST", "/v1/thing", {"Content-Type": "application/json; charset=UTF-8"}, b"{}")[0] == 200
    assert run(LOOPBACK, "POST", "/v1/thing", {}, None)[0] == 200, "no body, nothing to declare"


def test_a_foreign_origin_may_read_but_not_write() -> None:
    foreign = {"Origin": "https://evil.example", "Content-Type": "application/json"}
    status, headers, body, reached = run(LOOPBACK, "POST", "/v1/thing", foreign, b"{}")
    assert status == 403 and body["error"]["code"] == "cross_site" and reached == []
    assert "Access-Control-Allow-Origin" not in headers
    status, headers, _, _ = run(LOOPBACK, "GET", "/v1/thing", {"Origin": "https://evil.example"})
    assert status == 200 and "Access-Control-Allow-Origin" not in headers, "the page cannot read the answer"
    assert run(LOOPBACK, "POST", "/v1/thing", {"Sec-Fetch-Site": "cross-site"})[0] == 403
    assert run(LOOPBACK, "POST", "/v1/thing", {"Origin": "null"})[0] == 403


def test_the_nodes_own_origin_writes() -> None:
    own = {"Host": "localhost:8080", "Origin": "http://localhost:8080", "Sec-Fetch-Site": "same-origin"}
    status, _, _, reached = run(LOOPBACK, "POST", "/v1/thing", own)
    assert status == 200 and reached == ["POST"]
    assert run(LOOPBACK, "POST", "/v1/thing", {**own, "Origin": "http://localhost:3000"})[0] == 403


def test_a_listed_origin_gets_preflight_and_cors_headers() -> None:
    policy = ExposurePolicy.build("127.0.0.1", (), ("https://ops.example.com",))
    preflight = {"Origin": "https://ops.example.com", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"}
    status, headers, _, reached = run(policy, "OPTIONS", "/v1/thing", preflight)
    assert status == 204 and reached == []
    assert headers["Access-Control-Allow-Origin"] == "https://ops.example.com"
    assert headers["Access-Control-Allow-Methods"] == "GET, POST"
    assert "Content-Type" in headers["Access-Control-Allow-Headers"]
    status, headers, _, reached = run(policy, "POST", "/v1/thing", {
        "Origin": "https://ops.example.com", "Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"},
        b"{}")
    assert status == 200 and reached == ["POST"] and headers["Vary"] == "Origin"
    status, headers, _, _ = run(policy, "POST", "/v1/thing", {"Origin": "https://ops.example.com",
                                                              "Content-Type": "text/plain"}, b"x")
    assert status == 415 and headers["Access-Control-Allow-Origin"] == "https://ops.example.com"


def test_a_foreign_host_is_421_on_every_route() -> None:
    status, _, body, reached = run(LOOPBACK, "GET", "/v1/thing", {"Host": "rebind.attacker.example:8080"})
    assert status == 421 and "--allowed-hosts" in body["error"]["message"] and reached == []
