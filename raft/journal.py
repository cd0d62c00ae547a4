"""A durable Raft log for pysyncobj 0.3.17.

pysyncobj's FileJournal is an mmap that is never msynced while the node runs,
and its meta file is renamed into place without fsync: an acknowledged job
survives kill -9 (page cache) but not power loss (upstream issue #84).
DurableJournal keeps pysyncobj's Journal interface on append-only segment files
that we fsync (raft/segments.py); raft/pysyncobj_patches.py's `make_durable` calls `sync()` at the two moments
where Raft counts a copy: before the leader counts itself, and before a follower
answers. `<journal>.meta` is msgpack {"term", "voted_for", "commit_index",
"first_index"}, replaced atomically with fsyncs.

Log compaction (`deleteEntriesTo`) rewrites nothing. It starts a new segment,
notes the new first index for the next meta write, and deletes the segments
holding only dropped entries beside the tick thread. The segment with the first kept
entry keeps dropped ones at its head until a later compaction deletes it, and
loading skips them. Rewriting the kept entries into a new file instead held the
tick thread ~350 ms per compaction at 300 jobs/s (31 MB kept): a pause in every
commit, and on a leader sometimes an election.

Loading also skips entries below `keep_from`, the first entry the node's snapshot
needs (raft/group.py reads it from the snapshot). A kill -9 after a new snapshot
was renamed into place but before the journal was compacted otherwise left a
journal whose head did not match the snapshot, and pysyncobj answers that by
clearing the journal: entries this node had acknowledged, gone.

pysyncobj calls a journal only from its tick thread, so there is no locking.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pysyncobj.journal

from schedulerd.raft import fileio, pysyncobj_patches, segments
from schedulerd.raft.segments import MAGIC, Entry, JournalError
from schedulerd.storage import codec

log = logging.getLogger(__name__)

__all__ = ["MAGIC", "DurableJournal", "JournalError", "install", "journal_for"]


Loc = tuple[int, int]  # (segment number, offset of the entry's record in it)
# A segment takes no more appends once it holds this much. Compaction frees whole
# segments, and freeing a file costs the disk in proportion to its size: on a disk
# mounted with `discard` a 128 MiB unlink held a concurrent fdatasync for 65 ms, an
# 8 MiB one for ~4 ms (raft/segments.remove_beside spaces them out).
SEGMENT_BYTES = 8 << 20


@dataclass(slots=True)
class SyncStats:
    """fdatasync calls on the journal file, for metrics."""

    count: int = 0
    time_s_total: float = 0.0
    time_s_last: float = 0.0
    time_s_max: float = 0.0
    on_record: Callable[[float], None] | None = field(default=None, repr=False, compare=False)

    def summary(self) -> dict[str, float]:
        return {"count": self.count, "time_s_total": self.time_s_total, "time_s_last": self.time_s_last,
                "time_s_max": self.time_s_max}

    def record(self, time_s: float) -> None:
        if self.on_record is not None:
            self.on_record(time_s)
        self.count += 1
        self.time_s_total += time_s
        self.time_s_last = time_s
        self.time_s_max = max(self.time_s_max, time_s)


class DurableJournal(pysyncobj.journal.Journal):
    """pysyncobj's Journal on fsynced append-only segment files (format: raft/segments.py)."""

    def __init__(self, path: str, keep_from: int = 0, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.path = os.path.abspath(path)
        self.meta_path = self.path + ".meta"
        self.stats = SyncStats()
        # Set once a write or fsync failed. Never retried: after a failed fsync
        # Linux may drop the dirty pages, and a retry would report success.
        self.error: JournalError | None = None
        # Called once with the error when the journal becomes unusable (the owner stops the node).
        self.on_error: Callable[[JournalError], None] | None = None
        self._entries: list[Entry] = []
        self._locs: list[Loc] = []  # where each entry's record is
        self._segment_bytes = segment_bytes
        self._seqs: list[int] = []  # the segments on disk, in order
        self._active = 0  # the segment appends go to; the last one, but while in limbo
        self._fd, self._fd_seq = -1, -1  # the one open (flocked) segment, normally the active one
        self._end = len(MAGIC)  # where the next record goes in the active segment
        # Entries deleteEntriesFrom dropped whose records are still on disk from _end
        # on (in the active segment and any after it): see deleteEntriesFrom.
        self._limbo: list[tuple[Entry, Loc]] = []
        self._live_bytes = 0
        self._dirty = False
        self._dir_dirty = False  # a segment was created since the directory was last synced
        self._durable_index = 0
        self._term, self._voted_for, self._commit_index, self._first_index = _read_meta(self.meta_path)
        try:
            self._load(max(keep_from, self._first_index))
        except BaseException:
            self._close_files()
            raise
        self._meta_dirty = False

    def add(self, command: bytes, idx: int, term: int) -> None:
        """Append without fsync; `sync()` makes it durable."""
        if not isinstance(command, bytes):
            raise TypeError(f"journal command must be bytes, not {type(command).__name__}")
        self._check_usable()
        self._check_next_idx(idx)
        entry = (command, idx, term)
        if self._limbo and self._limbo[0][0] == entry:
            # pysyncobj re-sends entries this follower already holds: the bytes on
            # disk are that very record, durable since before; take it back as is.
            _, (seq, offset) = self._limbo.pop(0)
            self._active = seq
            self._append(entry, (seq, offset))
            return
        self._drop_limbo()
        if self._end >= self._segment_bytes:
            self.sync()  # a segment stops taking appends whole
            self._rotate(self._seqs[-1] + 1)
        self._os(segments.pwrite_all, self._active_fd(), segments.encode(command, idx, term), self._end)
        self._append(entry, (self._active, self._end))
        self._dirty = True

    def _append(self, entry: Entry, loc: Loc) -> None:
        self._entries.append(entry)
        self._locs.append(loc)
        size = segments.record_bytes(entry)
        self._end = loc[1] + size
        self._live_bytes += size

    def clear(self) -> None:
        self.deleteEntriesFrom(0)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """Drop entries [entryFrom:] (a follower's conflicting suffix).

        pysyncobj 0.3.17 also calls this for suffixes that do not conflict: a late
        ack rewinds the leader's nextIndex, and the follower deletes from there
        and receives the same entries again. Truncating the file at once would
        leave entries this node already acknowledged off the disk until the next
        sync. So the dropped records stay on disk in limbo: an identical re-add
        takes its record back, anything else (or the next sync) cuts the file
        there and deletes the segments after it. Until then the disk holds exactly
        a log this node had made durable."""
        self._check_usable()
        start = slice(entryFrom, None).indices(len(self._entries))[0]
        if start == len(self._entries):
            return
        self._limbo[:0] = zip(self._entries[start:], self._locs[start:])
        self._active, self._end = self._locs[start]
        self._live_bytes -= sum(map(segments.record_bytes, self._entries[start:]))
        del self._entries[start:]
        del self._locs[start:]
        self._dirty = True

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Drop entries [:entryTo] (log compaction) without rewriting any (module doc)."""
        self._check_usable()
        if entryTo <= 0:
            return
        self._drop_limbo()
        last = self._seqs[-1]
        first_kept_seq = self._locs[entryTo][0] if entryTo < len(self._entries) else last
        self._live_bytes -= sum(map(segments.record_bytes, self._entries[:entryTo]))
        dropped_to = self._entries[entryTo - 1][1]
        del self._entries[:entryTo]
        del self._locs[:entryTo]
        self.sync()  # the segment stops taking appends whole
        self._rotate(last + 1)
        # Stored with the next meta write: until then the snapshot the caller just
        # put in place says the same (keep_from at load).
        self._first_index = self._entries[0][1] if self._entries else dropped_to + 1
        self._meta_dirty = True
        dead = [seq for seq in self._seqs if seq < first_kept_seq]
        self._seqs = self._seqs[len(dead):]
        segments.remove_beside([segments.path_of(self.path, seq) for seq in dead])

    def _rotate(self, seq: int) -> None:
        """Start segment seq (the one after the last) and append there."""
        self._close_files()
        self._fd = self._os(segments.create, segments.path_of(self.path, seq))
        self._fd_seq = self._active = seq
        self._seqs.append(seq)
        self._end = len(MAGIC)
        self._dirty = self._dir_dirty = True

    def _active_fd(self) -> int:
        """The active segment's fd, opened (and flocked) if the active one changed."""
        if self._fd_seq != self._active:
            self._close_files()
            self._fd = self._os(segments.open_locked, segments.path_of(self.path, self._active))
            self._fd_seq = self._active
        return self._fd

    def __getitem__(self, item: int | slice) -> Entry | list[Entry]:
        # syncobj.py indexes [0], [1], [-1] and slices [diff:], [diff:diff + n].
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def size_bytes(self) -> int:
        """The entries since the last compaction, framed as on disk."""
        return self._live_bytes

    def sync(self) -> None:
        """Make every added entry durable; a no-op when nothing was added since."""
        self._check_usable()
        if self._dirty:
            self._drop_limbo()
            self._fdatasync()

    def flush(self) -> None:
        self.sync()

    @property
    def durable_index(self) -> int:
        """Raft index of the last entry known to be on disk (0: none)."""
        return self._durable_index

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        # Raft recomputes the commit index, so it is stored lazily.
        self._commit_index = raftCommitIndex
        self._meta_dirty = True

    def getRaftCommitIndex(self) -> int:
        return self._commit_index

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:
        """Store synchronously: Raft must not vote or campaign on a term it can forget."""
        if votedForNodeId is not None and not isinstance(votedForNodeId, str):
            raise TypeError(f"votedForNodeId must be str or None, not {type(votedForNodeId).__name__}")
        self._term, self._voted_for = term, votedForNodeId
        self._store_meta()

    def getCurrentTerm(self) -> int:
        return self._term

    def getVotedForNodeId(self) -> str | None:
        return self._voted_for

    def onOneSecondTimer(self) -> None:
        if self._meta_dirty:
            # Sync first so the stored commit index never exceeds the durable log.
            self.sync()
            self._store_meta()

    def _destroy(self) -> None:
        if self._fd < 0:
            return
        try:
            if self.error is None:
                self.onOneSecondTimer()
                self.sync()
        finally:
            self._close_files()  # later calls fail instead of writing to a reused fd
            if _journals.get(self.path) is self:
                del _journals[self.path]

    def _close_files(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._fd_seq = -1, -1

    def _load(self, keep_from: int) -> None:
        """Read every segment, skipping entries below keep_from and deleting segments
        that hold nothing else; cut a torn tail off the last one."""
        seqs = segments.seqs(self.path)
        if not seqs:
            os.close(self._os(segments.create, self.path))
            self._dir_dirty = True
            seqs = [0]
        dead = []
        for seq in seqs:
            path = segments.path_of(self.path, seq)
            records, end = segments.read(path, sealed=seq != seqs[-1])
            kept = [(entry, offset) for entry, offset in records if entry[1] >= keep_from]
            if not kept and seq != seqs[-1]:
                dead.append(path)
                continue
            self._seqs.append(seq)
            for entry, offset in kept:
                self._check_next_idx(entry[1])
                self._append(entry, (seq, offset))
            self._active, self._end = seq, end
        fd = self._active_fd()
        if self._end == 0:
            self._os(segments.pwrite_all, fd, MAGIC, 0)
            self._end = len(MAGIC)
        if os.path.getsize(segments.path_of(self.path, self._active)) > self._end:
            self._os(os.ftruncate, fd, self._end)
        self._os(segments.remove, dead)
        # What we read may exist only in the page cache (kill -9 keeps it there):
        # make it durable before Raft counts it. Sealed segments were synced whole.
        self._fdatasync()

    def _drop_limbo(self) -> None:
        """Cut records dropped by deleteEntriesFrom off the disk (made durable by the next sync)."""
        if self._limbo:
            self._os(os.ftruncate, self._active_fd(), self._end)
            after = [seq for seq in self._seqs if seq > self._active]
            self._seqs = self._seqs[: len(self._seqs) - len(after)]
            # At once and durably: a later segment surviving a crash after the cut
            # segment has taken new entries would read as their continuation.
            self._os(segments.remove, [segments.path_of(self.path, seq) for seq in after])
            self._limbo = []

    def _check_next_idx(self, idx: int) -> None:
        # pysyncobj finds entry i at position i - journal[0].idx: a gap corrupts it.
        if self._entries and idx != self._entries[-1][1] + 1:
            raise JournalError(f"{self.path}: entry {idx} does not follow {self._entries[-1][1]}")

    def _fdatasync(self) -> None:
        started = time.perf_counter()
        self._os(os.fdatasync, self._active_fd())
        if self._dir_dirty:
            self._os(fileio.fsync_dir, self.path)
            self._dir_dirty = False
        self.stats.record(time.perf_counter() - started)
        self._dirty = False
        self._durable_index = self._entries[-1][1] if self._entries else 0

    def _store_meta(self) -> None:
        meta = {"term": self._term, "voted_for": self._voted_for, "commit_index": self._commit_index,
                "first_index": self._first_index}
        self._os(segments.replace_durably, self.meta_path, codec.pack(meta))
        self._meta_dirty = False

    def _check_usable(self) -> None:
        if self.error is not None:
            raise self.error

    def _os(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except (OSError, JournalError) as e:
            self.error = JournalError(f"{self.path}: {e}")
            if self.on_error is not None:
                self.on_error(self.error)
            raise self.error from e


def _read_meta(path: str) -> tuple[int, str | None, int, int]:
    """(term, voted_for, commit_index, first_index); pysyncobj's defaults when there is
    no file. first_index is 0 in a meta file written before compaction stored it."""
    try:
        with open(path, "rb") as f:
            meta = codec.unpack(f.read())
    except FileNotFoundError:
        return 0, None, 1, 0
    except ValueError as e:  # msgspec's DecodeError is a ValueError
        raise JournalError(f"{path}: unreadable meta: {e}") from e
    if isinstance(meta, dict):
        meta.setdefault("first_index", 0)
    shape = {"term": int, "voted_for": (str, type(None)), "commit_index": int, "first_index": int}
    if not isinstance(meta, dict) or meta.keys() != shape.keys() or not all(
        isinstance(meta[key], kind) for key, kind in shape.items()
    ):
        raise JournalError(f"{path}: unexpected meta {meta!r}")
    return meta["term"], meta["voted_for"], meta["commit_index"], meta["first_index"]


_journals: dict[str, DurableJournal] = {}
_factory: Callable[[str], DurableJournal] = DurableJournal


def install(journal_factory: Callable[[str], DurableJournal] | None = None) -> None:
    """Make every SyncObj created from now on with a journalFile use DurableJournal.

    SyncObj.__init__ calls the name `createJournal` that syncobj.py imported from
    .journal, so that is the one to replace. Calling again only swaps the factory.
    """
    global _factory
    _factory = journal_factory or DurableJournal
    pysyncobj_patches.replace_journal_factory(_create_journal)


def _create_journal(journalFile: str | None = None) -> pysyncobj.journal.Journal:
    if journalFile is None:
        return pysyncobj.journal.MemoryJournal()
    journal = _factory(journalFile)
    _journals[journal.path] = journal
    return journal


def journal_for(path: str) -> DurableJournal:
    """The open journal of the SyncObj whose journalFile is `path`."""
    try:
        return _journals[os.path.abspath(path)]
    except KeyError:
        raise KeyError(f"no open DurableJournal for {path}; was install() called first?") from None
