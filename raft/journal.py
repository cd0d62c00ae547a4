"""A durable Raft log for pysyncobj 0.3.17.

pysyncobj's FileJournal is an mmap that is never msynced while the node runs,
and its meta file is renamed into place without fsync: an acknowledged job
survives kill -9 (page cache) but not power loss (upstream issue #84).
DurableJournal keeps pysyncobj's Journal interface on an append-only file that
we fsync; `make_durable` calls `sync()` at the two moments where Raft counts a
copy: before the leader counts itself, and before a follower answers.

Journal file, little-endian, no pickle:
    header  b"SCHDJRN1"           magic + format version, written once
    record  u32 len(command)
            u32 crc32 of (len, idx, term, command)
            u64 idx, u64 term     Raft index and term of the entry
            command               the bytes pysyncobj passed to add()
Loading stops at the first truncated or crc-failing record (a torn tail from a
crash) and truncates the file there. `<journal>.meta` is msgpack
{"term", "voted_for", "commit_index"}, replaced atomically with fsyncs.

pysyncobj calls a journal only from its tick thread, so there is no locking.
"""
from __future__ import annotations

import fcntl
import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import pysyncobj.journal
import pysyncobj.syncobj
from pysyncobj import SyncObj

from storage import codec

log = logging.getLogger(__name__)

MAGIC = b"SCHDJRN1"
_RECORD = struct.Struct("<IIQQ")  # len(command), crc32, idx, term
_CRC_PREFIX = struct.Struct("<IQQ")  # the header fields the crc covers
# Messages that tell a peer what this node holds: its log must be durable first.
# Term and vote are already durable (setCurrentTerm stores them synchronously).
_SYNC_BEFORE_SENDING = frozenset({"next_node_idx", "request_vote", "response_vote"})

Entry = tuple[bytes, int, int]  # (command, idx, term), as pysyncobj indexes it


class JournalError(Exception):
    """The journal is unreadable or could not be made durable: stop the node."""


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
    """pysyncobj's Journal on an fsynced append-only file (format: module doc)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.meta_path = self.path + ".meta"
        self.stats = SyncStats()
        # Set once a write or fsync failed. Never retried: after a failed fsync
        # Linux may drop the dirty pages, and a retry would report success.
        self.error: JournalError | None = None
        # Called once with the error when the journal becomes unusable (the owner stops the node).
        self.on_error: Callable[[JournalError], None] | None = None
        self._entries: list[Entry] = []
        self._offsets: list[int] = []  # file offset of each entry's record
        # Entries deleteEntriesFrom dropped whose records are still in the file,
        # starting at offset _end (see deleteEntriesFrom).
        self._limbo: list[Entry] = []
        self._end = len(MAGIC)
        self._dirty = False
        self._durable_index = 0
        if not os.path.exists(self.path):
            _replace_durably(self.path, MAGIC)
        self._fd = _open_locked(self.path)
        try:
            self._load()
            self._term, self._voted_for, self._commit_index = _read_meta(self.meta_path)
        except BaseException:
            os.close(self._fd)
            raise
        self._meta_dirty = False

    def add(self, command: bytes, idx: int, term: int) -> None:
        """Append without fsync; `sync()` makes it durable."""
        if not isinstance(command, bytes):
            raise TypeError(f"journal command must be bytes, not {type(command).__name__}")
        self._check_usable()
        self._check_next_idx(idx)
        entry = (command, idx, term)
        if self._limbo and self._limbo[0] == entry:
            # pysyncobj re-sends entries this follower already holds: the bytes on
            # disk are that very record, durable since before; take it back as is.
            self._limbo.pop(0)
            self._entries.append(entry)
            self._offsets.append(self._end)
            self._end += _RECORD.size + len(command)
            return
        self._drop_limbo()
        record = _encode(command, idx, term)
        self._os(_pwrite_all, self._fd, record, self._end)
        self._entries.append(entry)
        self._offsets.append(self._end)
        self._end += len(record)
        self._dirty = True

    def clear(self) -> None:
        self.deleteEntriesFrom(0)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """Drop entries [entryFrom:] (a follower's conflicting suffix).

        pysyncobj 0.3.17 also calls this for suffixes that do not conflict: a late
        ack rewinds the leader's nextIndex, and the follower deletes from there
        and receives the same entries again. Truncating the file at once would
        leave entries this node already acknowledged off the disk until the next
        sync. So the dropped records stay on disk in limbo: an identical re-add
        takes its record back, anything else (or the next sync) cuts the file.
        Until then the disk holds exactly a log this node had made durable."""
        self._check_usable()
        start = slice(entryFrom, None).indices(len(self._entries))[0]
        if start == len(self._entries):
            return
        self._limbo[:0] = self._entries[start:]
        self._end = self._offsets[start]
        del self._entries[start:]
        del self._offsets[start:]
        self._dirty = True

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Drop entries [:entryTo] (log compaction) by an atomic file rewrite."""
        self._check_usable()
        self._limbo = []
        kept = self._entries[entryTo:]
        data = bytearray(MAGIC)
        offsets = []
        for command, idx, term in kept:
            offsets.append(len(data))
            data += _encode(command, idx, term)
        self._os(_replace_durably, self.path, bytes(data))
        fd = self._os(_open_locked, self.path)
        os.close(self._fd)
        self._fd = fd
        self._entries, self._offsets, self._end = kept, offsets, len(data)
        self._dirty = False
        self._durable_index = kept[-1][1] if kept else 0

    def __getitem__(self, item: int | slice) -> Entry | list[Entry]:
        # syncobj.py indexes [0], [1], [-1] and slices [diff:], [diff:diff + n].
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def size_bytes(self) -> int:
        """The journal file's length: the entries since the last compaction, framed."""
        return self._end

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
            os.close(self._fd)
            self._fd = -1  # later calls fail with EBADF instead of hitting a reused fd
            if _journals.get(self.path) is self:
                del _journals[self.path]

    def _load(self) -> None:
        with open(self.path, "rb") as f:
            data = f.read()
        if data[: len(MAGIC)] != MAGIC:
            raise JournalError(f"{self.path}: not a schedulerd journal (bad magic)")
        pos = len(MAGIC)
        while pos + _RECORD.size <= len(data):
            length, crc, idx, term = _RECORD.unpack_from(data, pos)
            start = pos + _RECORD.size
            command = data[start : start + length]
            if len(command) < length or _crc(command, idx, term) != crc:
                break
            self._check_next_idx(idx)
            self._entries.append((command, idx, term))
            self._offsets.append(pos)
            pos = start + length
        if pos < len(data):
            log.warning("journal_torn_tail path=%s offset=%d dropped_bytes=%d", self.path, pos, len(data) - pos)
            self._os(os.ftruncate, self._fd, pos)
        self._end = pos
        # What we read may exist only in the page cache (kill -9 keeps it there):
        # make it durable before Raft counts it.
        self._fdatasync()

    def _drop_limbo(self) -> None:
        """Cut records dropped by deleteEntriesFrom off the file (made durable by the next sync)."""
        if self._limbo:
            self._os(os.ftruncate, self._fd, self._end)
            self._limbo = []

    def _check_next_idx(self, idx: int) -> None:
        # pysyncobj finds entry i at position i - journal[0].idx: a gap corrupts it.
        if self._entries and idx != self._entries[-1][1] + 1:
            raise JournalError(f"{self.path}: entry {idx} does not follow {self._entries[-1][1]}")

    def _fdatasync(self) -> None:
        started = time.perf_counter()
        self._os(os.fdatasync, self._fd)
        self.stats.record(time.perf_counter() - started)
        self._dirty = False
        self._durable_index = self._entries[-1][1] if self._entries else 0

    def _store_meta(self) -> None:
        meta = {"term": self._term, "voted_for": self._voted_for, "commit_index": self._commit_index}
        self._os(_replace_durably, self.meta_path, codec.pack(meta))
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


def _crc(command: bytes, idx: int, term: int) -> int:
    return zlib.crc32(command, zlib.crc32(_CRC_PREFIX.pack(len(command), idx, term)))


def _encode(command: bytes, idx: int, term: int) -> bytes:
    return _RECORD.pack(len(command), _crc(command, idx, term), idx, term) + command


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _open_locked(path: str) -> int:
    """Open for writing and take an flock: two writers would interleave records."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JournalError(f"{path}: already open by another SyncObj or process") from None
    return fd


def _replace_durably(path: str, data: bytes) -> None:
    """Write a temp file, fsync it, rename it over `path`, fsync the directory."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read_meta(path: str) -> tuple[int, str | None, int]:
    """(term, voted_for, commit_index); pysyncobj's defaults when there is no file."""
    try:
        with open(path, "rb") as f:
            meta = codec.unpack(f.read())
    except FileNotFoundError:
        return 0, None, 1
    except ValueError as e:  # msgspec's DecodeError is a ValueError
        raise JournalError(f"{path}: unreadable meta: {e}") from e
    shape = {"term": int, "voted_for": (str, type(None)), "commit_index": int}
    if not isinstance(meta, dict) or meta.keys() != shape.keys() or not all(
        isinstance(meta[key], kind) for key, kind in shape.items()
    ):
        raise JournalError(f"{path}: unexpected meta {meta!r}")
    return meta["term"], meta["voted_for"], meta["commit_index"]


_journals: dict[str, DurableJournal] = {}
_factory: Callable[[str], DurableJournal] = DurableJournal


def install(journal_factory: Callable[[str], DurableJournal] | None = None) -> None:
    """Make every SyncObj created from now on with a journalFile use DurableJournal.

    SyncObj.__init__ calls the name `createJournal` that syncobj.py imported from
    .journal, so that is the one to replace. Calling again only swaps the factory.
    """
    global _factory
    _factory = journal_factory or DurableJournal
    pysyncobj.syncobj.createJournal = _create_journal


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


def make_durable(syncobj: SyncObj, journal: DurableJournal) -> None:
    """fsync the log before `syncobj` counts its own copy or reports it to a peer.

    Call once, right after constructing the SyncObj: its tick thread starts in
    the constructor, and entries it acknowledges before this call are not fsynced
    first.
    """
    if syncobj._SyncObj__raftLog is not journal:
        raise ValueError("journal is not this SyncObj's log; call install() before creating it")
    # Leader. The installed 0.3.17 SyncObj._onTick runs, in order: (1) if leader,
    # count followers' matchIndex plus 1 for itself and advance the commit index;
    # (2) apply committed entries; (3) send append_entries; (4)
    # _checkCommandsToApply appends the leader's new entries; (5) log compaction;
    # (6) tick callbacks; (7) poller.poll waits for messages. Syncing at (6) makes
    # the entries of (4) durable before (1) of the next tick counts them. The NO_OP
    # a new leader appends inside (7) counts only with followers' acks, which
    # arrive in a later poll, after (6). Only a 1-node cluster commits its
    # election NO_OP unsynced (elected and counted in one tick): it carries no
    # client write, and the next sync covers it since the file is append-only.
    syncobj.addOnTickCallback(journal.sync)
    # Follower. The append_entries handler adds entries, then answers through
    # self.__transport.send(node, {"type": "next_node_idx", ...}).
    transport = syncobj._SyncObj__transport
    send = transport.send

    def send_after_sync(node: Any, message: dict[str, Any]) -> bool:
        if message.get("type") in _SYNC_BEFORE_SENDING:
            journal.sync()
        return send(node, message)

    transport.send = send_after_sync
