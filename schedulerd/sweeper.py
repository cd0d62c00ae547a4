"""Where expired jobs and runs are swept: the group leader reads the expiry keys due
by now, judges them on its replica (storage/retention.py), archives what will go
(--archive-dir) and proposes SWEEP_EXPIRED naming it. Apply judges again on every
replica and deletes only what was named, so nothing leaves the store unarchived.

Its own loop beside the due scan's (LeaderLoops runs both): a sweep of a large
backlog never holds up a claim, and its rate is capped (sweep_keys_per_s_max)."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from schedulerd import archive, views
from schedulerd.errors import SchedulerError
from schedulerd.node import Node
from schedulerd.raft.group import Group
from schedulerd.storage import ops, queries, records, retention
from schedulerd.storage.ops import Op
from schedulerd.timefmt import to_iso

log = logging.getLogger("schedulerd.sweeper")


class Sweeper:
    def __init__(self, node: Node) -> None:
        self.node = node

    async def run(self, group: Group) -> None:
        """Sweep while this node leads the group (schedulerd/leader.py starts it per group)."""
        limits = self.node.config.limits
        full_batch_pause_s = limits.sweep_batch_max / limits.sweep_keys_per_s_max
        while True:
            pause = self.node.config.sweep_interval_s
            try:
                # The op is new in entry version 11: an older voter would stop on it.
                if group.is_leader() and group.versions.writes() >= ops.RETENTION_SINCE \
                        and await self.sweep(group):
                    pause = full_batch_pause_s
            except (SchedulerError, OSError) as exc:
                log.warning("sweep_failed group=%d error=%s", group.group_id, exc)
            except Exception:  # a bug here must not end retention silently: say it, try again
                log.exception("sweep_failed group=%d", group.group_id)
            await asyncio.sleep(pause)

    async def sweep(self, group: Group) -> bool:
        """One sweep entry; True if it took a full batch of keys (more may be due)."""
        limits = self.node.config.limits
        now = group.clocks.cluster_now_us()
        # Judging a batch and writing the archive take milliseconds: off the event loop,
        # which serves the polls and acks meanwhile.
        due, verdicts = await asyncio.to_thread(self._judge_and_archive, group, now)
        if not verdicts:
            return False
        result = await self.node.propose(group, Op.SWEEP_EXPIRED, {
            "now": now, "runs_max": limits.sweep_runs_max,
            "checks": [[check_us, job_id, v.runs, v.job] for check_us, job_id, v in verdicts]})
        if result["deleted_jobs"] or result["deleted_runs"]:
            log.debug("swept group=%d jobs=%d runs=%d", group.group_id, result["deleted_jobs"],
                      result["deleted_runs"])
        return due >= limits.sweep_batch_max

    def _judge_and_archive(self, group: Group, now: int) -> tuple[int, list[tuple[int, str, retention.Verdict]]]:
        """(due keys read, their verdicts), with what the verdicts delete archived and fsynced."""
        limits, archive_dir = self.node.config.limits, self.node.config.archive_dir
        with self.node.read(group) as (txn, tables):
            due = queries.expiry_due(txn, tables, now, limits.sweep_batch_max)
            if not due:
                return 0, []
            ctx = records.Ctx(txn, tables, group.group_id, 0, ops.VERSION)
            verdicts = retention.plan(ctx, due, now, limits.sweep_runs_max)
            going = _archive_records(ctx, verdicts, group.group_id, now) if archive_dir else []
        if going:
            path = archive.write(archive_dir, group.group_id, now, going)
            log.debug("archived group=%d records=%d path=%s", group.group_id, len(going), path)
        return len(due), verdicts


def _archive_records(ctx: records.Ctx, verdicts: list[tuple[int, str, retention.Verdict]], group_id: int,
                     now: int) -> list[dict[str, Any]]:
    """The views of what the verdicts delete: each job's runs, then the job."""
    stamp = {"group": group_id, "archived_at": to_iso(now)}
    out = []
    for _, job_id, verdict in verdicts:
        for run_id in verdict.runs:
            run = records.get_run(ctx, run_id)
            if run is not None:
                out.append({"kind": "run", **stamp, **views.run(run)})
        job = records.get_job(ctx, job_id) if verdict.job else None
        if job is not None:
            out.append({"kind": "job", **stamp, **views.job(job)})
    return out
