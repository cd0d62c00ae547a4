"""Log compaction snapshots: the LMDB environment itself, not a pickled object.

pysyncobj calls `write` in its tick thread when it compacts the log, and
`restore` when it loads a snapshot: at start-up (its own file) and when a
lagging or wiped node receives one from the leader. The file is
`MAGIC | u32 header length | msgpack header | LMDB copy`; the header carries
the two log entries pysyncobj needs to resume the log after the snapshot."""
from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
import zlib
from typing import Any

import lmdb

from storage import codec, keys
from storage.db import DB_NAMES, LAST_APPLIED, Store

log = logging.getLogger("schedulerd.snapshot")

MAGIC = b"SCHEDSNAP2"
_LEN = struct.Struct(">I")
# After the LMDB copy: its length and CRC-32, so a truncated or damaged file (a
# transfer cut short, a bad disk) is refused instead of swapped in, where LMDB
# would read past its end (SIGBUS) or return garbage.
_TRAILER = struct.Struct(">8sQI")
_TRAILER_MAGIC = b"SNAPEND1"
_BLOCK = 1 << 20
_SYNC_EVERY = 16 << 20
LMDB_FILE = "data.mdb"


class BadSnapshot(ValueError):
    """The file is not a whole snapshot; nothing was changed."""


def _write_store(env: lmdb.Environment, path: str, header: bytes) -> None:
    """MAGIC | header | LMDB copy | trailer, fsynced as it is written.

    The copy comes through a pipe, so it is written, checksummed and synced in one
    pass, _SYNC_EVERY bytes at a time. Written whole and fsynced once at the end, a
    740 MB copy left the disk one long flush to do, and every Raft journal fdatasync
    on the node waited behind it."""
    with open(path, "w+b") as f:
        f.write(MAGIC + _LEN.pack(len(header)) + header)
        length, crc = _copy_through_pipe(env, f)
        f.write(_TRAILER.pack(_TRAILER_MAGIC, length, crc))
        f.flush()
        os.fsync(f.fileno())


def _copy_through_pipe(env: lmdb.Environment, f: Any) -> tuple[int, int]:
    """Append a compacted copy of env to f; returns its length and CRC-32."""
    read_fd, write_fd = os.pipe()
    failed: list[BaseException] = []

    def copy() -> None:
        try:
            env.copyfd(write_fd, compact=True)
        except BaseException as exc:  # re-raised below, in the caller's thread
            failed.append(exc)
        finally:
            os.close(write_fd)

    copier = threading.Thread(target=copy, name="snapshot-copy", daemon=True)
    copier.start()
    length = crc = unsynced = 0
    try:
        with os.fdopen(read_fd, "rb", buffering=0) as src:
            while chunk := src.read(_BLOCK):
                f.write(chunk)
                crc = zlib.crc32(chunk, crc)
                length += len(chunk)
                unsynced += len(chunk)
                if unsynced >= _SYNC_EVERY:
                    f.flush()
                    os.fdatasync(f.fileno())
                    unsynced = 0
    finally:
        copier.join()  # the read end is closed: a copy still writing gets EPIPE and stops
    if failed:
        raise failed[0]
    return length, crc


def write(store: Store, path: str, data: tuple[Any, ...]) -> None:
    """Write a snapshot of the store as of the last applied entry, fsynced.

    `data` is pysyncobj's (last applied entry, the entry before it, cluster);
    entries are (command bytes, index, term)."""
    last, prev, _cluster = data
    header = codec.pack({"last": list(last), "prev": list(prev), "last_applied": store.last_applied()})
    _write_store(store.env, path, header)
    log.info("snapshot_written path=%s raft_index=%d bytes=%d", path, last[1], os.path.getsize(path))


# pysyncobj's NO_OP command byte: the synthetic entries a backup resumes the log after.
_NO_OP = b"\x01"


def write_backup(lmdb_path: str, out_path: str) -> int:
    """A consistent copy of a live node's store, as a snapshot file; returns its last_applied.

    Runs beside the daemon (LMDB allows readers in other processes): the copy is
    one read txn. The Raft position is synthesized at the store's last_applied
    with term 0, so a cluster restored from it (every node starting from this
    file, with empty journals) continues the log right after it and fences keep
    growing. Restoring one node of a running cluster needs no backup: wipe its
    data dir and it catches up from the leader."""
    env = lmdb.open(lmdb_path, readonly=True, lock=True, max_dbs=len(DB_NAMES) + 1, subdir=True)
    try:
        with env.begin() as txn:
            meta = env.open_db(b"meta", txn=txn)
            raw = txn.get(LAST_APPLIED, db=meta)
            applied = keys.read_u64(raw) if raw else 0
        if applied < 2:
            raise ValueError(f"{lmdb_path} has applied nothing yet (last_applied {applied}); nothing to back up")
        header = codec.pack({"last": [_NO_OP, applied, 0], "prev": [_NO_OP, applied - 1, 0],
                             "last_applied": applied})
        tmp = out_path + ".partial"
        _write_store(env, tmp, header)
        os.replace(tmp, out_path)
        return applied
    finally:
        env.close()


def install_backup(backup_path: str, snapshot_path: str) -> int:
    """Put a backup where a node with an empty data dir loads it at start; returns its last_applied."""
    header, offset = read_header(backup_path)
    _check_payload(backup_path, offset, None)
    tmp = snapshot_path + ".partial"
    shutil.copyfile(backup_path, tmp)
    _fsync_file(tmp)
    os.replace(tmp, snapshot_path)
    _fsync_file(snapshot_path)
    return int(header["last_applied"])


def read_header(path: str) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError(f"{path} is not a schedulerd snapshot")
        (length,) = _LEN.unpack(f.read(_LEN.size))
        header = codec.unpack(f.read(length))
        return header, f.tell()


def restore(store: Store, path: str) -> tuple[Any, ...]:
    """Make the store at least as new as the snapshot; return pysyncobj's entries.

    The local LMDB is durable on its own (sync on), so after a restart it is
    usually ahead of its last snapshot and is kept: the journal replay skips
    what it already has. Only a store that is behind (wiped, or a lagging node
    sent a snapshot) is replaced by the snapshot's copy."""
    _fsync_file(path)  # pysyncobj writes a received snapshot without fsync, then clears the journal
    header, offset = read_header(path)
    local = store.last_applied()
    if local < header["last_applied"]:
        tmp = os.path.join(store.path, LMDB_FILE + ".restore")
        try:
            with open(tmp, "wb") as dst:
                _check_payload(path, offset, dst)
                dst.flush()
                os.fsync(dst.fileno())
        except BadSnapshot:
            os.remove(tmp)
            log.error("snapshot_refused path=%s: truncated or damaged; the store is unchanged", path)
            raise
        with store.swapping():
            os.replace(tmp, os.path.join(store.path, LMDB_FILE))
            lock = os.path.join(store.path, "lock.mdb")
            if os.path.exists(lock):
                os.remove(lock)
        log.warning("snapshot_restored path=%s local_last_applied=%d snapshot_last_applied=%d",
                    path, local, header["last_applied"])
    last, prev = header["last"], header["prev"]
    return (tuple(last), tuple(prev), None)


def _check_payload(path: str, offset: int, copy_to: Any) -> None:
    """Check the LMDB copy's length and CRC against the trailer (copying it to copy_to as it goes)."""
    size = os.path.getsize(path)
    if size < offset + _TRAILER.size:
        raise BadSnapshot(f"{path}: {size} bytes, shorter than its header and trailer")
    with open(path, "rb") as f:
        f.seek(size - _TRAILER.size)
        magic, length, crc = _TRAILER.unpack(f.read(_TRAILER.size))
        if magic != _TRAILER_MAGIC or length != size - offset - _TRAILER.size:
            raise BadSnapshot(f"{path}: no valid trailer (truncated?): {size} bytes")
        f.seek(offset)
        seen, left = 0, length
        while left:
            chunk = f.read(min(_BLOCK, left))
            if not chunk:
                raise BadSnapshot(f"{path}: ends early")
            seen = zlib.crc32(chunk, seen)
            if copy_to is not None:
                copy_to.write(chunk)
            left -= len(chunk)
    if seen != crc:
        raise BadSnapshot(f"{path}: CRC mismatch, the LMDB copy is damaged")


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path)


def fsync_dir(path: str) -> None:
    """Make a rename or creation of `path` durable."""
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
