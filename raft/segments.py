"""Journal segment files: the Raft log on disk (raft/journal.py keeps it in memory).

A journal is a run of segment files, `<journal>` and then `<journal>.<n>` for
n = 1, 2, ..., read in the order of n. Each is, little-endian, no pickle:
    header  b"SCHDJRN1"           magic + format version, written once
    record  u32 len(command)
            u32 crc32 of (len, idx, term, command)
            u64 idx, u64 term     Raft index and term of the entry
            command               the bytes pysyncobj passed to add()
Appends go to the last segment. Every other one was fsynced whole before the
next was created, so a truncated or crc-failing record may end only the last
(a torn tail from a crash); anywhere else it is damage."""
from __future__ import annotations

import fcntl
import logging
import os
import re
import struct
import threading
import time
import zlib

from schedulerd.raft.fileio import fsync_dir, pwrite_all

log = logging.getLogger("raft.journal")

MAGIC = b"SCHDJRN1"
RECORD = struct.Struct("<IIQQ")  # len(command), crc32, idx, term
_CRC_PREFIX = struct.Struct("<IQQ")  # the header fields the crc covers
# Between the removals of two segments compaction dropped: each one's TRIM (on a disk
# mounted with `discard`) then holds back a single journal commit, not a run of them.
REMOVE_PAUSE_S = 0.1

Entry = tuple[bytes, int, int]  # (command, idx, term), as pysyncobj indexes it


class JournalError(Exception):
    """The journal is unreadable or could not be made durable: stop the node."""


def crc(command: bytes, idx: int, term: int) -> int:
    return zlib.crc32(command, zlib.crc32(_CRC_PREFIX.pack(len(command), idx, term)))


def encode(command: bytes, idx: int, term: int) -> bytes:
    return RECORD.pack(len(command), crc(command, idx, term), idx, term) + command


def record_bytes(entry: Entry) -> int:
    return RECORD.size + len(entry[0])


def path_of(journal: str, seq: int) -> str:
    return journal if seq == 0 else f"{journal}.{seq}"


def seqs(journal: str) -> list[int]:
    """The segments on disk, in log order."""
    directory, base = os.path.split(journal)
    pattern = re.compile(re.escape(base) + r"(?:\.([1-9][0-9]*))?")
    found = [pattern.fullmatch(name) for name in os.listdir(directory)]
    return sorted(int(m.group(1) or 0) for m in found if m)


def read(path: str, sealed: bool) -> tuple[list[tuple[Entry, int]], int]:
    """(each whole record's entry and offset, the offset after the last of them; 0
    for a last segment whose header did not reach the disk).

    A sealed segment (not the last) must be whole to its end."""
    with open(path, "rb") as f:
        data = f.read()
    if not sealed and len(data) < len(MAGIC) and MAGIC.startswith(data):
        return [], 0  # created just before a crash: nothing in it was ever synced
    if data[: len(MAGIC)] != MAGIC:
        raise JournalError(f"{path}: not a schedulerd journal (bad magic)")
    records = []
    pos = len(MAGIC)
    while pos + RECORD.size <= len(data):
        length, checksum, idx, term = RECORD.unpack_from(data, pos)
        start = pos + RECORD.size
        command = data[start : start + length]
        if len(command) < length or crc(command, idx, term) != checksum:
            break
        records.append(((command, idx, term), pos))
        pos = start + length
    if sealed and pos < len(data):
        raise JournalError(f"{path}: damaged record at offset {pos} of a sealed segment ({len(data)} bytes)")
    if pos < len(data):
        log.warning("journal_torn_tail path=%s offset=%d dropped_bytes=%d", path, pos, len(data) - pos)
    return records, pos


def create(path: str) -> int:
    """A new segment holding only the header, open and flocked; not synced: the
    journal's next sync makes its data and its directory entry durable, before
    anything in it is acknowledged."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        pwrite_all(fd, MAGIC, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_locked(path: str) -> int:
    """Open for writing and take an flock: two writers would interleave records."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JournalError(f"{path}: already open by another SyncObj or process") from None
    return fd


def replace_durably(path: str, data: bytes) -> None:
    """Write a temp file, fsync it, rename it over `path`, fsync the directory."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path)


def remove(paths: list[str]) -> None:
    """Delete segments and make that durable (a segment that comes back after a crash
    holds only entries the loader skips anyway)."""
    for path in paths:
        os.remove(path)
    if paths:
        fsync_dir(paths[0])


def remove_beside(paths: list[str]) -> None:
    """`remove`, one segment every REMOVE_PAUSE_S, on a thread of its own: freeing a
    file's extents takes the unlink milliseconds per 8 MiB, and delays the next
    fdatasync of the disk about as long; the Raft tick thread waits for neither."""
    def run() -> None:
        try:
            for path in paths:
                remove([path])
                time.sleep(REMOVE_PAUSE_S)
        except OSError as exc:
            log.error("journal_segment_remove_failed paths=%s error=%r: left for the next start to remove",
                      paths, exc)

    if paths:
        threading.Thread(target=run, name="journal-segment-remove", daemon=True).start()
