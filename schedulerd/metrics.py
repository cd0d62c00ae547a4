"""GET /metrics: what an operator alerts on, in Prometheus text format.

Two kinds of figure:
- event counters and the dispatch-lateness histogram, fed from apply results
  after each commit. Every replica applies every entry, so every node reports
  the same counts (from its own start: a restart resets them, as Prometheus
  counters may); query one node, or `max` across them, never `sum`;
- state gauges (jobs by state, overdue jobs, queue depth and age, Raft) read
  from this node's replica at scrape time. Scans are capped at
  `metrics_scan_max` keys; `schedulerd_metrics_scan_truncated` says when a
  figure is a lower bound.

The registry belongs to the app, not the process: tests run several nodes in
one interpreter."""
from __future__ import annotations

import threading
import time
from bisect import bisect_left
from typing import Any, Callable, Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from schedulerd.node import Node
from schedulerd.queue_history import QueueHistory
from schedulerd.raft.group import Group
from schedulerd.storage import queries
from schedulerd.storage.model import SKIP_REASONS, RunState
from schedulerd.storage.ops import Op
from schedulerd.units import US_PER_S

LATENESS_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
HTTP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FSYNC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)


class Metrics:
    def __init__(self, node: Node, poll_waiters: Callable[[], int]) -> None:
        self.node = node
        self.poll_waiters = poll_waiters
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.runs = Counter("schedulerd_run_events", "Run events applied on this replica, by event "
                            "(claimed, leased, acked, nacked, retried, dead_lettered, lease_expired, "
                            "cancelled, redriven, purged, discarded).", ["event"], registry=r)
        self.skipped = Counter("schedulerd_runs_skipped", "Occurrences recorded as skipped instead of run, by "
                               f"reason ({', '.join(r.value for r in SKIP_REASONS)}).", ["reason"], registry=r)
        for reason in SKIP_REASONS:  # every series from the start, so a rate() over it has a zero to begin at
            self.skipped.labels(reason.value)
        self.expired = Counter("schedulerd_retention_deleted", "Jobs and runs deleted by their TTL on this "
                               "replica, by kind (job, run).", ["kind"], registry=r)
        self.lateness = BulkHistogram("schedulerd_dispatch_lateness_seconds",
                                      "First lease of an occurrence minus its scheduled time, per queue; counted "
                                      "by the node that leads the run's group, so once in the cluster.",
                                      LATENESS_BUCKETS_S, "queue")
        r.register(self.lateness)
        self.history = QueueHistory(LATENESS_BUCKETS_S)  # the dashboard's per-queue charts
        self.http = Histogram("schedulerd_http_request_duration_seconds", "HTTP requests by route and status.",
                              ["method", "route", "status"], buckets=HTTP_BUCKETS_S, registry=r)
        self.fsync = Histogram("schedulerd_raft_journal_fsync_seconds", "fdatasync of the Raft journal.",
                               ["group"], buckets=FSYNC_BUCKETS_S, registry=r)
        r.register(_StateCollector(self))

    def attach(self) -> None:
        """Start observing the node and its groups, those the placement starts later too (after Node.start)."""
        self.node.applied_listeners.append(self.on_applied)
        for group in self.node.groups:
            self._observe(group, True)
        self.node.group_listeners.append(self._observe)

    def _observe(self, group: Group, started: bool) -> None:
        if started:
            group.journal.stats.on_record = self.fsync.labels(str(group.group_id)).observe
        else:  # a replica moved away: its series go too
            try:
                self.fsync.remove(str(group.group_id))
            except KeyError:
                pass

    def on_applied(self, op: Op, result: dict[str, Any]) -> None:
        """Runs in the Raft tick thread, after the entry's commit."""
        if op in (Op.CLAIM_BATCH, Op.CREATE_JOBS, Op.PAUSE_JOB, Op.UPDATE_JOB, Op.JOBS_ACTION):
            if op in (Op.CLAIM_BATCH, Op.CREATE_JOBS):
                self.runs.labels("claimed").inc(len(result["runs"]))
            for reason, count in result.get("skipped_reasons", {}).items():
                self.skipped.labels(reason).inc(count)
        elif op in (Op.LEASE_READY, Op.LEASE_BATCH):
            now = result["now"]
            leased = 0
            late: dict[str, list[float]] = {}
            by_queue: dict[str, int] = {}
            run_id = ""
            for _, tasks in result["grants"]:
                leased += len(tasks)
                for task in tasks:
                    run_id = task["run_id"]
                    by_queue[task["queue"]] = by_queue.get(task["queue"], 0) + 1
                    if task["attempt"] == 1 and not task.get("trigger"):
                        late.setdefault(task["queue"], []).append(max(0, now - task["scheduled_us"]) / US_PER_S)
            group_id = self.node.group_id_of_run(run_id) if run_id else None
            if group_id is not None:
                for queue, count in by_queue.items():
                    self.history.record(group_id, queue, now, count, late.get(queue, []))
            # Every replica applies the entry; only the group's leader counts it, so each lease counts once.
            if late and self._leads(group_id):
                for queue, values in late.items():
                    self.lateness.observe_many(values, queue)
            self.runs.labels("leased").inc(leased)
            if result["skipped"]:
                self.skipped.labels("deadline").inc(result["skipped"])
        elif op == Op.ACK:
            self.runs.labels("acked").inc(sum(1 for r in result["results"] if r["ok"] and not r.get("repeated")))
        elif op == Op.NACK and result.get("ok") and not result.get("repeated"):
            self.runs.labels("nacked").inc()
            self._count_failure(result["run"]["state"])
        elif op == Op.EXPIRE_LEASES:
            self.runs.labels("lease_expired").inc(result["expired"])
            self.runs.labels("dead_lettered").inc(result["dead_letter"])
            self.runs.labels("retried").inc(result["expired"] - result["dead_letter"])
        elif op == Op.REDRIVE_RUN and result.get("ok"):
            self.runs.labels("redriven").inc()
        elif op == Op.CANCEL_JOB and result.get("ok"):
            self.runs.labels("cancelled").inc(result["cancelled_runs"])
        elif op == Op.PURGE_JOB and result.get("ok"):
            self.runs.labels("purged").inc(result["deleted_runs"])
        elif op == Op.DISCARD_RUN and result.get("ok"):
            self.runs.labels("discarded").inc()
        elif op == Op.SWEEP_EXPIRED:
            self.expired.labels("job").inc(result["deleted_jobs"])
            self.expired.labels("run").inc(result["deleted_runs"])

    def _leads(self, group_id: int | None) -> bool:
        group = None if group_id is None else self.node.local_group(group_id)
        return group is not None and group.is_leader()

    def _count_failure(self, state: str) -> None:
        event = {RunState.RETRY_WAIT: "retried", RunState.DEAD_LETTER: "dead_lettered",
                 RunState.CANCELLED: "cancelled"}.get(RunState(state))
        if event:
            self.runs.labels(event).inc()

    async def handle(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            route = request.match_info.route.resource
            name = route.canonical if route is not None else "unmatched"
            self.http.labels(request.method, name, str(status)).observe(time.perf_counter() - started)


class BulkHistogram(Collector):
    """A histogram with one label fed a list of values at a time: prometheus_client's
    Histogram takes a lock and walks its buckets in Python for each value, ~5% of a
    follower's tick thread when a spike's leases apply (a lease entry grants hundreds)."""

    def __init__(self, name: str, documentation: str, buckets_s: tuple[float, ...], label: str) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self._bounds = list(buckets_s)
        self._series: dict[str, tuple[list[int], list[float]]] = {}  # label value -> (counts, [sum])
        self._lock = threading.Lock()  # observed in the tick thread, collected in the HTTP one

    def observe_many(self, values: list[float], label_value: str) -> None:
        if not values:
            return
        slots = [bisect_left(self._bounds, v) for v in values]  # first bound >= v: Prometheus' le
        with self._lock:
            # The last count is +Inf's own.
            counts, total = self._series.setdefault(label_value, ([0] * (len(self._bounds) + 1), [0.0]))
            for slot, value in zip(slots, values):
                counts[slot] += 1
                total[0] += value

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=[self.label])]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            series = {value: (list(counts), total[0]) for value, (counts, total) in self._series.items()}
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, (counts, total) in sorted(series.items()):
            cumulative, buckets = 0, []
            for bound, count in zip([*self._bounds, float("inf")], counts):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            family.add_metric([value], buckets, total)
        yield family


class _StateCollector(Collector):
    """Gauges read from the replica when Prometheus scrapes."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # names are known only at collect time; auto_describe must not scan the store

    def collect(self) -> Iterator[Metric]:
        node = self.metrics.node
        limits = node.config.limits
        now = node.now_us()
        jobs = GaugeMetricFamily("schedulerd_jobs", "Jobs by state.", labels=["state"])
        runs = GaugeMetricFamily("schedulerd_runs", "Runs by state (the states that hold an index entry).",
                                 labels=["state"])
        overdue = GaugeMetricFamily("schedulerd_overdue_jobs", "Jobs whose next occurrence is due but unclaimed.")
        overdue_age = GaugeMetricFamily("schedulerd_overdue_oldest_age_seconds",
                                        "How long the oldest unclaimed due occurrence has waited (0 when none).")
        # Per queue, from the groups this node leads: each group's runs once in the cluster
        # (sum them across nodes), as the autoscaling signal needs them (docs/autoscaling.md).
        depth = GaugeMetricFamily("schedulerd_queue_ready", "Runs leasable now, per queue, in the groups this node "
                                  "leads (sum across nodes).", labels=["queue"])
        waiting = GaugeMetricFamily("schedulerd_queue_waiting",
                                    "Runs queued for later (retry backoff, claimed ahead), per queue, in "
                                    "the groups this node leads (sum across nodes).", labels=["queue"])
        running = GaugeMetricFamily("schedulerd_queue_running", "Runs leased to a worker now, per queue, in the "
                                    "groups this node leads (sum across nodes).", labels=["queue"])
        ready_age = GaugeMetricFamily("schedulerd_queue_oldest_ready_age_seconds",
                                      "How long the oldest leasable run of a queue has waited, in the groups this "
                                      "node leads (max across nodes).", labels=["queue"])
        truncated = GaugeMetricFamily("schedulerd_metrics_scan_truncated",
                                      "1 when a scan hit metrics_scan_max and its figures are lower bounds.")
        job_counts: dict[str, int] = {}
        run_counts = {"pending": 0, "running": 0, "dead_letter": 0}
        due_count, oldest_due, cut, stored_runs = 0, None, False, 0
        queues: dict[str, list[int]] = {}
        leased: dict[str, int] = {}
        for group in node.groups:
            with node.read(group) as (txn, tables):
                for state, n in queries.job_state_counts(txn, tables).items():
                    job_counts[state] = job_counts.get(state, 0) + n
                stats = queries.counts(txn, tables)
                run_counts["pending"] += stats["ready"]
                run_counts["running"] += stats["leases"]
                run_counts["dead_letter"] += txn.stat(tables.dead_letters)["entries"]
                stored_runs += txn.stat(tables.runs)["entries"]
                due = queries.due(txn, tables, node.shards_of(group), now, limits.metrics_scan_max)
                cut |= len(due) >= limits.metrics_scan_max
                due_count += len(due)
                if due:
                    first = min(fire for _, fire in due)
                    oldest_due = first if oldest_due is None else min(oldest_due, first)
                if group.is_leader():
                    cut |= queries.queue_stats(txn, tables, now, limits.metrics_scan_max, queues)
                    cut |= queries.running_by_queue(txn, tables, limits.metrics_scan_max, leased)
        for state, n in sorted(job_counts.items()):
            jobs.add_metric([state], n)
        for state, n in run_counts.items():
            runs.add_metric([state], n)
        stored = GaugeMetricFamily("schedulerd_runs_stored", "Run records this replica holds, every state: what "
                                                             "history_limit and the TTLs bound.")
        stored.add_metric([], stored_runs)
        overdue.add_metric([], due_count)
        overdue_age.add_metric([], (now - oldest_due) / US_PER_S if oldest_due is not None else 0.0)
        for queue, (ready, later, oldest) in sorted(queues.items()):
            depth.add_metric([queue], ready)
            waiting.add_metric([queue], later)
            ready_age.add_metric([queue], (now - oldest) / US_PER_S)
        for queue, count in sorted(leased.items()):
            running.add_metric([queue], count)
        truncated.add_metric([], 1 if cut else 0)
        yield from (jobs, runs, stored, overdue, overdue_age, depth, waiting, running, ready_age, truncated)
        yield from self._raft()
        yield from self._topology()
        yield from self._disk()
        waiters = GaugeMetricFamily("schedulerd_poll_waiters", "Worker long-polls waiting on this node.")
        waiters.add_metric([], self.metrics.poll_waiters())
        yield waiters

    def _disk(self) -> Iterator[Metric]:
        """The data directory's free space and the floor under which this node refuses writes (503)."""
        disk = self.metrics.node.disk
        free = GaugeMetricFamily("schedulerd_disk_free_bytes", "Free bytes on the data directory's file system "
                                 "(statvfs f_bavail, re-read at most every 0.5 s).")
        free.add_metric([], disk.free_bytes())
        floor = GaugeMetricFamily("schedulerd_disk_free_bytes_min", "disk_free_bytes_min: below this many free "
                                  "bytes the node refuses writes with 503.")
        floor.add_metric([], disk.free_bytes_min)
        refused = CounterMetricFamily("schedulerd_disk_write_refusals", "Write requests refused by this node "
                                      "because its disk was under disk_free_bytes_min.")
        refused.add_metric([], disk.refusals)
        yield from (free, floor, refused)

    def _topology(self) -> Iterator[Metric]:
        """The registry and placement as this node's metadata replica has them (the same on
        every node: query one, or max across them); silences only on the metadata leader."""
        topology = self.metrics.node.topology
        if topology is None:
            return
        figures = topology.figures({g.group_id: g.status()["leader"] for g in self.metrics.node.groups})
        nodes = GaugeMetricFamily("schedulerd_nodes", "Registered nodes, by state.", labels=["state"])
        for state, n in figures["nodes_by_state"].items():
            nodes.add_metric([state], n)
        under = GaugeMetricFamily("schedulerd_groups_under_replicated",
                                  "Data groups with fewer alive or suspect members than the replication factor.")
        under.add_metric([], figures["under_replicated"])
        imbalance = GaugeMetricFamily("schedulerd_leader_imbalance",
                                      "Most data-group leaders on one node minus the fewest on another.")
        imbalance.add_metric([], figures["leader_imbalance"])
        moves = CounterMetricFamily("schedulerd_placement_moves", "Replica moves recorded, by outcome.",
                                    labels=["outcome"])
        for outcome, n in figures["moves"].items():
            moves.add_metric([outcome], n)
        silence = GaugeMetricFamily("schedulerd_node_silence_seconds",
                                    "On the metadata leader: seconds since each node was last heard.",
                                    labels=["node_id"])
        for node_id, seconds in figures["silence_s"].items():
            silence.add_metric([node_id], seconds)
        yield from (nodes, under, imbalance, moves, silence)

    def _raft(self) -> Iterator[Metric]:
        leader = GaugeMetricFamily("schedulerd_raft_is_leader", "1 when this node leads the group.", labels=["group"])
        term = GaugeMetricFamily("schedulerd_raft_term", "Current Raft term.", labels=["group"])
        commit = GaugeMetricFamily("schedulerd_raft_commit_index", "Raft commit index.", labels=["group"])
        applied = GaugeMetricFamily("schedulerd_raft_applied_index", "Last entry applied to LMDB.", labels=["group"])
        quorum = GaugeMetricFamily("schedulerd_raft_has_quorum", "1 when the group has a leader with a quorum.",
                                   labels=["group"])
        changes = CounterMetricFamily("schedulerd_raft_leader_changes", "Leader changes seen by this node.",
                                      labels=["group"])
        skew = GaugeMetricFamily("schedulerd_raft_peer_clock_offset_seconds",
                                 "On a leader: how far each follower's clock is at least ahead of its own.",
                                 labels=["group", "peer"])
        version = GaugeMetricFamily("schedulerd_raft_entry_version",
                                    "The entry version this node writes: below its build's newest while a voter "
                                    "reads only older ones (a rolling upgrade under way).", labels=["group"])
        for group in self.metrics.node.groups:
            s = group.status()
            g = [str(group.group_id)]
            leader.add_metric(g, 1 if s["is_leader"] else 0)
            term.add_metric(g, s["term"])
            commit.add_metric(g, s["commit_index"])
            applied.add_metric(g, s["last_applied"])
            quorum.add_metric(g, 1 if s["has_quorum"] else 0)
            changes.add_metric(g, group.leader_changes)
            version.add_metric(g, s["entry_version"])
            for peer, offset_ms in s["peer_clock_offsets_ms"].items():
                skew.add_metric([*g, peer], offset_ms / 1000)
        yield from (leader, term, commit, applied, quorum, changes, skew, version)
