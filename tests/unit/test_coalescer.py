import asyncio
from types import SimpleNamespace


from schedulerd.coalescer import Coalescer
from storage.ops import Op

GROUP = SimpleNamespace(group_id=0)


class FakeRaft:
    """Commits take a while (like Raft); records each entry's items."""

    def __init__(self, fail: bool = False) -> None:
        self.entries: list[list] = []
        self.fail = fail

    async def propose(self, group, op, payload):
        await asyncio.sleep(0.01)
        if self.fail:
            raise RuntimeError("no quorum")
        self.entries.append(payload["acks"])
        return {"results": [f"ok:{item}" for item in payload["acks"]]}


def run(coro):
    return asyncio.run(coro)


def test_concurrent_requests_share_entries_and_get_their_own_results() -> None:
    raft = FakeRaft()
    co = Coalescer(raft.propose, Op.ACK, "acks", "results", 100)

    async def main():
        return await asyncio.gather(*(co.submit(GROUP, [i, i + 100]) for i in range(20)))

    results = run(main())
    assert results == [[f"ok:{i}", f"ok:{i + 100}"] for i in range(20)]
    assert len(raft.entries) <= 2, raft.entries  # the first alone at most, then everyone who queued
    assert co.items == 40


def test_weight_limit_splits_entries() -> None:
    raft = FakeRaft()
    co = Coalescer(raft.propose, Op.ACK, "acks", "results", 5)

    async def main():
        return await asyncio.gather(*(co.submit(GROUP, [i, i, i]) for i in range(4)))

    run(main())
    assert all(len(entry) <= 5 for entry in raft.entries) and len(raft.entries) == 4


def test_a_failed_commit_fails_every_request_in_it() -> None:
    co = Coalescer(FakeRaft(fail=True).propose, Op.ACK, "acks", "results", 100)

    async def main():
        return await asyncio.gather(*(co.submit(GROUP, [i]) for i in range(3)), return_exceptions=True)

    assert all(isinstance(r, RuntimeError) for r in run(main()))


def test_extra_fields_are_computed_per_entry() -> None:
    seen = []

    async def propose(group, op, payload):
        seen.append(payload["stamp"])
        return {"results": payload["acks"]}

    stamps = iter(range(100))
    co = Coalescer(propose, Op.ACK, "acks", "results", 100, extra=lambda: {"stamp": next(stamps)})

    async def main():
        await co.submit(GROUP, [1])
        await co.submit(GROUP, [2])

    run(main())
    assert seen == [0, 1]
