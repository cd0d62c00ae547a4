"""A job's http target: validated in full before anything is proposed."""
from __future__ import annotations

import pytest

from schedulerd.errors import InvalidJob, TooLarge
from schedulerd.limits import Limits
from schedulerd.targets import parse_target

LIMITS = Limits()


def test_a_minimal_target_gets_its_defaults() -> None:
    assert parse_target({"kind": "http", "url": "https://svc.internal/hook"}, LIMITS) == {
        "kind": "http", "url": "https://svc.internal/hook", "method": "POST", "headers": {}, "body": None,
        "timeout_s": None}
    assert parse_target(None, LIMITS) is None


@pytest.mark.parametrize("raw, message", [
    ({"kind": "shell", "url": "http://x"}, "kind"),
    ({"kind": "http", "url": "ftp://x/y"}, "http:// or https://"),
    ({"kind": "http", "url": "http:///path-only"}, "http:// or https://"),
    ({"kind": "http", "url": "http://x/" + "a" * 3000}, "2048"),
    ({"kind": "http", "url": "http://x", "method": "TRACE"}, "method"),
    ({"kind": "http", "url": "http://x", "headers": {"Idempotency-Key": "mine"}}, "not an allowed header"),
    ({"kind": "http", "url": "http://x", "headers": {"X-A": "a\r\nX-Injected: 1"}}, "line breaks"),
    ({"kind": "http", "url": "http://x", "headers": {"bad name": "v"}}, "not an allowed header"),
    ({"kind": "http", "url": "http://x", "body": {"json": True}}, "must be a string"),
    ({"kind": "http", "url": "http://x", "timeout_s": 0}, "timeout_s"),
    ({"kind": "http", "url": "http://x", "retries": 3}, "unknown field(s) in target: retries"),
])
def test_bad_targets_are_refused_with_what_is_allowed(raw: dict, message: str) -> None:
    with pytest.raises(InvalidJob, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_target(raw, LIMITS)


def test_a_body_over_the_payload_limit_is_too_large() -> None:
    with pytest.raises(TooLarge, match="payload_bytes_max"):
        parse_target({"kind": "http", "url": "http://x", "body": "x" * (LIMITS.payload_bytes_max + 1)}, LIMITS)
