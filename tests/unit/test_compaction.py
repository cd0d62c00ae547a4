"""When the Raft log is compacted: the first time after a small journal (that copy is made
in the tick thread), afterwards never for a few entries and only once the journal weighs
its share of the last snapshot, and always at the journal ceiling."""
from __future__ import annotations

import pytest

from schedulerd.raft import compaction
from schedulerd.raft.conf import RaftConfig

MiB = 1 << 20
CONF = RaftConfig(self_addr="127.0.0.1:9000", compaction_entries_min=20_000, compaction_journal_ratio=0.25,
                  compaction_journal_bytes_max=128 * MiB)


def test_the_first_snapshot_comes_after_a_small_journal_whatever_the_entries() -> None:
    assert not compaction.due(50, MiB - 1, lambda: 0, CONF)
    assert compaction.due(50, MiB, lambda: 0, CONF)
    assert not compaction.due(50, MiB, lambda: 1, CONF)  # not a first one


def test_not_before_compaction_entries_min_however_small_the_snapshot() -> None:
    tiny = 4096
    assert not compaction.due(20_000, 10 * MiB, lambda: tiny, CONF)
    assert compaction.due(20_001, 10 * MiB, lambda: tiny, CONF)


def test_a_big_store_waits_for_a_journal_of_its_share() -> None:
    snapshot = 750 * MiB  # 1,000,000 jobs
    assert not compaction.due(200_000, 100 * MiB, lambda: snapshot, CONF)  # 20k entries no longer suffice
    small_snapshot = 20 * MiB
    assert compaction.due(20_001, 5 * MiB, lambda: small_snapshot, CONF)


def test_the_journal_ceiling_compacts_whatever_else_holds() -> None:
    assert compaction.due(500, 128 * MiB, lambda: 750 * MiB, CONF)
    assert not compaction.due(500, 128 * MiB - 1, lambda: 750 * MiB, CONF)


def test_ratio_zero_is_the_entries_rule_alone() -> None:
    conf = RaftConfig(self_addr="127.0.0.1:9000", compaction_entries_min=10, compaction_journal_ratio=0)
    assert compaction.due(11, 1, lambda: 10**9, conf)


@pytest.mark.parametrize("bad", [dict(compaction_journal_ratio=-0.1), dict(compaction_journal_ratio=11),
                                 dict(compaction_journal_bytes_max=MiB - 1)])
def test_out_of_range_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match="compaction_journal"):
        RaftConfig(self_addr="127.0.0.1:9000", **bad).validate()
