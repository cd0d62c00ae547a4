"""Every limit of the daemon, in one place, with units in the names.

Hitting one is a typed error that names the limit (never a silent clamp) and
a metric."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Limits:
    # Encoded JSON size of one job's payload.
    payload_bytes_max: int = 64 * 1024
    # Whole request body; above payload_bytes_max to leave room for the job's other fields.
    request_bytes_max: int = 1024 * 1024
    # Encoded JSON size of a result sent with an ack.
    result_bytes_max: int = 16 * 1024
    # Length of a nack's error text.
    error_chars_max: int = 4 * 1024
    # Jobs in one POST /v1/jobs:batch (one Raft entry; keep it well under 64 KiB chunking).
    create_batch_max: int = 100
    # Encoded size that concurrent creates may share in one Raft entry (a single create
    # or batch request above it still goes alone). Each node commits one create entry at
    # a time, so this over the commit latency bounds the node's create rate: at 256 KiB
    # (~500 jobs) followers topped out near 2,600 jobs/s each.
    create_entry_bytes_max: int = 1024 * 1024
    # Due occurrences claimed in one Raft entry.
    claim_batch_max: int = 500
    # Due-index keys read per scan tick.
    scan_batch_max: int = 2000
    # Runs leased in one Raft entry and tasks in one poll response. A worker with many
    # slots fills them in fewer polls and lease entries (spike drain 9.2 s -> 6.3-8.8 s
    # at 500); a response stays under 500 x (payload_bytes_max + 1 KiB).
    lease_batch_max: int = 500
    # Runs leased in one Raft entry across the polls that share it, counted by what each
    # poll asks for: several workers' polls of lease_batch_max must fit one entry.
    lease_entry_runs_max: int = 2000
    # Acks or heartbeats in one batch request.
    ack_batch_max: int = 500
    # Acks (or heartbeats) that concurrent requests share in one Raft entry, by weight.
    # A request's acks travel together, so with room for one request per entry a node
    # committed one worker's batch per commit latency.
    ack_entry_weight_max: int = 2000
    # Coalesced into one entry, an ack weighs one more per started ack_weight_bytes of
    # its result: an entry's results stay under ack_entry_weight_max * ack_weight_bytes.
    ack_weight_bytes: int = 1024
    # Runs one purge entry deletes; a job with more is purged in several entries.
    purge_runs_max: int = 1000
    # Expiry keys one sweep entry judges, and runs it reads in all (storage/retention.py).
    # Small entries, often: every replica applies one in its Raft tick, and at 1,000 keys
    # an entry the ticks it took held up leases and acks (p99 lateness 3.5x at 2,000 jobs/s).
    sweep_batch_max: int = 100
    sweep_runs_max: int = 200
    # Expiry keys swept per second per group at most, so a backlog of millions (a TTL
    # shortened, a cluster back from an outage) is spread out instead of crowding out claims.
    sweep_keys_per_s_max: int = 5000
    # Expired leases requeued in one Raft entry.
    expire_batch_max: int = 500
    # Longest long-poll a worker may ask for, seconds.
    long_poll_s_max: float = 30.0
    # Page size of list endpoints.
    page_size_max: int = 1000
    # Records read to fill one filtered list page.
    list_scan_max: int = 10_000
    # Waiting long-polls per node.
    poll_waiters_max: int = 10_000
    # Fire times in one GET /v1/preview (computed inline on the event loop).
    preview_n_max: int = 100
    # Queues one poll may name.
    poll_queues_max: int = 64
    # Characters of a cron expression (croniter's work grows with it).
    cron_chars_max: int = 256
    # Holiday calendars in the cluster (metadata group state, held whole in memory on every node).
    calendars_max: int = 100
    # Disjoint date ranges of one calendar, after merging (a claim entry may carry them).
    calendar_ranges_max: int = 1000
    # Queues with limits in the cluster (metadata group state; a lease entry carries those its polls name).
    queue_limits_max: int = 1000
    # The highest max_running and max_starts_per_s a queue may be given.
    queue_running_max: int = 1_000_000
    queue_starts_per_s_max: float = 1_000_000.0
    # Labels on one job (each key and value is also bounded by Kubernetes' syntax).
    labels_max: int = 64
    # Characters of a job's description.
    description_chars_max: int = 1024
    # Jobs one bulk pause, resume or cancel entry acts on; more take several entries.
    bulk_batch_max: int = 500
    # Occurrences one backfill request may name (one Raft entry; each is checked against
    # the schedule in apply).
    backfill_occurrences_max: int = 1000
    # HTTP request line and each header line, bytes (the HTTP parser answers 400 past them).
    header_line_bytes_max: int = 8190
    # Headers in one request.
    headers_max: int = 64
    # Seconds a client may take to send its request body; a slower one gets 408.
    body_read_s_max: float = 30.0
    # Seconds a connection may take to send a request's headers, counted from its opening
    # or from the end of its last answer; then it is closed (a client that dribbles its
    # headers would otherwise hold a socket for as long as it likes). An idle keep-alive
    # connection is closed after the same time: it is aiohttp's keepalive_timeout, which
    # covers a connection that has not sent its first request since aiohttp 3.14.4.
    header_read_s_max: float = 30.0
    # Keys a /metrics scrape reads per scan (overdue jobs, ready queue); past it, lower bounds.
    metrics_scan_max: int = 100_000
    # Below this much free space on the data directory, the node refuses writes (503).
    disk_free_bytes_min: int = 64 * 1024 * 1024

    def overridden(self, settings: Iterable[str]) -> "Limits":
        """A copy with NAME=VALUE settings (schedulerd --limit) applied; raises ValueError
        naming a setting that is malformed, unknown or not a number of the limit's kind."""
        known = {f.name for f in fields(self)}
        changes: dict[str, int | float] = {}
        for setting in settings:
            name, sep, text = (part.strip() for part in setting.partition("="))
            if not sep or name not in known:
                raise ValueError(f"limit {setting!r}: expected NAME=VALUE, NAME one of {', '.join(sorted(known))}")
            kind = type(getattr(self, name))
            try:
                changes[name] = kind(text)
            except ValueError:
                raise ValueError(f"limit {name}={text!r}: expected {'an integer' if kind is int else 'a number'}") \
                    from None
        return replace(self, **changes)

    def validate(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"limit {f.name} must be positive")
        if self.payload_bytes_max >= self.request_bytes_max:
            raise ValueError("payload_bytes_max must be below request_bytes_max")
        if self.claim_batch_max > self.scan_batch_max:
            raise ValueError("claim_batch_max cannot exceed scan_batch_max")
        if self.lease_entry_runs_max < self.lease_batch_max:
            raise ValueError("lease_entry_runs_max must hold at least one poll of lease_batch_max")
        if self.ack_entry_weight_max < self.ack_batch_max:
            raise ValueError("ack_entry_weight_max must hold at least one batch of ack_batch_max")
