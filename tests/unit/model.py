"""A dumb reference model of the scheduling rules, for tests/unit/test_model.py.

Written from docs/api.md and the rule tests (test_fsm.py, test_semantics.py),
not from storage/: plain dicts, no indexes, no LMDB, every scan a full scan.
Each command method takes the Raft index the entry will be applied at and the
entry's payload, changes the model, and returns (expected result, rejected);
`rejected` means the command must leave the store exactly as it was.

Values the docs only bound (deterministic jitter, backoff ±20%, the spread of
backfilled runs) are kept as a check; `settle` verifies the real value against
the check and adopts it, so later steps compare exactly."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

from schedulerd.storage import ops
from schedulerd.storage.jobs import SPEC_DEFAULTS

S = 1_000_000
CATCHUP_SPACING_US = 100_000  # missed runs of one job are released this far apart (test_semantics)
CATCHUP_SPREAD_US = 1_000_000  # and the job's first one within this window after now
PRUNE_SCAN_MAX = 32  # occurrences looked at per prune (records.prune_history's documented bound)
BUFFERED_MAX = 1000  # buffered runs of one job (docs/semantics.md)
JITTER_SPREAD = 0.2  # backoff: "deterministic jitter ±20%"
FAIR_EVERY = 10  # every 10th LEASE_READY entry serves the longest-waiting runs first (leases.py)

PENDING = frozenset({"queued", "retry_wait"})
OPEN = PENDING | {"running"}
TERMINAL = frozenset({"succeeded", "skipped", "cancelled"})

Rec = dict[str, Any]


# -- schedules -------------------------------------------------------------------------

def first_fire(schedule: Rec) -> int | None:
    """A one-off fires at its time (even a past one); an interval counts from its anchor
    (one interval before its start, when it has one), within its bounds."""
    if schedule["kind"] == "at":
        return schedule["at_us"]
    return next_after(schedule, schedule["anchor_us"])


def next_after(schedule: Rec, t: int) -> int | None:
    """The first occurrence strictly after t, and none outside the schedule's bounds."""
    if schedule["kind"] == "at":
        return schedule["at_us"] if schedule["at_us"] > t else None
    every, anchor = schedule["every_us"], schedule["anchor_us"]
    start, end = schedule.get("start_us"), schedule.get("end_us")
    if start is not None:
        t = max(t, start - 1)
    k = 1 if t < anchor else (t - anchor) // every + 1
    nxt = anchor + k * every
    return None if end is not None and nxt > end else nxt


def limited_out(job: Rec) -> bool:
    """A job with max_runs has made them all (entry version 14)."""
    return job.get("max_runs") is not None and job.get("runs_made", 0) >= job["max_runs"]


def next_at_or_after(schedule: Rec, t: int) -> int | None:
    """The first occurrence time of an interval schedule at or after t (None past its end)."""
    return next_after(schedule, t - 1)


def on_calendar(calendars: Rec, job: Rec, t: int) -> bool:
    """From version 19, an occurrence whose local day (in the calendar's zone) one of the
    ranges of the calendar the job names, as the claim entry carries it, holds (docs/semantics.md)."""
    calendar = calendars.get(job.get("skip_calendar") or "")
    if calendar is None:
        return False
    day = datetime.fromtimestamp(t // S, timezone.utc).astimezone(ZoneInfo(calendar["timezone"])).strftime("%Y-%m-%d")
    return any(first <= day <= last for first, last in calendar["ranges"])


def backoff_bounds_us(backoff: Rec, attempt: int) -> tuple[int, int]:
    raw_ms = min(backoff["max_ms"], backoff["base_ms"] * backoff["factor"] ** max(0, attempt - 1))
    low = min(backoff["max_ms"], raw_ms * (1 - JITTER_SPREAD)) * 1000
    high = min(backoff["max_ms"], raw_ms * (1 + JITTER_SPREAD)) * 1000
    return int(low) - 1, int(high) + 1  # 1 µs of float slack on each side


class Ids:
    """Run ids of one entry: `{group}-{raft index}-{n}` in creation order."""

    def __init__(self, index: int) -> None:
        self.index, self.n = index, 0

    def next(self) -> str:
        self.n += 1
        return f"0-{self.index}-{self.n - 1}"


class Model:
    def __init__(self) -> None:
        self.jobs: dict[str, Rec] = {}
        self.runs: dict[str, Rec] = {}
        self.catchup_offset_us: dict[str, int] = {}  # learned per job, must then stay the same
        self.nacked_by: dict[str, tuple[str, int, str]] = {}  # run -> (worker, fence, error) of its last nack
        self.stats_kept: set[str] = set()  # jobs whose run counts the store keeps (records.job_stats)
        self.dead_head: dict[str, tuple[int, int]] = {}  # job -> (dead_until_us, dead_behind), from version 8
        self.entry_version = ops.VERSION  # of the entry being applied: older ones keep older rules
        self.ids = Ids(0)  # of the entry a failed attempt's pause_on_failure makes its skipped runs in
        self.calendars: Rec = {}  # those the claim entry being applied carries (a create's carries none)
        # From version 21, per queue, the newest limits the group has seen and its bucket:
        # [revision, max_running, micro-tokens per second, micro-tokens, refilled at].
        self.queue_limits: dict[str, list[Any]] = {}

    # -- reads -------------------------------------------------------------------------

    def job_runs(self, job_id: str) -> list[Rec]:
        return sorted((r for r in self.runs.values() if r["job_id"] == job_id), key=lambda r: r["scheduled_us"])

    def stats(self, job_id: str) -> Rec:
        runs = self.job_runs(job_id)
        return {"pending": sum(r["state"] in PENDING for r in runs),
                "running": sum(r["state"] == "running" for r in runs), "runs": len(runs),
                "buffered": sum(r["state"] in PENDING and bool(r.get("buffered")) for r in runs)}

    def taken(self, job_id: str, t: int) -> bool:
        return any(r["job_id"] == job_id and r["scheduled_us"] == t for r in self.runs.values())

    def due(self, until: int) -> set[tuple[str, int]]:
        return {(j["job_id"], j["next_fire_us"]) for j in self.jobs.values()
                if j["state"] == "scheduled" and j["next_fire_us"] is not None and j["next_fire_us"] <= until}

    def ready(self, now: int) -> list[str]:
        """Leasable run ids, highest priority first, then earliest available, then id."""
        ready = [r for r in self.runs.values() if self._leasable(r, now)]
        ready.sort(key=lambda r: (-r["priority"], r["available_us"], r["run_id"].encode()))
        return [r["run_id"] for r in ready]

    @staticmethod
    def _leasable(run: Rec, now: int) -> bool:
        return run["state"] in PENDING and run["available_us"] <= now and not run.get("buffered")

    def expired(self, now: int) -> set[tuple[str, int]]:
        return {(r["run_id"], r["fence"]) for r in self.runs.values()
                if r["state"] == "running" and r["lease_until_us"] <= now}

    # -- jobs --------------------------------------------------------------------------

    def create(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        """From version 3 on, a new job whose first occurrence is due within claim_ahead_us
        (and not before the grace) has it claimed by the creating entry, as a scan would."""
        now, ids, out, queued = cmd["now"], Ids(index), [], []
        ahead = cmd.get("claim_ahead_us") if self.entry_version >= 3 else None
        for spec in cmd["jobs"]:
            if self.entry_version >= 5:  # the entry leaves out the fields that hold their default
                spec = dict(SPEC_DEFAULTS, **spec)
            if spec["job_id"] in self.jobs:
                out.append((spec["job_id"], False, "conflict"))
                continue
            job = {k: v for k, v in spec.items() if k != "schedule_spec"}
            if self.entry_version >= ops.RETENTION_SINCE:  # the entry's default TTL, unless the job gives its own
                ttl = job.get("finished_ttl_us", cmd.get("finished_ttl_us", 0))
                job.update(finished_ttl_us=ttl, history_ttl_us=job.get("history_ttl_us", ttl),
                           keep_dead_letters=job.get("keep_dead_letters", False))
            job.update(state="scheduled", next_fire_us=first_fire(spec["schedule"]))
            self.jobs[spec["job_id"]] = job
            out.append((spec["job_id"], True, None))
            fire = job["next_fire_us"]
            if fire is None:
                job["state"] = "completed"  # a bounded schedule already past its end
            elif ahead is not None and now - cmd["grace_us"] <= fire <= now + ahead and not job.get("skip_calendar"):
                # A job naming a calendar is left to the scan, whose entry carries it.
                queued += [run["run_id"] for run in self._on_time(ids, job, fire, now) if run["state"] == "queued"]
        return (out, queued), all(not ok for _, ok, _ in out)

    def cancel(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        job, now = self.jobs.get(cmd["job_id"]), cmd["now"]
        if job is None:
            return (False, "not_found", None), True
        if job["state"] == "cancelled":
            return (True, None, 0), True  # idempotent
        if self.entry_version >= ops.CANCEL_WITHDRAWS_SINCE:
            self._withdraw_ahead(job, cmd)
        pending = [r for r in self.job_runs(job["job_id"]) if r["state"] in PENDING]
        running = self.entry_version >= 7 and any(r["state"] == "running" for r in self.job_runs(job["job_id"]))
        if job["state"] == "completed" and not pending and not running:
            return (False, "conflict", None), True
        job.update(state="cancelled", next_fire_us=None)
        for run in pending:  # a running run may finish
            run.update(state="cancelled", finished_us=now, reason="job_cancelled")
            run.pop("buffered", None)
        return (True, None, len(pending)), False

    def _live(self, job_id: str) -> tuple[Rec | None, Any]:
        job = self.jobs.get(job_id)
        if job is None:
            return None, (False, "not_found")
        if job["state"] in ("cancelled", "completed"):
            return None, (False, "conflict")
        return job, None

    def _withdraw_ahead(self, job: Rec | None, cmd: Rec) -> bool:
        """Queued runs claimed ahead of their time (not a trigger) are given back: deleted,
        the job re-armed at the earliest (entries of version 2 on)."""
        if job is None or self.entry_version < 2 or job["state"] not in ("scheduled", "completed"):
            return False
        ahead = [r for r in self.job_runs(job["job_id"])
                 if r["scheduled_us"] > cmd["now"] and not r["trigger"] and r["state"] == "queued"]
        if not ahead:
            return False
        for run in ahead:
            del self.runs[run["run_id"]]
            if job.get("max_runs") is not None:  # never claimed: uncounted
                job["runs_made"] = max(0, job.get("runs_made", 0) - 1)
        earliest = ahead[0]["scheduled_us"]
        if job["next_fire_us"] is None or earliest < job["next_fire_us"]:
            job["next_fire_us"] = earliest
        job["state"] = "scheduled"
        return True

    def pause(self, index: int, cmd: Rec, cause: Rec | None = None, ids: Ids | None = None) -> tuple[Any, bool]:
        """`cause`: a dead letter paused it (pause_on_failure), in the entry whose `ids` it uses."""
        self._withdraw_ahead(self.jobs.get(cmd["job_id"]), cmd)
        job, err = self._live(cmd["job_id"])
        if err:
            return err, True
        if job["state"] == "paused":
            return (True, None), True  # idempotent
        if self.entry_version >= ops.OVERDUE_RECORDED_SINCE and job["schedule"]["kind"] != "at":
            self._skip_overdue(ids or Ids(index), job, cmd["now"], None, "paused")  # a one-off's waits for the resume
        job.update(state="paused", next_fire_us=None)
        if cause is not None:
            job["pause_cause"] = cause
        return (True, None), False

    def resume(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        """Re-armed from now: nothing from inside the pause is caught up; a one-off at its own time
        (from version 9: a passed one is then claimed as missed; before, it fired at the resume's time).
        From version 3 on, a one-off completed by a claim ahead of its time is resumed as the
        scheduled job it reads as: a no-op."""
        ahead = self.jobs.get(cmd["job_id"])
        if ahead is not None and self.entry_version >= 3 and ahead["state"] == "completed" and \
                ahead["schedule"]["kind"] == "at" and ahead["schedule"]["at_us"] > cmd["now"]:
            return (True, None), True
        job, err = self._live(cmd["job_id"])
        if err:
            return err, True
        if job["state"] == "scheduled":
            return (True, None), True  # idempotent
        sched, now = job["schedule"], cmd["now"]
        if sched["kind"] == "at":
            nxt = sched["at_us"] if self.entry_version >= ops.OVERDUE_RECORDED_SINCE else max(sched["at_us"], now)
        else:
            nxt = next_after(sched, now)
        if limited_out(job):
            nxt = None
        job.update(state="scheduled" if nxt is not None else "completed", next_fire_us=nxt)  # past its end or limit
        job.pop("pause_cause", None)
        return (True, None), False

    def update(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        job = self.jobs.get(cmd["job_id"])
        if job is None:
            return (False, "not_found"), True
        if job["state"] == "cancelled":
            return (False, "conflict"), True
        changes = {k: v for k, v in cmd["changes"].items() if k != "schedule_spec"}
        if "backoff" in changes and self.entry_version >= ops.BACKOFF_PARTS_SINCE:
            # The parts given, over the job's backoff as stored when the entry applies.
            changes["backoff"] = {**(job.get("backoff") or SPEC_DEFAULTS["backoff"]), **changes["backoff"]}
            if changes["backoff"]["max_ms"] < changes["backoff"]["base_ms"]:
                return (False, "invalid_job"), True
        self._withdraw_ahead(job, cmd)
        if "schedule" in changes and self.entry_version >= ops.OVERDUE_RECORDED_SINCE:
            self._skip_overdue(Ids(index), job, cmd["now"], first_fire(changes["schedule"]), "rescheduled")
        job.update(changes)
        if changes.get("overlap_policy") in ("allow", "skip", "cancel_other"):  # nothing to wait behind now
            self._release([r for r in self.job_runs(job["job_id"]) if r.get("buffered")], cmd["now"])
        rearm = "schedule" in changes or ("max_runs" in changes and job["schedule"]["kind"] != "at")
        if rearm and job["state"] != "paused":
            if "schedule" in changes:
                job["next_fire_us"] = first_fire(job["schedule"])
            elif job["state"] == "completed":  # a limit raised or lifted: on from now
                job["next_fire_us"] = next_after(job["schedule"], cmd["now"])
            if limited_out(job):
                job["next_fire_us"] = None
            if job["state"] == "completed" and job["next_fire_us"] is not None:
                job["state"] = "scheduled"
            elif job["state"] == "scheduled" and job["next_fire_us"] is None:
                job["state"] = "completed"  # a bounded schedule with nothing left
        return (True, None), False

    def trigger(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        """An extra occurrence now, at the first free microsecond; no deadline, no overlap rule."""
        job, now = self.jobs.get(cmd["job_id"]), cmd["now"]
        if job is None:
            return (False, "not_found", None), True
        if job["state"] == "cancelled":
            return (False, "conflict", None), True
        at = now
        while self.taken(job["job_id"], at):
            at += 1
        self._prune(job["job_id"], job["history_limit"] - 1, now)
        run = self._occur(Ids(index), job, at, now, ("exact", now), trigger=True)
        return (True, None, run["run_id"]), False

    def backfill(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        """A run for each named occurrence of the schedule (as stored) that has none, released
        as a catch-up's are; the entry's overlap policy or the job's; no deadline, no max_runs."""
        job, now = self.jobs.get(cmd["job_id"]), cmd["now"]
        if job is None:
            return (False, "not_found", None), True
        if job["state"] == "cancelled":
            return (False, "conflict", None), True
        subject = dict(job, overlap_policy=cmd.get("overlap_policy", job["overlap_policy"]))
        self._prune(job["job_id"], job["history_limit"] - 1, now)
        ids, queued, k = Ids(index), [], 0
        reached = job["next_fire_us"]  # from here on the job's own claims take them
        fresh = [t for t in cmd["occurrences"] if next_after(job["schedule"], t - 1) == t
                 and (reached is None or t < reached) and not self.taken(job["job_id"], t)]
        replacing = self.entry_version >= ops.OVERLAP_HOLD_SINCE and subject["overlap_policy"] == "cancel_other"
        for t in fresh:
            if replacing and t != fresh[-1]:  # each would cancel the one before: the newest runs
                self._skipped(ids, subject, t, now, "overlap")
                continue
            run = self._occur(ids, subject, t, now, ("catchup", job["job_id"], now, k), backfill=True)
            if run["state"] == "queued":
                queued.append(run["run_id"])
                k += 1
        return (True, None, queued), False

    # -- claims ------------------------------------------------------------------------

    def claim(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        now, grace, ids = cmd["now"], cmd["grace_us"], Ids(index)
        self.calendars = cmd.get("calendars", {}) if self.entry_version >= ops.CALENDAR_SINCE else {}
        queued, skipped, stale, advanced, deferred = [], 0, 0, False, []
        for job_id, fire in cmd["claims"]:
            job = self.jobs.get(job_id)
            if job is None or job["state"] != "scheduled" or job["next_fire_us"] != fire:
                stale += 1
                continue
            if self.taken(job_id, fire):
                # A trigger (or an earlier schedule) already stands for this occurrence.
                self._advance(job, next_after(job["schedule"], fire))
                stale, advanced = stale + 1, True
                continue
            if fire > now and self.entry_version >= 2 and self._verdict(job) != "run":
                deferred.append((job_id, fire))  # the overlap rule is for the occurrence's time
                continue
            self._prune(job_id, job["history_limit"] - 1, now)
            cutoff = now - grace
            made = self._on_time(ids, job, fire, now) if fire >= cutoff else self._missed(ids, job, fire, now, cutoff)
            for run in made:
                if run["state"] == "queued":
                    queued.append(run["run_id"])
                else:
                    skipped += 1
        return (queued, skipped, stale, deferred), ids.n == 0 and not advanced

    def _on_time(self, ids: Ids, job: Rec, fire: int, now: int) -> list[Rec]:
        nxt = next_after(job["schedule"], fire)
        spread = job["jitter_us"] if nxt is None else min(job["jitter_us"], nxt - fire - 1)
        avail = ("exact", fire) if job["jitter_us"] == 0 else ("between", fire, fire + spread)
        if on_calendar(self.calendars, job, fire):
            run = self._skipped(ids, job, fire, now, "calendar")
        else:
            run = self._occur(ids, job, fire, now, avail)
        self._advance(job, None if self._count(job, run) else nxt)
        return [run]

    def _count(self, job: Rec, run: Rec) -> bool:
        """A limited job's run of an occurrence counts; whether the limit is reached."""
        if job.get("max_runs") is None or run["state"] != "queued":
            return False
        job["runs_made"] = job.get("runs_made", 0) + 1
        return limited_out(job)

    def _missed(self, ids: Ids, job: Rec, fire: int, now: int, cutoff: int) -> list[Rec]:
        """Missed occurrences in [fire, cutoff): the newest catchup_limit are considered,
        the older ones get one summary record; misfire_policy picks what runs."""
        recent, made = self._recent_missed(ids, job, fire, now, cutoff)
        to_run = {"fire_all": recent, "fire_once": recent[-1:], "skip": []}[job["misfire_policy"]]
        replacing = self.entry_version >= ops.OVERLAP_HOLD_SINCE and job["overlap_policy"] == "cancel_other"
        if replacing:  # each run would cancel the one before: only the newest runs
            to_run = to_run[-1:]
        k, done = 0, False
        for t in recent:
            if self.taken(job["job_id"], t):
                continue  # a trigger (or a run claimed ahead, before a re-arm) already stands for it
            if on_calendar(self.calendars, job, t):
                made.append(self._skipped(ids, job, t, now, "calendar"))
            elif t in to_run:
                made.append(self._occur(ids, job, t, now, ("catchup", job["job_id"], now, k)))
                k += 1
                if self._count(job, made[-1]):
                    done = True  # what comes after the limit is not the job's
                    break
            else:
                reason = "overlap" if replacing and job["misfire_policy"] == "fire_all" else "misfire_skip"
                made.append(self._skipped(ids, job, t, now, reason))
        self._advance(job, None if done else next_after(job["schedule"], cutoff - 1))
        return made

    def _recent_missed(self, ids: Ids, job: Rec, fire: int, now: int, end: int) -> tuple[list[int], list[Rec]]:
        """The newest catchup_limit occurrences in [fire, end), and a summary record of the older ones."""
        sched, missed, t = job["schedule"], [], fire
        while t is not None and t < end:
            missed.append(t)
            t = next_after(sched, t)
        limit = job["catchup_limit"]
        recent, older = missed[-limit:], missed[:-limit]
        if not older:
            return recent, []
        free = [t for t in older if not self.taken(job["job_id"], t)]  # a trigger's run may hold the first
        if not free:
            return recent, []
        summary = self._new_run(ids, job, free[0], now, "skipped", ("exact", free[0]))
        summary.update(reason="catchup_limit", finished_us=now, skipped_count=len(older), skipped_until_us=older[-1])
        return recent, [summary]

    def _skip_overdue(self, ids: Ids, job: Rec, now: int, before: int | None, reason: str) -> None:
        """From version 9, a pause or a schedule PATCH records the occurrences of a scheduled job
        due at or before now (and before `before`) that no claim took: skipped, `reason`."""
        fire = job["next_fire_us"]
        end = now + 1 if before is None else min(now + 1, before)
        if job["state"] != "scheduled" or fire is None or fire >= end:
            return
        self._prune(job["job_id"], job["history_limit"] - 1, now)
        recent, _ = self._recent_missed(ids, job, fire, now, end)
        for t in recent:
            if not self.taken(job["job_id"], t):
                self._skipped(ids, job, t, now, reason)

    def _advance(self, job: Rec, nxt: int | None) -> None:
        job["next_fire_us"] = nxt
        if nxt is None:
            job["state"] = "completed"

    def _occur(self, ids: Ids, job: Rec, t: int, now: int, avail: tuple, trigger: bool = False,
               backfill: bool = False) -> Rec:
        deadline = job["starting_deadline_us"]
        if not (trigger or backfill) and deadline is not None and t + deadline < now:
            return self._skipped(ids, job, t, now, "deadline")
        verdict = "run" if trigger else self._verdict(job)
        if verdict == "skip":
            return self._skipped(ids, job, t, now, "overlap")
        if verdict == "replace":  # cancel_other: every open run is cancelled first
            for other in self.job_runs(job["job_id"]):
                if other["state"] in PENDING or other["state"] == "running":
                    other.update(state="cancelled", lease_until_us=None, finished_us=now, reason="overlap")
                    other.pop("buffered", None)
        run = self._new_run(ids, job, t, now, "queued", avail)
        run["trigger"] = trigger
        if verdict == "buffer":
            run["buffered"] = True
        if backfill:
            run["starting_deadline_us"] = None  # late on purpose: no deadline, at claim or at lease
        if trigger:
            self.stats_kept.add(job["job_id"])
        return run

    def _verdict(self, job: Rec) -> str:
        """What a new occurrence does by the overlap policy: run, skip, buffer or replace."""
        st, policy = self.stats(job["job_id"]), job["overlap_policy"]
        busy = st["pending"] + st["running"] > 0
        if policy == "allow":
            return "run"
        if policy == "skip":
            return "skip" if busy else "run"
        if self.entry_version < ops.OVERLAP_HOLD_SINCE:  # every other policy then was buffer_one's old rule
            return "skip" if st["pending"] else "run"
        if policy == "buffer_one":
            return "skip" if st["pending"] else "buffer" if st["running"] else "run"
        if policy == "buffer_all":
            return ("skip" if st["buffered"] >= BUFFERED_MAX else "buffer") if busy else "run"
        return "replace" if busy else "run"

    def release(self, now: int) -> None:
        """After every entry: a job with buffered runs and nothing open left gets its oldest
        buffered run released."""
        for job_id in sorted(self.jobs):
            held = [r for r in self.job_runs(job_id) if r.get("buffered")]
            st = self.stats(job_id)
            if held and st["pending"] + st["running"] - st["buffered"] == 0:
                self._release(held[:1], now)

    @staticmethod
    def _release(runs: list[Rec], now: int) -> None:
        for run in runs:
            del run["buffered"]
            if run["available_us"] is not None:  # else a catch-up's, after now: settle checks it
                run["available_us"] = max(run["available_us"], now)

    def _skipped(self, ids: Ids, job: Rec, t: int, now: int, reason: str) -> Rec:
        run = self._new_run(ids, job, t, now, "skipped", ("exact", t))
        run.update(reason=reason, finished_us=now)
        return run

    def _new_run(self, ids: Ids, job: Rec, t: int, now: int, state: str, avail: tuple) -> Rec:
        assert not self.taken(job["job_id"], t), f"model: occurrence {job['job_id']}@{t} made twice"
        if self.entry_version < 4 or job["schedule"]["kind"] != "at":
            self.stats_kept.add(job["job_id"])
        self._reopen_dead_head({"job_id": job["job_id"], "scheduled_us": t})
        run = {"run_id": ids.next(), "job_id": job["job_id"], "scheduled_us": t, "state": state, "attempt": 0,
               "queue": job["queue"], "priority": job["priority"], "max_attempts": job["max_attempts"], "backoff": job["backoff"],
               "timeout_us": job["timeout_us"], "available_us": avail[1] if avail[0] == "exact" else None,
               "avail_check": None if avail[0] == "exact" else avail, "worker_id": None, "fence": 0,
               "lease_until_us": None, "attempt_deadline_us": None, "finished_us": None, "reason": None,
               "trigger": False, "starting_deadline_us": job["starting_deadline_us"]}
        self.runs[run["run_id"]] = run
        return run

    def _reopen_dead_head(self, run: Rec) -> None:
        """A run at or before where pruning starts (version 8 on) makes it start from the oldest again."""
        if run["scheduled_us"] <= self.dead_head.get(run["job_id"], (-1, 0))[0]:
            del self.dead_head[run["job_id"]]

    def _prune(self, job_id: str, keep: int, now: int) -> None:
        """Keep the newest `keep` runs; of the older ones (bounded scan) drop the terminal runs
        of occurrences already past: a re-arm could claim a dropped future one again."""
        runs = self.job_runs(job_id)
        floored = self.entry_version >= 8 and job_id in self.stats_kept
        until, behind = self.dead_head.get(job_id, (-1, 0)) if floored else (-1, 0)
        older = len(runs) - keep - behind
        head = floored
        for run in [r for r in runs if r["scheduled_us"] > until][:min(older, PRUNE_SCAN_MAX)] if older > 0 else []:
            if run["state"] in TERMINAL and run["scheduled_us"] < now:
                del self.runs[run["run_id"]]
            elif head and run["state"] == "dead_letter":  # from version 8, the next scan starts after it
                behind += 1
                self.dead_head[job_id] = (run["scheduled_us"], behind)
            else:
                head = False

    def purge(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        """A completed or cancelled job with nothing waiting or running: up to runs_max of
        its runs (oldest first) go per entry, then the job, and its id is free again."""
        job = self.jobs.get(cmd["job_id"])
        if job is None:
            return (False, "not_found", None), True
        runs = self.job_runs(job["job_id"])
        if job["state"] not in ("completed", "cancelled") or any(r["state"] in PENDING | {"running"} for r in runs):
            return (False, "conflict", None), True
        for run in runs[:cmd["runs_max"]]:
            del self.runs[run["run_id"]]
        if len(runs) > cmd["runs_max"]:
            return (True, None, False), False
        del self.jobs[job["job_id"]]
        self.stats_kept.discard(job["job_id"])
        self.dead_head.pop(job["job_id"], None)
        return (True, None, True), False

    def discard(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        run = self.runs.get(cmd["run_id"])
        if run is None:
            return (False, "not_found"), True
        if run["state"] != "dead_letter":
            return (False, "conflict"), True
        self._reopen_dead_head(run)
        del self.runs[run["run_id"]]
        return (True, None), False

    def sweep(self, index: int, cmd: Rec, updated_us: dict[str, int]) -> tuple[Any, bool]:
        """SWEEP_EXPIRED, judged the plain way over all of a job's runs. `updated_us`: each
        job's last change as stored (the model does not keep it)."""
        budget, jobs, runs = cmd["runs_max"], 0, 0
        for _, job_id, named_runs, named_job in cmd["checks"]:
            if budget <= 0:
                continue
            going, whole, read = self._judge(job_id, cmd["now"], budget, updated_us.get(job_id))
            budget -= max(read, 1)
            for run_id in going:
                if run_id in named_runs:
                    self._reopen_dead_head(self.runs[run_id])
                    del self.runs[run_id]
                    runs += 1
            if whole and named_job and set(going) <= set(named_runs):
                del self.jobs[job_id]
                self.stats_kept.discard(job_id)
                self.dead_head.pop(job_id, None)
                jobs += 1
        return (jobs, runs), False

    def _judge(self, job_id: str, now: int, budget: int, updated: int | None) -> tuple[list[str], bool, int]:
        """(runs that go, whether the job goes, runs read): closed jobs by finished_ttl, whole;
        the others' ended runs by history_ttl."""
        job = self.jobs.get(job_id)
        if job is None:
            return [], False, 0
        runs = self.job_runs(job_id)
        closed = job["state"] in ("completed", "cancelled") and not any(r["state"] in OPEN for r in runs)
        finished_ttl, history_ttl = job.get("finished_ttl_us", 0), job.get("history_ttl_us", 0)
        if not finished_ttl and not history_ttl:
            return [], False, 0
        read = min(len(runs), budget)  # a judgement reads the runs its budget allows, whatever it finds
        ttl, whole = (finished_ttl, True) if closed and finished_ttl else (history_ttl, False)
        if not ttl:
            return [], False, read
        going, kept = [], False
        for run in runs[:budget]:
            if run["state"] in OPEN or run["scheduled_us"] >= now or \
                    (run["state"] == "dead_letter" and job.get("keep_dead_letters")):
                kept = True
            elif run["finished_us"] + ttl > now:
                return going, False, read  # a run not that old yet: the rest wait for a later look
            else:
                going.append(run["run_id"])
        gone = whole and len(runs) <= budget and not kept and updated is not None and updated + ttl <= now
        return going, gone, read

    # -- leases ------------------------------------------------------------------------

    def lease(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        """LEASE_BATCH: the entry names the runs."""
        now, grants, skipped = cmd["now"], [], 0
        for worker, run_ids in cmd["grants"]:
            got = []
            for run_id in run_ids:
                run = self.runs.get(run_id)
                if run is None or not self._leasable(run, now):
                    continue
                if self._grant(run, worker, index, now, cmd["lease_until"]):
                    got.append(run_id)
                else:
                    skipped += 1
            grants.append((worker, got))
        return (grants, skipped), skipped == 0 and not any(got for _, got in grants)

    def lease_ready(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        """LEASE_READY: each worker in turn takes up to its count of ready runs of its queues:
        highest priority first, then queue order, earliest available, id; every
        FAIR_EVERY-th entry earliest available first whatever the priority. From version 21
        a run of a queue at its limits is passed over (it stays ready)."""
        now, grants, skipped = cmd["now"], [], 0
        limits = _EntryLimits(self, cmd.get("limits") or {}, now) if self.entry_version >= 21 else None
        for worker, queues, want in cmd["grants"]:
            def order(r: Rec) -> tuple[Any, ...]:
                if index % FAIR_EVERY == 0:
                    return r["available_us"], r["queue"], r["run_id"].encode()
                return -r["priority"], queues.index(r["queue"]), r["available_us"], r["run_id"].encode()
            ready = sorted((r for r in self.runs.values() if self._leasable(r, now) and r["queue"] in queues), key=order)
            if limits is not None:  # the group takes the entry's newer limits of every queue a poll names
                for queue in queues:
                    limits.load(queue)
            got = []
            for run in ready:
                if len(got) == want:
                    break
                if limits is not None and not limits.room(run["queue"]):
                    continue
                if self._grant(run, worker, index, now, cmd["lease_until"]):
                    got.append(run["run_id"])
                    if limits is not None:
                        limits.spend(run["queue"])
                else:
                    skipped += 1
            grants.append((worker, got))
        changed = limits is not None and limits.stored_changed
        return (grants, skipped), skipped == 0 and not any(got for _, got in grants) and not changed

    @staticmethod
    def _grant(run: Rec, worker: str, index: int, now: int, until: int) -> bool:
        """Lease a leasable run; False when its starting deadline passed (it is skipped)."""
        deadline = run["starting_deadline_us"]  # the job's at claim time
        if run["attempt"] == 0 and deadline is not None and run["scheduled_us"] + deadline < now \
                and not run["trigger"]:
            run.update(state="skipped", reason="deadline", finished_us=now)
            return False
        cap = now + run["timeout_us"] if run["timeout_us"] else None
        run.update(state="running", attempt=run["attempt"] + 1, worker_id=worker, fence=index,
                   attempt_deadline_us=cap, lease_until_us=until if cap is None else min(until, cap))
        return True

    def _holds(self, run_id: str, worker: str, fence: int, now: int) -> str | None:
        """None when (worker, fence) holds the live lease of run_id, else the error code."""
        run = self.runs.get(run_id)
        if run is None:
            return "not_found"
        if run["state"] != "running" or run["fence"] != fence or run["worker_id"] != worker:
            return "stale_fence"
        return "stale_fence" if run["lease_until_us"] <= now else None

    def heartbeat(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        """Items [run_id, fence], or [run_id, fence, worker_id] in an entry coalesced across workers."""
        out = []
        for item in cmd["leases"]:
            run_id, fence = item[0], item[1]
            code = self._holds(run_id, item[2] if len(item) > 2 else cmd["worker_id"], fence, cmd["now"])
            if code:
                out.append((run_id, False, code, None))
                continue
            run = self.runs[run_id]
            cap = run["attempt_deadline_us"]  # timeout_s caps the attempt, heartbeats or not
            asked = cmd["lease_until"] if cap is None else min(cmd["lease_until"], cap)
            run["lease_until_us"] = max(asked, run["lease_until_us"])
            out.append((run_id, True, None, run["lease_until_us"]))
        return out, all(not ok for _, ok, _, _ in out)

    def ack(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        """Items [run_id, fence, result], or [run_id, fence, result, worker_id] when coalesced."""
        out = []
        for item in cmd["acks"]:
            run_id, fence, worker = item[0], item[1], item[3] if len(item) > 3 else cmd["worker_id"]
            run = self.runs.get(run_id)
            if run is not None and (run["state"], run["fence"], run["worker_id"]) == ("succeeded", fence, worker):
                out.append((run_id, True, None))  # repeated by the lease that acked it: ok, no change
                continue
            code = self._holds(run_id, worker, fence, cmd["now"])
            if code is None:
                self.runs[run_id].update(state="succeeded", finished_us=cmd["now"], lease_until_us=None)
            out.append((run_id, code is None, code))
        return out, all(not ok for _, ok, _ in out)

    def nack(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        run_id, by = cmd["run_id"], (cmd["worker_id"], cmd["fence"], cmd["error"])
        run = self.runs.get(run_id)
        if (run is not None and run["state"] in ("retry_wait", "dead_letter", "cancelled")
                and run["fence"] == cmd["fence"] and self.nacked_by.get(run_id) == by
                and run["reason"] not in ("run_cancelled", "overlap")):  # cancelled under its worker
            return (True, None, run["state"]), True  # repeated by the lease that nacked it: ok, no change
        code = self._holds(run_id, cmd["worker_id"], cmd["fence"], cmd["now"])
        if code:
            return (False, code, None), True
        self.ids = Ids(index)
        self._fail(run, cmd["now"], None)
        self.nacked_by[run_id] = by
        return (True, None, run["state"]), False

    def expire(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        now, expired, dead = cmd["now"], 0, 0
        self.ids = Ids(index)
        for run_id, fence in cmd["runs"]:
            run = self.runs.get(run_id)
            if run is None or run["state"] != "running" or run["fence"] != fence or run["lease_until_us"] > now:
                continue
            cap = run["attempt_deadline_us"]
            self._fail(run, now, "timeout" if cap is not None and now >= cap else "lease_expired")
            expired, dead = expired + 1, dead + (run["state"] == "dead_letter")
        return (expired, dead), expired == 0

    def _fail(self, run: Rec, now: int, reason: str | None) -> None:
        """A failed attempt: retry after the job's backoff, or dead-letter after the last attempt;
        for a job cancelled meanwhile, no retry: the run is cancelled."""
        if self.jobs[run["job_id"]]["state"] == "cancelled":
            run.update(state="cancelled", lease_until_us=None, finished_us=now, reason="job_cancelled")
        elif run["attempt"] < run["max_attempts"]:
            low, high = backoff_bounds_us(run["backoff"], run["attempt"])
            run.update(state="retry_wait", lease_until_us=None, reason=reason, available_us=None,
                       avail_check=("between", now + low, now + high))
        else:
            run.update(state="dead_letter", lease_until_us=None, finished_us=now, reason="max_attempts")
            if self.jobs[run["job_id"]].get("pause_on_failure"):
                self.pause(0, {"job_id": run["job_id"], "now": now}, {"run_id": run["run_id"], "at_us": now},
                           self.ids)

    def cancel_run(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        """One run cancelled: a queued, waiting or running one (its lease revoked); a repeat is ok."""
        run = self.runs.get(cmd["run_id"])
        if run is None:
            return (False, "not_found"), True
        if run["state"] == "cancelled" and run["reason"] == "run_cancelled":
            return (True, None), True
        if run["state"] not in PENDING and run["state"] != "running":
            return (False, "conflict"), True
        run.update(state="cancelled", lease_until_us=None, finished_us=cmd["now"], reason="run_cancelled")
        run.pop("buffered", None)
        return (True, None), False

    def redrive(self, index: int, cmd: Rec) -> tuple[Any, bool]:
        run = self.runs.get(cmd["run_id"])
        if run is None:
            return (False, "not_found"), True
        if run["state"] != "dead_letter":
            return (False, "conflict"), True
        if self.entry_version >= 8 and self.jobs[run["job_id"]]["state"] == "cancelled":
            return (False, "conflict"), True
        self._reopen_dead_head(run)
        rounds = self.jobs[run["job_id"]]["max_attempts"]
        run.update(state="queued", available_us=cmd["now"], max_attempts=run["attempt"] + rounds,
                   finished_us=None, reason=None)
        return (True, None), False

    # -- values the docs only bound ------------------------------------------------------

    def settle(self, real_runs: dict[str, Rec]) -> None:
        """Check each run's real available_us against its bound, then adopt it."""
        for run_id, run in self.runs.items():
            check = run.pop("avail_check", None)
            if check is None:
                continue
            real = real_runs[run_id]["available_us"]
            if check[0] == "between":
                assert check[1] <= real <= check[2], f"{run_id}: available_us {real} outside {check[1:]}"
            else:  # ("catchup", job_id, now, k): now + per-job offset + k * spacing
                _, job_id, now, k = check
                offset = real - now - k * CATCHUP_SPACING_US
                assert 0 <= offset < CATCHUP_SPREAD_US, f"{run_id}: catch-up release offset {offset}"
                learned = self.catchup_offset_us.setdefault(job_id, offset)
                assert offset == learned, f"{run_id}: catch-up offset {offset}, earlier {learned} (not deterministic)"
            run["available_us"] = real


TOKEN = 1_000_000


class _EntryLimits:
    """The queue limits one LEASE_READY entry grants by: the group's, or the entry's when newer;
    a bucket refilled by the entry's clock, holding a second's worth and at least one start."""

    def __init__(self, model: Model, carried: Rec, now: int) -> None:
        self.model, self.carried, self.now = model, carried, now
        self.stored_changed = False

    @staticmethod
    def _refilled(limit: list[Any], now: int) -> list[Any]:
        revision, max_running, rate, tokens, at = limit
        if rate is not None and now > at:
            tokens, at = min(max(TOKEN, rate), tokens + (now - at) * rate // 1_000_000), now
        return [revision, max_running, rate, tokens, at]

    def load(self, queue: str) -> None:
        stored, entry = self.model.queue_limits.get(queue), self.carried.get(queue)
        if entry is not None and (stored is None or entry[0] > stored[0]):
            revision, max_running, rate = entry
            if stored is not None and stored[2] is not None and rate is not None:
                old = self._refilled(stored, self.now)
                tokens, at = min(old[3], max(TOKEN, rate)), max(old[4], self.now)
            else:
                tokens, at = (0 if rate is None else max(TOKEN, rate)), self.now
            self.model.queue_limits[queue] = [revision, max_running, rate, tokens, at]
            self.stored_changed = True

    def room(self, queue: str) -> bool:
        limit = self.model.queue_limits.get(queue)
        if limit is None:
            return True
        _, max_running, rate, tokens, _ = self._refilled(limit, self.now)
        running = sum(r["state"] == "running" and r["queue"] == queue for r in self.model.runs.values())
        return (rate is None or tokens >= TOKEN) and (max_running is None or running < max_running)

    def spend(self, queue: str) -> None:
        limit = self.model.queue_limits.get(queue)
        if limit is not None and limit[2] is not None:
            refilled = self._refilled(limit, self.now)
            refilled[3] -= TOKEN
            self.model.queue_limits[queue] = refilled
