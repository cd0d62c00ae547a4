"""Safety checkers over the history, the worker files and the final reads. Any
violation fails the run (exit 1). Every checker reads recorded facts only.

Vocabulary. An *occurrence* is (job_id, scheduled_time). A *dispatch* is a
`begin` line in a worker file: a delivery that reached a handler (fence,
attempt, run_id, start). An *execution* is an `exec` line: the handler ran to
the end (outcome ok, or nack when the seeded handler failed on purpose).

- lost: an occurrence that must run never has an ok execution. Must run:
  every one-off job whose create was acknowledged, or whose outcome was
  unknown (or a definite failure) but the job shows up in the final reads,
  unless a cancel was ever sent for it; and every run record of a recurring job
  in the final reads that is not `skipped`/`cancelled`. An acknowledged job
  missing from the final reads is lost too.
- unexpected: a dispatch of a job no node knows, of a one-off at another time
  than its `at`, of a recurring job off its grid (created_at + k * every), or of
  an occurrence without a run record, or with another run_id than the record's.
- double-claim: on any node, two run records with the same occurrence; or
  dispatches of one occurrence carrying two different run_ids.
- duplicate dispatch: two dispatches with the same (run_id, fence) — one lease
  delivered twice — always; a dispatch with a higher fence after the SDK saw
  the lower fence acked (a run re-leased after its ack) — always; otherwise a
  dispatch with a higher fence than the previous one of that run (a
  *redelivery*) is *explained* by the first that applies, in this order,
  within [the earlier lease's grant (its lease_until - lease), the later of
  the two dispatch starts] (a delivery can reach a cut-off worker late):
    nack            the previous execution nacked (seeded handler failure);
    worker_killed   the previous dispatch's worker incarnation was kill -9'd;
    worker_isolated a worker fault window on its slot overlaps that interval;
    node_fault      a kill/pause/partition/clock/disk/membership window, extended by one lease
                    + 2 s, overlaps it;
    lease_lost      the previous worker itself logged heartbeat failures or
                    rejections, a lost lease or an abandoned/rejected ack in it
                    (e.g. a starved box: the lease ran out between heartbeats;
                    counted separately in the figures).
  A redelivery with none of these is a duplicate dispatch.
- ran after cancel: for an acknowledged cancel, `applied_hi` is the answering
  node's last_applied in the job's group read right after the ack (>= the
  cancel's Raft index: the node applied it before answering; discarded if the
  node restarted in between, none when it holds no replica of that group and
  forwarded the cancel; each group has its own indexes). A fence is the Raft index of the entry that granted the lease, so
  a dispatch of that job with fence > applied_hi was leased after the cancel
  committed. With attempt == 1 the run had never been leased before: that is a
  violation ("no new run after the response"). With attempt > 1 it is a
  redelivery of a run that was already running, which the API allows to finish
  ("a running run may finish") — counted, not failed.
- early: a dispatch starting before its scheduled time by more than the
  clock-skew allowance: the largest forward offset the clock nemesis gave any
  node in the 15 s before the dispatch, plus 2 ms of rounding. Lease entries
  carry the voters' median clock (schedulerd/lease_time.py), so one skewed node
  should lease nothing early; the allowance stays for what the median cannot
  cover (docs/guarantees.md), and the report counts what it excused (expected 0).
- idempotency: every idempotency key maps to at most one job on every node;
  an acknowledged key to exactly one, the one the acks named.
- failed-but-applied: a create that got only definite failures (503
  `unavailable`, 4xx, refused connection) yet the job exists; or a retry
  answered 200 "existing" when every earlier attempt was a definite failure.
- convergence: after quiesce every node reports the same last_applied, commit
  index and digest, and the final reads of all nodes are identical.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from facts import Facts, Occ
from wire import parse_us

EARLY_EPSILON_S = 0.002
SKEW_LOOKBACK_S = 15.0
EVERY_US = {"1s": 1_000_000}  # the intervals the workload uses


def _v(checker: str, **evidence: Any) -> dict[str, Any]:
    return {"checker": checker, **evidence}


def expected_occurrences(f: Facts) -> dict[Occ, dict[str, Any]]:
    """Occurrence -> why it must run (see 'lost' above)."""
    out: dict[Occ, dict[str, Any]] = {}
    for c in f.creates:
        if c["kind"] != "once":
            continue
        job_ids = f.jobs_by_key.get(c["key"], set())
        job_id = c["job_id"] or (min(job_ids) if job_ids else None)
        if c["result"] != "ok" and job_id is None:
            continue  # never acknowledged, never seen: nothing was promised
        if job_id in f.cancel_tried:
            continue
        out[(job_id, parse_us(c["schedule"]["at"]))] = {"key": c["key"], "create": c["result"], "job_id": job_id}
    for job_id, runs in f.runs.items():
        job = f.jobs.get(job_id, {})
        if "every" not in (job.get("schedule") or {}):
            continue
        for r in runs:
            if r["state"] not in ("skipped", "cancelled"):
                out[(job_id, parse_us(r["scheduled_time"]))] = {"recurring": True, "run_state": r["state"]}
    return out


def check_lost(f: Facts) -> list[dict[str, Any]]:
    out = []
    for occ, why in expected_occurrences(f).items():
        if f.ok_execs(occ):
            continue
        out.append(_v("lost", job_id=occ[0], scheduled_us=occ[1], why=why, job_known=occ[0] in f.jobs,
                      runs=f.run_for(occ), dispatches=f.begins.get(occ, []), executions=f.execs.get(occ, [])))
    return out


def _on_grid(job: dict[str, Any], sched_us: int) -> bool:
    every_us = EVERY_US.get(job["schedule"]["every"])
    if every_us is None:  # the workload makes only these: anything else is not ours
        return False
    created = parse_us(job["created_at"])
    return sched_us > created and (sched_us - created) % every_us == 0


def check_unexpected_and_double(f: Facts) -> list[dict[str, Any]]:
    out = []
    for occ, begins in f.begins.items():
        job = f.jobs.get(occ[0])
        if job is None:
            out.append(_v("unexpected", why="job unknown to the reference node", job_id=occ[0],
                          known_elsewhere=occ[0] in f.all_job_ids, dispatch=begins[0]))
            continue
        schedule = job["schedule"]
        if "at" in schedule and parse_us(schedule["at"]) != occ[1]:
            out.append(_v("unexpected", why="one-off dispatched at another time than its at",
                          job_id=occ[0], at=schedule["at"], dispatch=begins[0]))
        if "every" in schedule and not _on_grid(job, occ[1]):
            out.append(_v("unexpected", why="recurring occurrence off its grid", job_id=occ[0],
                          created_at=job["created_at"], dispatch=begins[0]))
        runs = f.run_for(occ)
        run_ids = {b["run_id"] for b in begins}
        if not runs:
            out.append(_v("unexpected", why="no run record for a dispatched occurrence", job_id=occ[0],
                          dispatch=begins[0]))
        elif len(run_ids) > 1:
            out.append(_v("double-claim", why="dispatches of one occurrence with different run_ids",
                          job_id=occ[0], run_ids=sorted(run_ids), runs=runs))
        elif runs[0]["run_id"] not in run_ids:
            out.append(_v("unexpected", why="dispatched run_id differs from the run record", job_id=occ[0],
                          run=runs[0], dispatch=begins[0]))
    for read in f.reads:
        for job_id, runs in read["runs"].items():
            counts = Counter(parse_us(r["scheduled_time"]) for r in runs)
            for sched, n in counts.items():
                if n > 1:
                    out.append(_v("double-claim", why="two run records for one occurrence", node=read["node"],
                                  job_id=job_id, scheduled_us=sched,
                                  runs=[r for r in runs if parse_us(r["scheduled_time"]) == sched]))
    return out


def _granted(f: Facts, dispatch: dict[str, Any]) -> float:
    """When the lease was granted: its first lease_until minus the lease length
    (by the granting node's clock; clock faults are node faults anyway)."""
    return parse_us(dispatch["lease_until"]) / 1e6 - f.lease_s


def _explain(f: Facts, prev: dict[str, Any], cur: dict[str, Any]) -> str | None:
    # From the earlier lease's grant to the redelivery. Not simply prev.start..cur.start:
    # a delivery can reach its worker late (a poll answer held up by a cut-off network
    # arrives after TCP retransmits), even after the redelivery started.
    t0 = min(prev["start"], _granted(f, prev), cur["start"])
    t1 = max(cur["start"], prev["start"])
    prev_exec = [e for e in f.execs.get((prev["job_id"], parse_us(prev["scheduled_time"])), [])
                 if e["fence"] == prev["fence"] and e["worker"] == prev["worker"]]
    if any(e["outcome"] == "nack" for e in prev_exec):
        return "nack"
    if f.worker_killed_after(prev["worker"], t0):
        return "worker_killed"
    if any(s <= t1 and e >= t0 for s, e, _ in f.worker_windows(prev["slot"])):
        return "worker_isolated"
    if any(s <= t1 and e >= t0 for s, e, _ in f.node_fault_windows()):
        return "node_fault"
    if f.sdk_trouble(prev["worker"], t0, t1):
        return "lease_lost"
    return None


def check_dispatches(f: Facts) -> tuple[list[dict[str, Any]], Counter]:
    """Duplicate dispatches (violations) and the explained redeliveries by reason."""
    out: list[dict[str, Any]] = []
    reasons: Counter = Counter()
    for occ, begins in f.begins.items():
        by_fence: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
        for b in begins:
            by_fence[(b["run_id"], b["fence"])].append(b)
        for (run_id, fence), same in by_fence.items():
            if len(same) > 1:
                out.append(_v("duplicate-dispatch", why="one lease (run, fence) dispatched twice",
                              run_id=run_id, fence=fence, dispatches=same))
        firsts = sorted((bs[0] for bs in by_fence.values()), key=lambda b: (b["fence"], b["start"]))
        for prev, cur in zip(firsts, firsts[1:]):
            if (prev["run_id"], prev["fence"]) in f.acked:
                out.append(_v("duplicate-dispatch", why="re-leased after the SDK saw the earlier lease acked",
                              job_id=occ[0], previous=prev, redelivery=cur, runs=f.run_for(occ)))
                continue
            reason = _explain(f, prev, cur)
            if reason is None:
                out.append(_v("duplicate-dispatch", why="redelivery that no fault, nack or lease loss explains",
                              job_id=occ[0], previous=prev, redelivery=cur, runs=f.run_for(occ),
                              previous_executions=f.execs.get(occ, [])))
            else:
                reasons[reason] += 1
    return out, reasons


def check_cancels(f: Facts) -> tuple[list[dict[str, Any]], dict[str, int]]:
    out: list[dict[str, Any]] = []
    stats = {"cancels_acked": 0, "cancels_without_bound": 0, "redelivered_after_cancel": 0,
             "dispatched_after_cancel_ack": 0}
    for job_id, results in f.cancels.items():
        acked = [c for c in results if c["result"] == "ok"]
        if not acked:
            continue
        first = min(acked, key=lambda c: c["ack"])
        stats["cancels_acked"] += 1
        bounds = [c["applied_hi"] for c in acked if c["applied_hi"] is not None]
        if not bounds:
            stats["cancels_without_bound"] += 1
        hi = min(bounds) if bounds else None
        for occ, begins in f.begins.items():
            if occ[0] != job_id:
                continue
            for b in begins:
                if b["start"] > first["ack"]:
                    stats["dispatched_after_cancel_ack"] += 1
                if hi is None or b["fence"] <= hi:
                    continue
                if b["attempt"] == 1:
                    out.append(_v("ran-after-cancel", why="first lease of a run granted after the cancel "
                                  "committed", job_id=job_id, cancel=first, applied_hi=hi, dispatch=b,
                                  runs=f.run_for(occ)))
                else:
                    stats["redelivered_after_cancel"] += 1
    return out, stats


def check_early(f: Facts) -> tuple[list[dict[str, Any]], int]:
    """Violations, and how many early dispatches the skew allowance excused."""
    out = []
    excused = 0
    for occ, begins in f.begins.items():
        for b in begins:
            early_s = occ[1] / 1e6 - b["start"]
            if early_s <= EARLY_EPSILON_S:
                continue
            allowance = f.max_skew_ahead(b["start"] - SKEW_LOOKBACK_S, b["start"])
            if early_s > allowance + EARLY_EPSILON_S:
                out.append(_v("early", job_id=occ[0], early_s=round(early_s, 6), skew_allowance_s=allowance,
                              dispatch=b))
            else:
                excused += 1
    return out, excused


def check_idempotency(f: Facts) -> list[dict[str, Any]]:
    out = []
    for key, attempts in f.create_attempts.items():
        ok_ids = {a["job_id"] for a in attempts if a["outcome"] == "ok"}
        seen = f.jobs_by_key.get(key, set())
        if len(seen) > 1 or len(ok_ids) > 1 or (ok_ids and seen != ok_ids):
            out.append(_v("idempotency", key=key, jobs_in_reads=sorted(seen), jobs_acked=sorted(ok_ids)))
    for c in f.creates:
        definite = c["result"] == "failed" and c["key"] in f.jobs_by_key
        replay = c["result"] == "ok" and c["ok_status"] == 200 and c["prior_outcomes"] \
            and all(o == "fail" for o in c["prior_outcomes"])
        if definite or replay:
            out.append(_v("failed-but-applied", key=c["key"], create=c, attempts=f.create_attempts.get(c["key"])))
    return out


def check_convergence(f: Facts) -> list[dict[str, Any]]:
    out = []
    if not f.convergence.get("converged"):
        out.append(_v("convergence", why="nodes did not agree on last_applied/commit/digest",
                      nodes=f.convergence.get("nodes")))
    canon = [(sorted(r["jobs"], key=lambda j: j["job_id"]), r["runs"]) for r in f.reads]
    ref = f.reference_node() if f.reads else 0
    for i, c in enumerate(canon):
        if i != ref and c != canon[ref]:
            here, there = {j["job_id"] for j in c[0]}, {j["job_id"] for j in canon[ref][0]}
            changed = sorted(j for j in here & there if c[1].get(j) != canon[ref][1].get(j))
            out.append(_v("convergence", why=f"final reads of node {i} differ from node {ref}'s",
                          jobs_only_here=_few(here - there), jobs_missing_here=_few(there - here),
                          jobs_with_other_runs=_few(changed), cluster=f.reads[i]["cluster"]))
    return out


def _few(items: set[str] | list[str], shown: int = 10) -> dict[str, Any]:
    """A count and a sample: a diverged node can differ in thousands of jobs."""
    ordered = sorted(items)
    return {"count": len(ordered), "sample": ordered[:shown]}


def run_all(f: Facts) -> dict[str, Any]:
    violations: list[dict[str, Any]] = []
    violations += check_lost(f)
    violations += check_unexpected_and_double(f)
    dispatches, reasons = check_dispatches(f)
    violations += dispatches
    cancels, cancel_stats = check_cancels(f)
    violations += cancels
    early, early_excused = check_early(f)
    violations += early
    violations += check_idempotency(f)
    violations += check_convergence(f)
    return {"violations": violations, "redelivery_reasons": dict(reasons), "cancel_stats": cancel_stats,
            "early_within_skew_allowance": early_excused, "by_checker": dict(Counter(v["checker"] for v in violations))}
