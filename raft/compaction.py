"""When a Raft group compacts its log into a snapshot.

A snapshot copies the whole store; what it saves is the journal written since
the last one. pysyncobj's rule (every N entries, or every T seconds) ignores the
first: at 300 jobs/s a group writes ~300 entries/s, so with 1,000,000 jobs in
the store every replica copied 750 MB about once a minute to drop a journal of a
few MB. Here a compaction also waits until the journal weighs a share of the
last snapshot, as Redis sizes its AOF rewrites: the bytes copied stay
proportional to the bytes journaled, whatever the store's size. The first
snapshot comes early instead, after a small journal, since it is the one copy
made in the tick thread (raft/snapshot_writer.py). A ceiling on
the journal bounds what a restart reads back and what the journal holds in
memory (pysyncobj keeps every entry since the snapshot there)."""
from __future__ import annotations

from typing import Callable

from schedulerd.raft.conf import RaftConfig

# A data dir's first snapshot comes once the journal holds this much: it is copied in
# the tick thread by every replica at the same index, and taken by the rules below, a
# busy new cluster's first copy held all three nodes' ticks for 0.76 s at once.
FIRST_SNAPSHOT_JOURNAL_BYTES = 1 << 20


def due(entries: int, journal_bytes: int, snapshot_bytes: Callable[[], int], conf: RaftConfig) -> bool:
    """Compact now? `snapshot_bytes` gives the last snapshot's size (0 before the first);
    it is asked only when the other conditions hold (the tick calls this every time)."""
    if journal_bytes >= conf.compaction_journal_bytes_max:
        return True
    if entries > conf.compaction_entries_min:
        return journal_bytes >= conf.compaction_journal_ratio * snapshot_bytes()
    # The first copy holds the tick thread (raft/snapshot_writer.py): make it while the store is small.
    return journal_bytes >= FIRST_SNAPSHOT_JOURNAL_BYTES and snapshot_bytes() == 0
