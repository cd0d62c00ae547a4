"""The time lease entries are applied at: never past the cluster's.

A node stamps the LEASE_READY entries it proposes with its own clock, and apply leases
runs due by that time; the leader's EXPIRE_LEASES entries take back leases that ended by
its clock. A node whose clock runs ahead would so start runs early, or take a lease from
a worker still within it, by as much as its clock is off. The leader, as it appends one
of these entries, moves the entry's time (and a lease end with it) back to the voters'
median clock if the proposer's was past it (raft/clocks.py): one skewed node, the leader
included, then leases or expires nothing before the others agree it is time. A proposer
whose clock is behind keeps its own time: late, never early."""
from __future__ import annotations

from storage import ops
from storage.ops import Op


def stamp(blob: bytes, cluster_now_us: int) -> bytes:
    """The entry to append: blob itself unless it leases or expires by a time past cluster_now_us."""
    if not _is_time_gated(blob):
        return blob
    try:
        op, version, payload = ops.decode(blob)
        ahead_us = payload["now"] - cluster_now_us
        if ahead_us <= 0:
            return blob
    except (ops.CorruptEntry, KeyError, TypeError):
        return blob  # apply refuses it, on every replica alike
    payload["now"] -= ahead_us
    if op == Op.LEASE_READY:
        payload["lease_until"] -= ahead_us
    return ops.encode(op, payload, version)


def _is_time_gated(blob: bytes) -> bool:
    """Read from the first bytes, without decoding the entry: a msgpack array of three
    whose first item, the op code, is a positive fixint."""
    return len(blob) > 2 and blob[0] == 0x93 and blob[1] in _TIME_GATED


_TIME_GATED = frozenset({Op.LEASE_READY, Op.EXPIRE_LEASES})
