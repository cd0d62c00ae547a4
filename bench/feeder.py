"""Creating schedulerd jobs over HTTP for the bench: a plan's one-off jobs, each no
earlier than its lead before it is due (`feed_oneoff`), or a list of jobs as fast as
the server takes them (`create_jobs`). Requests go round-robin over the nodes; a
failed one moves to the next node with the same job ids (a retry after an unknown
outcome answers 409 for what already exists, counted as created)."""
from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from bench.common import BenchError, iso_us
from bench.plan import OneOff

QUEUE = "bench"
CREATE_ATTEMPTS_MAX = 20  # a job not created after this many 503s/timeouts is counted as failed
REQUEST_TIMEOUT_S = 30.0


class _Error(msgspec.Struct):
    code: str


class _Item(msgspec.Struct):
    ok: bool
    error: _Error | None = None


class _BatchAnswer(msgspec.Struct):
    """What the feeder reads of a batch create's answer: each job's outcome (it asks for no
    views; parsing them with json took the bench process a tenth of a core at 10,000 jobs/s)."""

    results: list[_Item]


_BATCH_ANSWER = msgspec.json.Decoder(_BatchAnswer)
_ENCODER = msgspec.json.Encoder()
# Outcomes only: the views a batch create answers with by default cost the serving node
# ~4 µs of CPU per job, which the cluster under test then lacked on this 2-core box.
_HEADERS = {"Content-Type": "application/json", "Prefer": "return=minimal"}


@dataclass
class CreateStats:
    created: int = 0
    failed: int = 0
    retries: int = 0
    late: int = 0  # jobs whose create answer came after their due time
    request_latency_s: list[float] = field(default_factory=list)


async def _post_jobs(session: aiohttp.ClientSession, urls: list[str], first: int, jobs: list[dict[str, Any]],
                     dues: list[float], stats: CreateStats) -> None:
    """Create jobs (one request, batch when more than one) on urls[first]; a 5xx or a dead
    node moves the retry to the next node, with the same ids, so a retry after an unknown
    outcome answers 409 for what already exists."""
    path, body = ("/v1/jobs:batch", {"jobs": jobs}) if len(jobs) > 1 else ("/v1/jobs", jobs[0])
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    data = _ENCODER.encode(body)
    for attempt in range(CREATE_ATTEMPTS_MAX):
        t0 = time.monotonic()
        try:
            url = urls[(first + attempt) % len(urls)]
            async with session.post(url + path, data=data, headers=_HEADERS, timeout=timeout) as resp:
                answer = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError):
            status, answer = 599, b""
        done = time.time()
        if status in (200, 201) or (status == 409 and len(jobs) == 1):
            stats.request_latency_s.append(time.monotonic() - t0)
            ok = [r.ok or (r.error is not None and r.error.code == "conflict")
                  for r in _BATCH_ANSWER.decode(answer).results] if len(jobs) > 1 else [True]
            stats.created += sum(ok)
            stats.failed += len(ok) - sum(ok)
            stats.late += sum(1 for d in dues if done > d)
            return
        if status < 500 and status != 599:
            raise BenchError(f"create refused: HTTP {status} {answer[:500]!r}")
        stats.retries += 1
        await asyncio.sleep(min(1.0, 0.02 * 2 ** attempt))
    stats.failed += len(jobs)


def job_body(job_id: str, schedule: dict[str, Any]) -> dict[str, Any]:
    return {"job_id": job_id, "schedule": schedule, "queue": QUEUE}


async def feed_oneoff(urls: list[str], plan: OneOff, batch: int, in_flight: int) -> CreateStats:
    """Create plan's jobs in due order, each no earlier than due - lead_s, round-robin over nodes."""
    stats = CreateStats()
    sem = asyncio.Semaphore(in_flight)
    tick_s = 0.02
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=in_flight)) as session:
        pending: set[asyncio.Task[None]] = set()

        async def send(first: int, lo: int, hi: int) -> None:
            try:
                dues = [plan.due(k) for k in range(lo, hi)]
                jobs = [job_body(plan.job_id(k), {"at": iso_us(d)}) | plan.fields(k)
                        for k, d in zip(range(lo, hi), dues)]
                await _post_jobs(session, urls, first, jobs, dues, stats)
            finally:
                sem.release()

        i, rr = 0, 0
        while i < plan.count:
            horizon = time.time() + tick_s
            j = i
            while j < plan.count and plan.submit_at(j) <= horizon:
                j += 1
            if j == i:
                await asyncio.sleep(max(0.0, min(tick_s, plan.submit_at(i) - time.time())))
                continue
            for lo in range(i, j, batch):
                await sem.acquire()
                task = asyncio.create_task(send(rr, lo, min(j, lo + batch)))
                pending.add(task)
                task.add_done_callback(pending.discard)
                rr += 1
            i = j
        if pending:
            await asyncio.gather(*pending)
    return stats


async def create_jobs(urls: list[str], bodies: list[dict[str, Any]], batch: int, in_flight: int) -> CreateStats:
    """Create the given jobs as fast as possible (create scenario, cron jobs, scale fill)."""
    stats = CreateStats()
    sem = asyncio.Semaphore(in_flight)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=in_flight)) as session:
        async def send(first: int, jobs: list[dict[str, Any]]) -> None:
            async with sem:
                await _post_jobs(session, urls, first, jobs, [math.inf] * len(jobs), stats)
        await asyncio.gather(*(send(k, bodies[lo:lo + batch])
                               for k, lo in enumerate(range(0, len(bodies), batch))))
    return stats
