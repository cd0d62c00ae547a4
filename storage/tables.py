"""The named databases of a group's LMDB environment, and the store's own markers
(its schema version, the Raft index it has applied through). Opening the environment,
which touches files, is raft/store.py's."""
from __future__ import annotations

from dataclasses import dataclass

import lmdb

from schedulerd.storage import keys

SCHEMA_VERSION = 1
DB_NAMES = ("jobs", "due", "runs", "occurrences", "ready", "leases", "meta", "job_stats", "dead_letters",
            "idempotency", "audit", "expiry")
LAST_APPLIED = b"last_applied"
SCHEMA = b"schema_version"


@dataclass(frozen=True)
class Tables:
    jobs: object
    due: object
    runs: object
    occurrences: object
    ready: object
    leases: object
    meta: object
    job_stats: object
    dead_letters: object
    idempotency: object
    audit: object
    # (check_us, job_id): when to look at a job again for expiry (storage/retention.py).
    expiry: object


def last_applied(txn: lmdb.Transaction, tables: Tables) -> int:
    raw = txn.get(LAST_APPLIED, db=tables.meta)
    return keys.read_u64(raw) if raw else 0


def set_last_applied(txn: lmdb.Transaction, tables: Tables, index: int) -> None:
    txn.put(LAST_APPLIED, keys.u64(index), db=tables.meta)
