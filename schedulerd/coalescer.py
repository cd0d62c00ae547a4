"""Group commit for worker traffic: concurrent requests of one kind become one
Raft entry per group.

Acks, heartbeats and leases arrive from many workers at once; one entry each
would cap throughput at the Raft commit rate (a few hundred to a thousand
entries/s here). Each kind has one coalescer: while an entry of that kind is
being committed for a group, new requests queue, and the next entry carries
them all. An idle system pays no added latency: the first request goes out at
once."""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from schedulerd.raft.group import Group
from schedulerd.storage.ops import Op

Propose = Callable[[Group, Op, dict[str, Any]], Awaitable[dict[str, Any]]]
# The entry's other fields, from its group and its items, as it is proposed.
Extra = Callable[[Group, list[Any]], dict[str, Any]]


def _no_extra(group: Group, items: list[Any]) -> dict[str, Any]:
    return {}


class Coalescer:
    def __init__(self, propose: Propose, op: Op, items_field: str, results_field: str, max_weight: int,
                 extra: Extra = _no_extra, weight: Callable[[Any], int] = lambda item: 1) -> None:
        self._propose = propose
        self._op = op
        self._items_field = items_field
        self._results_field = results_field
        self._max_weight = max_weight
        self._extra = extra
        self._weight = weight
        self._pending: dict[int, list[tuple[list[Any], asyncio.Future[list[Any]]]]] = {}
        self._flushing: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks
        self.entries = 0
        self.items = 0

    async def submit(self, group: Group, items: list[Any]) -> list[Any]:
        """Commit items (in one entry with others'), returning their results in order."""
        fut: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(group.group_id, []).append((items, fut))
        if group.group_id not in self._flushing:
            self._flushing.add(group.group_id)
            task = asyncio.create_task(self._flush(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await fut

    async def _flush(self, group: Group) -> None:
        queue = self._pending[group.group_id]
        try:
            await asyncio.sleep(0)  # requests handled in this same loop turn join the first entry
            while queue:
                batch = [queue.pop(0)]
                size = self._size(batch[0][0])
                while queue and size + self._size(queue[0][0]) <= self._max_weight:
                    size += self._size(queue[0][0])
                    batch.append(queue.pop(0))
                await self._commit(group, batch)
        finally:
            self._flushing.discard(group.group_id)

    def _size(self, items: list[Any]) -> int:
        return sum(self._weight(item) for item in items)

    async def _commit(self, group: Group, batch: list[tuple[list[Any], asyncio.Future[list[Any]]]]) -> None:
        items = [item for part, _ in batch for item in part]
        try:
            result = await self._propose(group, self._op, {self._items_field: items, **self._extra(group, items)})
        except Exception as exc:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        self.entries += 1
        self.items += len(items)
        results = result[self._results_field]
        start = 0
        for part, fut in batch:
            if not fut.done():
                fut.set_result(results[start:start + len(part)])
            start += len(part)
