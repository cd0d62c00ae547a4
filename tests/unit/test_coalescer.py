import asyncio
from types import SimpleNamespace


from schedulerd.coalescer import Coalescer
from schedulerd.storage.ops import Op

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
    co = Coalescer(propose, Op.ACK, "acks", "results", 100, extra=lambda group, items: {"stamp": next(stamps)})

    async def main():
        await co.submit(GROUP, [1])
        await co.submit(GROUP, [2])

    run(main())
    assert seen == [0, 1]


def test_acks_with_large_results_share_entries_by_weight() -> None:
    """An entry of coalesced acks stays under ack_entry_weight_max * ack_weight_bytes of results."""
    from schedulerd.raft.conf import RaftConfig
    from schedulerd.config import NodeConfig
    from schedulerd.api.tasks import TaskCommits

    raft = FakeRaft()
    config = NodeConfig(raft=RaftConfig(self_addr="127.0.0.1:1", data_dir="/nonexistent"))
    commits = TaskCommits(SimpleNamespace(config=config, propose=raft.propose, clock=None))
    result = "r" * (2 * config.limits.ack_weight_bytes)  # weighs 3

    async def main():
        return await asyncio.gather(*(commits.acks.submit(GROUP, [[f"run-{i}", 1, result, "w"]])
                                      for i in range(1000)))

    run(main())
    assert sum(len(e) for e in raft.entries) == 1000
    limits = config.limits
    assert max(sum(len(item[2]) for item in e) for e in raft.entries) <= \
        limits.ack_entry_weight_max * limits.ack_weight_bytes
    assert max(len(e) for e in raft.entries) == limits.ack_entry_weight_max // 3


def test_several_workers_full_ack_batches_share_one_entry() -> None:
    """A node with one ack entry in flight commits every worker's batch in it, not one
    batch per commit: with room for one request per entry, a node's ack rate was its
    commit rate times ack_batch_max."""
    from schedulerd.raft.conf import RaftConfig
    from schedulerd.config import NodeConfig
    from schedulerd.api.tasks import TaskCommits

    raft = FakeRaft()
    config = NodeConfig(raft=RaftConfig(self_addr="127.0.0.1:1", data_dir="/nonexistent"))
    commits = TaskCommits(SimpleNamespace(config=config, propose=raft.propose, clock=None))
    batch = config.limits.ack_batch_max
    workers = config.limits.ack_entry_weight_max // batch

    async def main():
        return await asyncio.gather(*(commits.acks.submit(GROUP, [[f"run-{w}-{i}", 1, None, f"w{w}"]
                                                                  for i in range(batch)])
                                      for w in range(workers)))

    run(main())
    assert [len(e) for e in raft.entries] == [workers * batch]
