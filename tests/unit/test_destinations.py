"""The destination policy of http targets: what is refused by default, in every
spelling of an address, and how an operator widens or narrows it."""
from __future__ import annotations

import asyncio
import socket
from datetime import datetime, timezone

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from schedulerd.destinations import DEFAULT_DENY, DestinationPolicy, DestinationRefused, address_of
from schedulerd.errors import InvalidJob
from schedulerd.sdk.http_executor import HttpExecutor, PolicyResolver, TargetFailed
from schedulerd.sdk.worker import Task
from schedulerd.targets import check_destination

DEFAULT = DestinationPolicy()


@pytest.mark.parametrize("host, rule", [
    ("169.254.169.254", "169.254.0.0/16"), ("127.0.0.1", "127.0.0.0/8"), ("127.9.9.9", "127.0.0.0/8"),
    ("0.0.0.0", "0.0.0.0/8"), ("[::1]", "::1/128"), ("::", "::/128"), ("fe80::1", "fe80::/10"),
    ("fd00:ec2::254", "fd00:ec2::254/128"), ("100.100.100.200", "100.100.100.200/32"),
    # Spellings a resolver takes as the same address.
    ("2130706433", "127.0.0.0/8"), ("0x7f.1", "127.0.0.0/8"), ("0177.0.0.1", "127.0.0.0/8"),
    ("::ffff:169.254.169.254", "169.254.0.0/16"), ("[::ffff:127.0.0.1]", "127.0.0.0/8"),
    # Names that mean loopback or metadata wherever they resolve.
    ("localhost", "localhost"), ("LOCALHOST.", "localhost"), ("api.localhost", ".localhost"),
    ("metadata.google.internal", "metadata.google.internal"),
])
def test_the_default_refuses_loopback_link_local_and_metadata(host: str, rule: str) -> None:
    reason = DEFAULT.refusal(host)
    assert reason is not None and f"refused destination {rule} " in reason


@pytest.mark.parametrize("host", ["10.0.0.5", "192.168.1.10", "billing.internal", "example.com", "2001:db8::1",
                                  "cafe.be", "169.254.example.com", "fd00::1"])
def test_other_destinations_pass_by_default(host: str) -> None:
    assert DEFAULT.refusal(host) is None


def test_allow_opens_a_range_and_deny_closes_one() -> None:
    policy = DestinationPolicy.build(allow=("127.0.0.0/8",), deny=("10.0.0.0/8", ".corp.example.com"))
    assert policy.refusal("127.0.0.1") is None
    assert policy.refusal("169.254.169.254") is not None, "allowing loopback leaves metadata refused"
    assert "listed with --target-deny" in (policy.refusal("10.1.2.3") or "")
    assert policy.refusal("db.corp.example.com") is not None and policy.refusal("corp.example.com") is not None
    assert policy.refusal("corp.example.com.evil.net") is None
    assert DestinationPolicy.build(allow=("localhost",)).refusal("localhost") is None


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "not a host", "", "a..b", "http://x"])
def test_a_bad_policy_entry_is_refused_naming_it(entry: str) -> None:
    with pytest.raises(ValueError, match="target policy entry"):
        DestinationPolicy.build(deny=(entry,))


def test_address_of_reads_literal_forms_only() -> None:
    assert str(address_of("2130706433")) == "127.0.0.1"
    assert str(address_of("[fe80::1]")) == "fe80::1"
    assert address_of("example.com") is None
    assert set(DEFAULT_DENY) >= {"169.254.0.0/16", "fe80::/10", "127.0.0.0/8", "::1/128", "fd00:ec2::254/128",
                                 "100.100.100.200/32"}


def test_a_create_or_update_names_the_rule_and_the_way_to_open_it() -> None:
    target = {"kind": "http", "url": "http://169.254.169.254/latest/meta-data/"}
    with pytest.raises(InvalidJob, match=r"169.254.0.0/16 .*--target-allow"):
        check_destination(target, DEFAULT)
    check_destination({"kind": "http", "url": "https://billing.internal/close"}, DEFAULT)
    check_destination(None, DEFAULT)


class FakeResolver(AbstractResolver):
    def __init__(self, addresses: dict[str, list[str]]) -> None:
        self.addresses = addresses

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) \
            -> list[ResolveResult]:
        return [{"hostname": host, "host": a, "port": port, "family": family, "proto": 0, "flags": 0}
                for a in self.addresses[host]]

    async def close(self) -> None:
        pass


def test_the_executor_judges_every_address_a_name_resolves_to() -> None:
    resolver = PolicyResolver(DEFAULT, FakeResolver({"innocent.example": ["93.184.216.34", "169.254.169.254"],
                                                     "fine.example": ["93.184.216.34"]}))

    async def go() -> None:
        assert [r["host"] for r in await resolver.resolve("fine.example", 80)] == ["93.184.216.34"]
        with pytest.raises(DestinationRefused, match="innocent.example resolves to 169.254.169.254"):
            await resolver.resolve("innocent.example", 80)

    asyncio.run(go())


def test_the_executor_refuses_a_literal_address_before_connecting() -> None:
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    task = Task(run_id="r1", job_id="j", queue="q", scheduled_time=at, attempt=1, fence=1,
                idempotency_key="j:2026-01-01T00:00:00Z", lease_until=at, payload=None,
                target={"kind": "http", "url": "http://[::ffff:7f00:1]:9/x"}, timeout_s=None)

    async def go() -> None:
        executor = HttpExecutor(1, policy=DEFAULT)
        try:
            with pytest.raises(TargetFailed, match=r"refused: .*127.0.0.0/8.*--allow-private-targets"):
                await executor(task)
        finally:
            await executor.close()

    asyncio.run(go())
