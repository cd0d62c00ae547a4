"""One HTTP request to one node, classified the way a history needs it.

The harness does not use schedulerd.sdk.client: it must see every single attempt
(which node, when sent, when answered, what came back) to tell a definite
failure from an unknown outcome, and the library's failover hides that."""
from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping
from urllib.parse import urlsplit

CONNECT_TIMEOUT_S = 2.0

OK, FAIL, UNKNOWN = "ok", "fail", "unknown"


@dataclass
class Reply:
    status: int | None  # None: no HTTP answer
    body: Any  # parsed JSON, or None
    error: str | None  # transport problem or the server's error code
    sent: float  # harness clock (time.time()) when the request was started
    done: float  # ... and when it ended
    connected: bool  # the request may have reached the server

    @property
    def outcome(self) -> str:
        """ok / fail (nothing changed, certainly) / unknown (may have been applied)."""
        if self.status is not None and 200 <= self.status < 300:
            return OK
        if self.status is None:
            return UNKNOWN if self.connected else FAIL
        # 503 unavailable is documented as "not committed"; outcome_unknown is not.
        if self.status == 503:
            return FAIL if self.error == "unavailable" else UNKNOWN
        if 400 <= self.status < 500:
            return FAIL
        return UNKNOWN  # a 500 says nothing about whether the write landed

    def code(self) -> str | None:
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            return str(self.body["error"].get("code"))
        return None


def request(method: str, url: str, body: Any = None, headers: Mapping[str, str] | None = None,
            timeout_s: float = 8.0) -> Reply:
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    data = None if body is None else json.dumps(body).encode()
    hdrs = {"Accept": "application/json", **(headers or {})}
    if data is not None:
        hdrs["Content-Type"] = "application/json"
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=CONNECT_TIMEOUT_S)
    sent = time.time()
    connected = False
    try:
        conn.connect()
        connected = True
        conn.sock.settimeout(timeout_s)
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        reply = Reply(resp.status, parsed, None, sent, time.time(), True)
        if resp.status >= 400:
            reply.error = reply.code() or f"http_{resp.status}"
        return reply
    except (OSError, http.client.HTTPException) as exc:
        return Reply(None, None, f"{type(exc).__name__}: {exc}", sent, time.time(), connected)
    finally:
        conn.close()


def get_json(url: str, timeout_s: float = 5.0) -> Any:
    """GET that must succeed (final reads): raises on anything but 200."""
    reply = request("GET", url, timeout_s=timeout_s)
    if reply.status != 200:
        raise RuntimeError(f"GET {url}: {reply.status} {reply.error}")
    return reply.body


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def iso_us(us: int) -> str:
    """Integer epoch microseconds -> ISO 8601 UTC (what the API takes)."""
    return datetime.fromtimestamp(us // 1_000_000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + \
        f".{us % 1_000_000:06d}Z"


def parse_us(text: str) -> int:
    """ISO 8601 UTC as the daemon writes it -> integer epoch microseconds. Occurrences
    are keyed on this integer: floats would lose the last microsecond digit."""
    delta = datetime.fromisoformat(text.replace("Z", "+00:00")) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
