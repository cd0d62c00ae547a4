"""A job's `target`: what runs it without worker code. Only `http` exists: the
built-in executor (`schedctl worker http`) calls the URL for each run.

    "target": {"kind": "http", "url": "https://billing.internal/close-day",
               "method": "POST", "headers": {"Authorization": "Bearer ..."},
               "body": "...", "timeout_s": 30}

Without `body`, the job's payload is sent as JSON (methods that carry a body)."""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from schedulerd.destinations import DestinationPolicy
from schedulerd.errors import InvalidJob, TooLarge
from schedulerd.limits import Limits

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
URL_CHARS_MAX = 2048
HEADERS_MAX = 32
HEADER_CHARS_MAX = 1024
TIMEOUT_S_MAX = 3600
URL_PATTERN = "^[hH][tT][tT][pP][sS]?://[!-~]+$"
_URL = re.compile(URL_PATTERN.removesuffix("$") + r"\Z")
HEADER_NAME_PATTERN = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$"
_HEADER_NAME = re.compile(HEADER_NAME_PATTERN.removesuffix("$") + r"\Z")
# Set by the executor: a job may not override the key the handler dedupes on.
RESERVED_HEADERS = frozenset({"idempotency-key", "content-length", "host", "transfer-encoding"})


def parse_target(raw: Any, limits: Limits) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("kind") != "http":
        raise InvalidJob('target must be {"kind": "http", "url": ..., "method", "headers", "body", "timeout_s"}')
    unknown = sorted(raw.keys() - {"kind", "url", "method", "headers", "body", "timeout_s"})
    if unknown:
        raise InvalidJob(f"unknown field(s) in target: {', '.join(unknown)}; "
                         "allowed: kind, url, method, headers, body, timeout_s")
    url = raw.get("url")
    try:
        parts = urlsplit(url) if isinstance(url, str) else None
    except ValueError:  # "http://[": an unclosed IPv6 bracket
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or len(url) > URL_CHARS_MAX \
            or not _URL.match(url):
        raise InvalidJob(f"target.url must be an http:// or https:// URL of at most {URL_CHARS_MAX} printable "
                         "ASCII characters (percent-encode others; an international name in punycode)")
    method = raw.get("method", "POST")
    if method not in METHODS:
        raise InvalidJob(f"target.method must be one of {', '.join(METHODS)}")
    target: dict[str, Any] = {"kind": "http", "url": url, "method": method,
                              "headers": _headers(raw.get("headers", {})), "body": None, "timeout_s": None}
    body = raw.get("body")
    if body is not None:
        if not isinstance(body, str):
            raise InvalidJob("target.body must be a string (leave it out to send the job's payload as JSON)")
        if len(body.encode()) > limits.payload_bytes_max:
            raise TooLarge(f"target.body is {len(body.encode())} bytes; payload_bytes_max is "
                           f"{limits.payload_bytes_max}")
        target["body"] = body
    timeout = raw.get("timeout_s")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= TIMEOUT_S_MAX:
            raise InvalidJob(f"target.timeout_s must be a number of seconds in (0, {TIMEOUT_S_MAX}]")
        target["timeout_s"] = float(timeout)
    return target


def check_destination(target: dict[str, Any] | None, policy: DestinationPolicy) -> None:
    """Refuse a parsed target whose URL names a refused destination literally (the
    executor checks the addresses a name resolves to when it calls)."""
    if target is None:
        return
    reason = policy.refusal(urlsplit(target["url"]).hostname or "")
    if reason is not None:
        raise InvalidJob(f"target.url: {reason}; the node's --target-allow opens it on purpose")


def _headers(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict) or len(raw) > HEADERS_MAX:
        raise InvalidJob(f"target.headers must be an object of at most {HEADERS_MAX} name: value strings")
    for name, value in raw.items():
        if not _HEADER_NAME.match(name) or name.lower() in RESERVED_HEADERS:
            raise InvalidJob(f"target.headers: {name!r} is not an allowed header name "
                             f"(the executor sets {', '.join(sorted(RESERVED_HEADERS))})")
        if not isinstance(value, str) or len(value) > HEADER_CHARS_MAX or "\r" in value or "\n" in value:
            raise InvalidJob(f"target.headers[{name!r}] must be a string of at most {HEADER_CHARS_MAX} "
                             "characters without line breaks")
    return dict(raw)
