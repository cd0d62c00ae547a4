"""The built-in HTTP executor: runs tasks whose job has an `http` target by
calling the URL. 2xx acks with the status and the start of the body; anything
else (a 3xx too: redirects are not followed), a timeout or a connection error nacks, so the run retries with backoff
and dead-letters after max_attempts.

Every call carries `Idempotency-Key: <job_id:scheduled_time>`, the same on every
retry and redelivery of one occurrence: the receiving service dedupes on it
(at-least-once delivery plus that key is how a handler gets effectively-once).
One connection pool serves all calls (keep-alive), sized to the concurrency."""
from __future__ import annotations

import json
from typing import Any

import aiohttp

from schedulerd.worker import Task

DEFAULT_TIMEOUT_S = 30.0
BODY_EXCERPT_BYTES = 512  # of the response, in the ack result or the nack error
USER_AGENT = "schedulerd-http-executor/1"
_BODYLESS = ("GET", "HEAD", "DELETE")


class TargetFailed(Exception):
    """The call did not succeed; the message is the nack's error text."""


class HttpExecutor:
    def __init__(self, concurrency: int, ssl: Any = None) -> None:
        self._concurrency = concurrency
        self._ssl = ssl
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, task: Task) -> dict[str, Any]:
        target = task.target
        if not target or target.get("kind") != "http":
            raise TargetFailed(f"job {task.job_id!r} has no http target; give it one "
                               '(target: {"kind": "http", "url": ...}) or run this queue with another worker')
        method = target.get("method") or "POST"
        headers = {"User-Agent": USER_AGENT, **(target.get("headers") or {}),
                   "Idempotency-Key": task.idempotency_key}
        body = target.get("body")
        if body is None and method not in _BODYLESS:
            body = json.dumps(task.payload, separators=(",", ":"))
            headers.setdefault("Content-Type", "application/json")
        timeout_s = target.get("timeout_s") or task.timeout_s or DEFAULT_TIMEOUT_S
        try:
            # A redirect is answered, not followed: following one would turn a POST into a
            # GET without its body on a 301/302 (and ack a call that never happened), and
            # carry the target's headers and the idempotency key to whatever host it names.
            async with self._client().request(method, target["url"], data=body, headers=headers,
                                              timeout=aiohttp.ClientTimeout(total=timeout_s),
                                              ssl=self._ssl, allow_redirects=False) as resp:
                excerpt = (await resp.content.read(BODY_EXCERPT_BYTES)).decode("utf-8", errors="replace")
                status = resp.status
                location = resp.headers.get("Location")
        except TimeoutError:
            raise TargetFailed(f"{method} {target['url']}: no answer within {timeout_s:g}s") from None
        except aiohttp.ClientError as exc:
            raise TargetFailed(f"{method} {target['url']}: {type(exc).__name__}: {exc}") from None
        if 200 <= status < 300:
            return {"status": status, "body": excerpt}
        if location is not None:
            raise TargetFailed(f"HTTP {status} from {method} {target['url']} to {location} (redirects are not "
                               "followed: give the target the final URL)")
        raise TargetFailed(f"HTTP {status} from {method} {target['url']}: {excerpt}")

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use, inside the worker's event loop.
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self._concurrency))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
