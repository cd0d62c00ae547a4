"""The time lease entries are applied at: the cluster's, not the proposer's.

A node stamps the entries it proposes with its own clock. Apply leases the runs due by a
LEASE_READY entry's time, judges a HEARTBEAT's lease still valid by its time and extends
it from there, and lets the leader's EXPIRE_LEASES take back the leases ended by its
time. A node whose clock runs ahead would so start runs early, or take a lease from a
worker still within it; one whose clock is behind would start them late. The leader, as
it appends one of these entries, sets its time to the voters' median clock (raft/clocks.py)
and moves a lease end by as much: one skewed node, the leader included, then leases,
extends and expires at the time the others agree on. The estimate errs behind the
median, never ahead: late by a message's transit, never early."""
from __future__ import annotations

from schedulerd.storage import ops
from schedulerd.storage.ops import Op


def stamp(blob: bytes, cluster_now_us: int) -> bytes:
    """The entry to append: blob itself unless it leases, extends or expires by a time
    other than cluster_now_us."""
    head = ops.header(blob)
    if head is None or head[0] not in _TIME_GATED:
        return blob
    try:
        op, version, payload = ops.decode(blob)
        shift_us = cluster_now_us - payload["now"]
        if shift_us == 0:
            return blob
        payload["now"] += shift_us
        if "lease_until" in payload:
            payload["lease_until"] += shift_us
    except (ops.CorruptEntry, KeyError, TypeError):
        return blob  # apply refuses it, on every replica alike
    return ops.encode(op, payload, version)


_TIME_GATED = frozenset({Op.LEASE_READY, Op.HEARTBEAT, Op.EXPIRE_LEASES})
