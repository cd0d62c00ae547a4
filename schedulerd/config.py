"""Daemon configuration: one frozen dataclass, each field with its unit and why."""
from __future__ import annotations

from dataclasses import dataclass, field

from schedulerd.destinations import DestinationPolicy
from schedulerd.api.exposure import ExposurePolicy
from schedulerd.jobspec import TTL_S_MAX
from schedulerd.limits import Limits
from schedulerd.raft.conf import RaftConfig
from schedulerd.storage import meta, placement


@dataclass(frozen=True)
class NodeConfig:
    raft: RaftConfig
    # HTTP API address.
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    # The API is served over HTTPS (--tls-cert): nodes call each other's API with https.
    http_tls: bool = False
    limits: Limits = field(default_factory=Limits)
    # Names the node answers to besides its own (schedulerd/api/exposure.py); "*": any.
    allowed_hosts: tuple[str, ...] = ()
    # Web origins whose pages may change things on the node (CORS answered for them).
    allowed_origins: tuple[str, ...] = ()
    # Where an http target may point (schedulerd/destinations.py).
    destinations: DestinationPolicy = field(default_factory=DestinationPolicy)
    # Lease granted to a worker per delivery; heartbeats extend it by the same.
    lease_s: float = 30.0
    # How often the group leader scans the due index and the lease-expiry index.
    scan_interval_s: float = 0.1
    # Claim occurrences this far ahead of their time, so the run is already in the
    # ready queue (available at its scheduled time) when it comes due. 12 s: a
    # midnight spike's claims are then done before midnight, and leases and acks
    # alone are left for the second itself (docs/decisions.md).
    lookahead_s: float = 12.0
    # An occurrence claimed more than this after its time was missed (no leader, cluster
    # down): its job's misfire_policy decides. Below it, a late occurrence just runs late.
    misfire_grace_s: float = 5.0
    # A job's finished TTL when it names none (--finished-ttl): a finished one-off or a
    # cancelled job goes this long after it finished, and a repeating job's runs this long
    # after they ended. 0 keeps everything forever. Fixed into each job at its creation.
    finished_ttl_s: float = 7 * 86_400.0
    # Where the sweep writes what it deletes first (--archive-dir); None: no archive.
    archive_dir: str | None = None
    # How often the group leader sweeps expired jobs and runs.
    sweep_interval_s: float = 1.0
    # How long a request waits for its entry to commit before answering 503.
    propose_timeout_s: float = 5.0
    # Replicas of each data group (1, 3 or 5), fixed when the cluster is bootstrapped; None:
    # 3, or 1 for a cluster that starts with fewer than 3 nodes.
    replication_factor: int | None = None
    # Replicas of the metadata group once the cluster has that many nodes (3 or 5).
    meta_replicas: int = 5
    # How often a node checks that the metadata knows it, and its leader whether to bootstrap
    # and whom to declare suspect or dead.
    registry_interval_s: float = 1.0
    # Silence after which the metadata leader calls a node dead (--dead-node-timeout): its
    # replicas are re-created elsewhere and it never serves again. It is suspect (keeps its
    # replicas, takes no new ones) after suspect_after_s().
    dead_node_timeout_s: float = 600.0
    # Members' HTTP addresses (--join): this node joins their running cluster as a new node.
    join: tuple[str, ...] = ()
    # The admin token sent with the join (--join-token-file), where the cluster uses tokens.
    join_token: str | None = field(default=None, repr=False)
    # The metadata group's members, as the join learnt them from the cluster; empty for a
    # first node (its metadata peers are its --peers').
    join_meta_peers: tuple[str, ...] = ()
    # Membership changes under way at once, each in a different group: a join or a repair
    # moves this many replicas in parallel (each one a snapshot transfer).
    placement_changes_max: int = 2
    # A replica added to a group must catch up (take the leader's snapshot and log) within
    # this, or the add is taken back and planned again.
    replica_catchup_timeout_s: float = 600.0

    def suspect_after_s(self) -> float:
        """5 s: a few missed heartbeats; sooner when the dead-node timeout is short (tests)."""
        return min(5.0, self.dead_node_timeout_s / 2)

    def first_replication_factor(self) -> int:
        if self.replication_factor is not None:
            return self.replication_factor
        return 3 if 1 + len(self.raft.peers) >= 3 else 1

    def validate(self) -> None:
        self.raft.validate()
        self.limits.validate()
        if not 1.0 <= self.lease_s <= 3600:
            raise ValueError("lease_s must be within 1..3600 seconds")
        if not 0 <= self.finished_ttl_s <= TTL_S_MAX:
            raise ValueError(f"finished_ttl_s must be within 0..{TTL_S_MAX} seconds (0: keep forever)")
        if not 0.05 <= self.sweep_interval_s <= 60:
            raise ValueError("sweep_interval_s must be within 0.05..60 seconds")
        if not 0 < self.misfire_grace_s <= 3600:
            raise ValueError("misfire_grace_s must be more than 0 and at most 3600 seconds")
        if not 0.01 <= self.scan_interval_s <= 5:
            raise ValueError("scan_interval_s must be within 0.01..5 seconds")
        if not 0 <= self.lookahead_s <= 60:
            raise ValueError("lookahead_s must be within 0..60 seconds")
        if self.lookahead_s < self.scan_interval_s:
            raise ValueError("lookahead_s must cover at least one scan_interval_s, or due runs "
                             "reach the ready queue up to a scan late")
        largest = max(self.limits.request_bytes_max, self.limits.create_entry_bytes_max,
                      self.limits.ack_entry_weight_max * self.limits.ack_weight_bytes)
        if 2 * largest > self.raft.entry_bytes_max:  # 2x: room for per-item fields and encoding
            raise ValueError(f"request_bytes_max, create_entry_bytes_max and "
                             f"ack_entry_weight_max * ack_weight_bytes must stay under half of the Raft entry_bytes_max ({self.raft.entry_bytes_max}); "
                             f"the largest is {largest}")
        if self.replication_factor not in (None, *placement.REPLICATION_FACTORS):
            raise ValueError(f"replication_factor must be one of {placement.REPLICATION_FACTORS}")
        if not self.join and self.first_replication_factor() > 1 + len(self.raft.peers):
            raise ValueError(f"replication_factor {self.first_replication_factor()} needs at least that many "
                             f"nodes; this one and its peers are {1 + len(self.raft.peers)}")
        if self.meta_replicas not in meta.META_REPLICAS:
            raise ValueError(f"meta_replicas must be one of {meta.META_REPLICAS}")
        if not 2 <= self.dead_node_timeout_s <= 7 * 86_400:
            raise ValueError("dead_node_timeout_s must be within 2 seconds..7 days")
        if not 1 <= self.placement_changes_max <= 16:
            raise ValueError("placement_changes_max must be within 1..16")
        if not 5 <= self.replica_catchup_timeout_s <= 86_400:
            raise ValueError("replica_catchup_timeout_s must be within 5 seconds..1 day")
        for url in self.join:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"--join takes members' URLs (http://HOST:PORT), not {url!r}")
        if not 0.05 <= self.registry_interval_s <= 60:
            raise ValueError("registry_interval_s must be within 0.05..60 seconds")
        ExposurePolicy.build(self.http_host, self.allowed_hosts, self.allowed_origins)
        self.destinations.validate()
        if not 0 < self.http_port < 65536:
            raise ValueError("http_port must be 1..65535")
