"""Key encodings for the LMDB named databases.

Every key sorts the way its scan needs: big-endian integers, and a NUL byte
after variable-length ids (ids are validated to never contain one) so that a
prefix scan of one job never runs into the next."""
from __future__ import annotations

import struct
import zlib
from functools import lru_cache

SHARDS = 256
PRIORITY_MAX = 9

_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_SEP = b"\x00"
JOB_STATE_COUNTS = b"job_state_counts"  # meta key: {job state: number of jobs}


def shard_of(job_id: str) -> int:
    """crc32, not the builtin hash: that one is salted per process and replicas must agree."""
    return zlib.crc32(job_id.encode()) % SHARDS


def u64(value: int) -> bytes:
    return _U64.pack(value)


def read_u64(raw: bytes) -> int:
    return _U64.unpack(raw)[0]


def job_key(job_id: str) -> bytes:
    return job_id.encode()


def run_key(run_id: str) -> bytes:
    return run_id.encode()


def due_key(shard: int, fire_us: int, job_id: str) -> bytes:
    return _U16.pack(shard) + _U64.pack(fire_us) + job_id.encode()


def due_shard_prefix(shard: int) -> bytes:
    return _U16.pack(shard)


def split_due_key(key: bytes) -> tuple[int, int, str]:
    return _U16.unpack(key[:2])[0], _U64.unpack(key[2:10])[0], key[10:].decode()


def occurrence_key(job_id: str, scheduled_us: int) -> bytes:
    return job_id.encode() + _SEP + _U64.pack(scheduled_us)


def occurrence_prefix(job_id: str) -> bytes:
    return job_id.encode() + _SEP


@lru_cache(maxsize=4096)  # a store has few queues, and every ready key and band scan builds one
def ready_prefix(queue: str, priority: int) -> bytes:
    """Higher priority sorts first: the band byte is PRIORITY_MAX - priority."""
    return queue.encode() + _SEP + bytes([PRIORITY_MAX - priority])


def ready_key(queue: str, priority: int, available_us: int, run_id: str) -> bytes:
    return ready_prefix(queue, priority) + _U64.pack(available_us) + run_id.encode()


def split_ready_key(key: bytes) -> tuple[int, str]:
    """(available_us, run_id) of a ready key; the queue/priority prefix is known to the caller."""
    sep = key.index(_SEP)
    rest = key[sep + 2:]
    return _U64.unpack(rest[:8])[0], rest[8:].decode()


def split_ready_queue(key: bytes) -> tuple[str, int]:
    """(queue, available_us) of a ready key."""
    sep = key.index(_SEP)
    return key[:sep].decode(), _U64.unpack(key[sep + 2:sep + 10])[0]


def lease_key(lease_until_us: int, run_id: str) -> bytes:
    return _U64.pack(lease_until_us) + run_id.encode()


def split_lease_key(key: bytes) -> tuple[int, str]:
    return _U64.unpack(key[:8])[0], key[8:].decode()


def dead_letter_key(finished_us: int, run_id: str) -> bytes:
    return _U64.pack(finished_us) + run_id.encode()


def split_dead_letter_key(key: bytes) -> tuple[int, str]:
    return _U64.unpack(key[:8])[0], key[8:].decode()


def expiry_key(check_us: int, job_id: str) -> bytes:
    return _U64.pack(check_us) + job_id.encode()


def split_expiry_key(key: bytes) -> tuple[int, str]:
    return _U64.unpack(key[:8])[0], key[8:].decode()


def idempotency_key(key: str) -> bytes:
    return key.encode()
