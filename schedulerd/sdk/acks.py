"""The worker SDK's acks, batched: acks finishing while one request to a server
is in flight ride together in the next `POST /v1/tasks/ack`.

One request per ack made acks the largest share of a busy node's HTTP work and
of the worker's own CPU. An idle worker pays nothing: the first ack goes out at
once, and only acks that arrive while it travels wait for the next request."""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable
from urllib.parse import quote

from schedulerd.errors import InvalidRequest, TooLarge, from_wire
from schedulerd.sdk import wire

Post = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]

ACK_BATCH_MAX = wire.SERVER_LIMITS.ack_batch_max


class AckBatcher:
    def __init__(self, post: Post, worker_id: str, batch_max: int = ACK_BATCH_MAX) -> None:
        self._post = post
        self._worker_id = worker_id
        self._batch_max = batch_max
        self._pending: dict[str, list[tuple[dict[str, Any], asyncio.Future[None]]]] = {}
        self._sending: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks
        self.requests = 0

    def ack(self, server: str, run_id: str, fence: int, result: Any) -> asyncio.Future[None]:
        """Ack one run through `server` (failing over as `post` does). The future raises
        what the server said about this run (StaleFence, ...) or why the request failed.
        A future, not a coroutine: one frame fewer per task acked."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        item = {"run_id": run_id, "fence": fence, "result": result}
        self._pending.setdefault(server, []).append((item, fut))
        if server not in self._sending:
            self._sending.add(server)
            task = asyncio.create_task(self._send_all(server))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return fut

    async def _send_all(self, server: str) -> None:
        queue = self._pending[server]
        try:
            await asyncio.sleep(0)  # acks finishing in this loop turn join the first request
            while queue:
                batch, queue[:] = queue[: self._batch_max], queue[self._batch_max:]
                try:
                    await self._send(server, batch)
                except Exception as exc:  # whatever went wrong, no ack may wait forever
                    for _, fut in batch:
                        _settle(fut, exc)
        finally:
            self._sending.discard(server)

    async def _send(self, server: str, batch: list[tuple[dict[str, Any], asyncio.Future[None]]]) -> None:
        self.requests += 1
        try:
            data = await self._post(server, "/v1/tasks/ack", {"worker_id": self._worker_id,
                                                              "acks": [item for item, _ in batch]})
        except (InvalidRequest, TooLarge) as exc:
            if len(batch) == 1:
                _settle(batch[0][1], exc)
            else:
                # One item (an oversized result, say) refuses the whole request: send each
                # alone so only that one hears about it.
                await asyncio.gather(*(self._send_one(server, item, fut) for item, fut in batch))
            return
        except Exception as exc:
            for _, fut in batch:
                _settle(fut, exc)
            return
        results = data.get("results")
        if not isinstance(results, list) or len(results) != len(batch):
            for _, fut in batch:
                _settle(fut, InvalidRequest(f"{server}: malformed ack response"))
            return
        for (_, fut), r in zip(batch, results):
            error = r.get("error") if isinstance(r, dict) and not r.get("ok") else None
            _settle(fut, None if isinstance(r, dict) and r.get("ok")
                    else from_wire(str((error or {}).get("code", "error")), str((error or {}).get("message"))))

    async def _send_one(self, server: str, item: dict[str, Any], fut: asyncio.Future[None]) -> None:
        self.requests += 1
        path = f"/v1/tasks/{quote(item['run_id'], safe='')}/ack"
        try:
            await self._post(server, path, {"worker_id": self._worker_id, "fence": item["fence"],
                                            "result": item["result"]})
        except Exception as exc:
            _settle(fut, exc)
            return
        _settle(fut, None)


def _settle(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)
