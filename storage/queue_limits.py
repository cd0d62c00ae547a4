"""Where a queue's limits are enforced: at most `max_running` runs of it leased at once, and
at most `max_starts_per_s` leases of it granted per second (a token bucket).

The limits are set cluster-wide in the metadata group (storage/meta.py); each data group
enforces its share of them (`running_share`, `rate_share`), so the groups' shares add up to
no more than the limit. The node that proposes a LEASE_READY entry copies into it the shares
of the queues its polls name (`carried`), with the revision the metadata gave them; apply keeps
in the group the newest revision it has seen of each queue's limits and grants by those, so an
entry from a node whose metadata view lags cannot raise a limit again, nor lift one. The clock
the bucket refills by is the entry's (the leader's stamp, raft's lease_time), the same on every
replica.

Each group counts its running runs per queue (records.update_run keeps the count); it starts
counting at its first entry of version QUEUE_LIMITS_SINCE, from its lease index, so every
replica's count is a function of the same state, whatever build applied the entries before."""
from __future__ import annotations

import zlib
from typing import Any, Iterable

import lmdb

from schedulerd.storage import keys, queries
from schedulerd.storage.codec import pack, unpack
from schedulerd.storage.tables import Tables

TOKEN = 1_000_000  # micro-tokens in a token: the bucket counts in integers, alike on every replica
US_PER_S = 1_000_000
# The slowest rate a queue may be limited to: each of up to 1024 groups still gets a share of it.
STARTS_PER_S_MIN = 0.01
COUNTED = b"running_counted"  # meta key: this group counts running runs per queue
_RUNNING = b"running\x00"  # meta key prefix: running runs of one queue, a u64
_LIMIT = b"queue_limit\x00"  # meta key prefix: one queue's share of its limits and its bucket

# An entry's limits: queue -> [revision, running share or None, micro-tokens per second or None].
Carried = dict[str, list[Any]]


def running_share(max_running: int, groups: int, group: int, queue: str) -> int:
    """Group `group`'s share of a cluster-wide max_running: the limit divided evenly, the
    remainder going one each to the groups after the queue's own starting group (so the
    remainders of different queues land on different groups). The shares sum to the limit."""
    base, extra = divmod(max_running, groups)
    start = zlib.crc32(queue.encode()) % groups
    return base + (1 if (group - start) % groups < extra else 0)


def rate_share(max_starts_per_s: float, groups: int) -> int:
    """Each group's share of a cluster-wide max_starts_per_s, in micro-tokens per second."""
    return int(round(max_starts_per_s * TOKEN)) // groups


def burst(rate: int) -> int:
    """The bucket's capacity, in micro-tokens: a second's worth of starts, and never less than
    one start, or a share under one start per second could never grant any."""
    return max(TOKEN, rate)


def carried(stored: dict[str, dict[str, Any]], queues: Iterable[str], groups: int, group: int) -> Carried:
    """What a lease entry for `group` carries of the metadata's limits (`stored`, by queue):
    the group's shares of the named queues that have or had limits, with their revisions."""
    out: Carried = {}
    for queue in sorted(set(queues)):
        limit = stored.get(queue)
        if limit is None:
            continue
        max_running, max_starts = limit["max_running"], limit["max_starts_per_s"]
        out[queue] = [limit["revision"],
                      None if max_running is None else running_share(max_running, groups, group, queue),
                      None if max_starts is None else rate_share(max_starts, groups)]
    return out


# -- running counts ---------------------------------------------------------------------------

def counting(txn: lmdb.Transaction, t: Tables) -> bool:
    return txn.get(COUNTED, None, t.meta) is not None


def start_counting(txn: lmdb.Transaction, t: Tables) -> None:
    """Count the running runs of each queue from the lease index (each running run has a key
    there), once, at the group's first entry of version QUEUE_LIMITS_SINCE."""
    counts: dict[str, int] = {}
    queries.running_by_queue(txn, t, txn.stat(t.leases)["entries"], counts)  # the whole index
    for queue in sorted(counts):
        txn.put(_RUNNING + queue.encode(), keys.u64(counts[queue]), True, True, False, t.meta)
    txn.put(COUNTED, b"", True, True, False, t.meta)


def running(txn: lmdb.Transaction, t: Tables, queue: str) -> int:
    raw = txn.get(_RUNNING + queue.encode(), None, t.meta)
    return keys.read_u64(raw) if raw else 0


def add_running(txn: lmdb.Transaction, t: Tables, deltas: dict[str, int]) -> None:
    """Write an entry's changes to the running counts (a count of 0 is no key)."""
    for queue in sorted(deltas):
        if deltas[queue]:
            count = running(txn, t, queue) + deltas[queue]
            if count < 0:
                raise AssertionError(f"queue {queue!r}: running count below zero")
            if count:
                txn.put(_RUNNING + queue.encode(), keys.u64(count), True, True, False, t.meta)
            else:
                txn.delete(_RUNNING + queue.encode(), b"", t.meta)


# -- the limits in force, and the bucket ------------------------------------------------------

class Limit:
    """One queue's limits in force in this group, and its bucket: [revision, running share,
    rate (micro-tokens/s), tokens (micro-tokens), refilled at (us)]. A revision with no limit
    stays stored, so an older revision cannot bring a lifted limit back."""

    __slots__ = ("revision", "max_running", "rate", "tokens", "at_us")

    def __init__(self, revision: int, max_running: int | None, rate: int | None, tokens: int, at_us: int) -> None:
        self.revision, self.max_running, self.rate, self.tokens, self.at_us = \
            revision, max_running, rate, tokens, at_us

    def refill(self, now_us: int) -> None:
        if self.rate is not None and now_us > self.at_us:
            self.tokens = min(burst(self.rate), self.tokens + (now_us - self.at_us) * self.rate // US_PER_S)
            self.at_us = now_us

    def packed(self) -> bytes:
        return pack([self.revision, self.max_running, self.rate, self.tokens, self.at_us])


def stored_limit(txn: lmdb.Transaction, t: Tables, queue: str) -> Limit | None:
    raw = txn.get(_LIMIT + queue.encode(), None, t.meta)
    return None if raw is None else Limit(*unpack(raw))


def in_force(txn: lmdb.Transaction, t: Tables, queue: str, entry: list[Any] | None, now_us: int) -> tuple[Limit | None, bool]:
    """The limits that hold for `queue` at `now_us`: the group's, or the entry's when they are of
    a newer revision; and whether they differ from what the group stored. A bucket starts full."""
    limit = stored_limit(txn, t, queue)
    if entry is not None and (limit is None or entry[0] > limit.revision):
        revision, max_running, rate = entry
        if limit is not None and limit.rate is not None and rate is not None:
            limit.refill(now_us)
            tokens, at_us = min(limit.tokens, burst(rate)), max(limit.at_us, now_us)
        else:
            tokens, at_us = (0 if rate is None else burst(rate)), now_us
        return Limit(revision, max_running, rate, tokens, at_us), True
    if limit is not None:
        limit.refill(now_us)
    return limit, False


def save(txn: lmdb.Transaction, t: Tables, queue: str, limit: Limit) -> None:
    txn.put(_LIMIT + queue.encode(), limit.packed(), True, True, False, t.meta)


class Budget:
    """What one LEASE_READY entry may still grant of each queue, by the limits in force.
    Running counts are read as they stand in the entry (`deltas`: records.update_run's changes
    not yet written), so a grant is counted as soon as it is made."""

    def __init__(self, txn: lmdb.Transaction, t: Tables, entry_limits: Carried, deltas: dict[str, int],
                 now_us: int) -> None:
        self._txn, self._t, self._entry, self._deltas, self._now = txn, t, entry_limits, deltas, now_us
        self._limits: dict[str, Limit | None] = {}
        self._running: dict[str, int] = {}  # as stored before the entry
        self._changed: set[str] = set()

    def _limit(self, queue: str) -> Limit | None:
        if queue not in self._limits:
            limit, changed = in_force(self._txn, self._t, queue, self._entry.get(queue), self._now)
            self._limits[queue] = limit
            if changed:
                self._changed.add(queue)
        return self._limits[queue]

    def limits_any(self, queues: list[str]) -> bool:
        """Whether any of these queues has limits in force (else nothing need be counted)."""
        return any(self._limit(q) is not None for q in queues)

    def has_room(self, queue: str) -> bool:
        limit = self._limit(queue)
        if limit is None:
            return True
        if limit.rate is not None and limit.tokens < TOKEN:
            return False
        if limit.max_running is None:
            return True
        if queue not in self._running:
            self._running[queue] = running(self._txn, self._t, queue)
        return self._running[queue] + self._deltas.get(queue, 0) < limit.max_running

    def open(self, queues: list[str]) -> list[str]:
        """The queues, in their order, of which a run may still be granted."""
        return [q for q in queues if self.has_room(q)]

    def took(self, queue: str) -> None:
        """A run of `queue` was granted: it costs a token."""
        limit = self._limit(queue)
        if limit is not None and limit.rate is not None:
            limit.tokens -= TOKEN
            self._changed.add(queue)

    def next_token_us(self, queues: list[str]) -> int | None:
        """When the first of these queues out of tokens next holds one (None: none is)."""
        times = [at for at in (next_token_us(limit) for limit in (self._limit(q) for q in queues)
                               if limit is not None) if at is not None]
        return min(times) if times else None

    def save(self) -> None:
        """Store what changed: a newer revision, or tokens spent (a refill alone is recomputed
        from the same stored time by the next entry, so it need not be written)."""
        for queue in sorted(self._changed):
            limit = self._limits[queue]
            assert limit is not None
            save(self._txn, self._t, queue, limit)


def next_token_us(limit: Limit) -> int | None:
    """When the bucket next holds a whole token (None: no rate limit, or it holds one now)."""
    if limit.rate is None or limit.tokens >= TOKEN or limit.rate == 0:
        return None
    return limit.at_us + -(-(TOKEN - limit.tokens) * US_PER_S // limit.rate)

