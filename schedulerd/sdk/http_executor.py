"""The built-in HTTP executor: runs tasks whose job has an `http` target by
calling the URL. 2xx acks with the status and the start of the body; anything
else (a 3xx too: redirects are not followed), a timeout or a connection error nacks, so the run retries with backoff
and dead-letters after max_attempts.

Every call carries `Idempotency-Key: <job_id:scheduled_time>`, the same on every
retry and redelivery of one occurrence: the receiving service dedupes on it
(at-least-once delivery plus that key is how a handler gets effectively-once).
One connection pool serves all calls (keep-alive), sized to the concurrency.

Unless told otherwise, the executor refuses destinations of the node's default
policy (schedulerd/destinations.py): a URL's literal host before the call, and
every address a name resolves to before it connects, so a name that resolves to
a metadata or loopback address is refused too."""
from __future__ import annotations

import json
import socket
from typing import Any

import aiohttp

from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from schedulerd.destinations import DestinationPolicy, DestinationRefused
from schedulerd.sdk.worker import Task

DEFAULT_TIMEOUT_S = 30.0
BODY_EXCERPT_BYTES = 512  # of the response, in the ack result or the nack error
USER_AGENT = "schedulerd-http-executor/1"
_BODYLESS = ("GET", "HEAD", "DELETE")


class TargetFailed(Exception):
    """The call did not succeed; the message is the nack's error text."""


REFUSED_HINT = "schedctl worker http --allow-private-targets opens it for a local test"


class PolicyResolver(AbstractResolver):
    """The default resolver, refusing a name when any address it resolves to is refused:
    these are the addresses the connector then connects to."""

    def __init__(self, policy: DestinationPolicy, inner: AbstractResolver | None = None) -> None:
        self._policy = policy
        self._inner = inner or aiohttp.DefaultResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) \
            -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            reason = self._policy.refusal(result["host"])
            if reason is not None:
                raise DestinationRefused(f"{host} resolves to {reason}")
        return results

    async def close(self) -> None:
        await self._inner.close()


class HttpExecutor:
    def __init__(self, concurrency: int, ssl: Any = None, policy: DestinationPolicy | None = None) -> None:
        """policy None: any destination (--allow-private-targets)."""
        self._concurrency = concurrency
        self._ssl = ssl
        self._policy = policy
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
            self._check_literal(target["url"])
            # A redirect is answered, not followed: following one would turn a POST into a
            # GET without its body on a 301/302 (and ack a call that never happened), and
            # carry the target's headers and the idempotency key to whatever host it names.
            async with self._client().request(method, target["url"], data=body, headers=headers,
                                              timeout=aiohttp.ClientTimeout(total=timeout_s),
                                              ssl=self._ssl, allow_redirects=False) as resp:
                excerpt = (await resp.content.read(BODY_EXCERPT_BYTES)).decode("utf-8", errors="replace")
                status = resp.status
                location = resp.headers.get("Location")
        except DestinationRefused as exc:
            raise TargetFailed(f"{method} {target['url']}: refused: {exc}; {REFUSED_HINT}") from None
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

    def _check_literal(self, url: str) -> None:
        """A literal address or a refused name never reaches the resolver: judge it here."""
        if self._policy is None:
            return
        reason = self._policy.refusal(URL(url).raw_host or "")
        if reason is not None:
            raise DestinationRefused(reason)

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use, inside the worker's event loop.
        if self._session is None:
            resolver = PolicyResolver(self._policy) if self._policy is not None else None
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self._concurrency,
                                                                                 resolver=resolver))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
