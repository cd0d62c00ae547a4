"""The properties every simulation run is held to, over what the callers and workers saw,
what the replicas applied while the run went on, and the stores at its end.

The same properties as the fault harness (jepsen-style/checker.py), judged with what a
simulator knows for sure (every dispatch, every answer, every replica's store):

- lost: an occurrence of a job whose create was acknowledged (or whose job exists at
  the end) that never ran to an acknowledged finish and has no final record (succeeded,
  dead letter, skipped with a reason, cancelled) in any store or archive, unless a
  cancel of the job was sent;
- failed-but-applied: a create answered with a definite failure whose job exists;
- double claim: two runs of one occurrence in a store, or dispatches of one occurrence
  under two run ids;
- duplicate dispatch: one (run, fence) delivered twice, or a run leased again after an
  ack of it was accepted (a redelivery after a nack, a crash, a hang or an expired
  lease is what at-least-once allows);
- ran after cancel: a first attempt leased after an acknowledged cancel committed;
- early: a dispatch before its occurrence's time by more than the clock skew the run
  gave a node (plus rounding);
- missed: an occurrence of a repeating job that came due before the end and has no
  record at all (ran, skipped with a reason, or cancelled);
- Raft: an index applied with two different entries (committed entries changed), two
  leaders of one group in one term, replicas of a group that do not converge to one
  digest, a tick or a message handler that raised."""
from __future__ import annotations

import glob
import os
from collections import defaultdict
from typing import Any

from schedulerd import archive
from schedulerd.storage.layouts import JOBS, RUNS
from schedulerd.timefmt import from_iso

from tests.sim.workload import History

EARLY_SLACK_US = 2_000
FINAL_RUN_STATES = frozenset({"succeeded", "dead_letter", "skipped", "cancelled"})


def stored(stores: list[Any]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], list[str]]:
    """Jobs and runs from every replica's store (the first copy of each), and the double claims."""
    jobs: dict[str, dict[str, Any]] = {}
    runs: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for label, store in stores:
        occurrences: dict[tuple[str, int], str] = {}
        with store.read() as txn:
            for _, raw in txn.cursor(db=store.tables.jobs):
                job = JOBS.unpack(raw)
                jobs.setdefault(job["job_id"], job)
            for _, raw in txn.cursor(db=store.tables.runs):
                run = RUNS.unpack(raw)
                runs.setdefault(run["run_id"], run)
                occurrence = (run["job_id"], run["scheduled_us"])
                other = occurrences.setdefault(occurrence, run["run_id"])
                if other != run["run_id"]:
                    problems.append(f"double claim in {label}: occurrence {occurrence} has runs {other} and {run['run_id']}")
    return jobs, runs, problems


def archived(roots: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    jobs: dict[str, dict[str, Any]] = {}
    runs: dict[str, dict[str, Any]] = {}
    for root in roots:
        for path in sorted(glob.glob(os.path.join(root, "**", "*.gz"), recursive=True)):
            for rec in archive.read(path):
                if rec["kind"] == "run":
                    runs.setdefault(rec["run_id"], {"run_id": rec["run_id"], "job_id": rec["job_id"],
                                                    "scheduled_us": from_iso(rec["scheduled_time"]),
                                                    "state": rec["state"]})
                else:
                    jobs.setdefault(rec["job_id"], rec)
    return jobs, runs


def check(history: History, stores: list[Any], archive_roots: list[str], end_us: int,
          skew_allowance_us: Any, raft_problems: list[str]) -> tuple[list[str], dict[str, Any]]:
    problems = list(raft_problems)
    jobs, runs, doubles = stored(stores)
    problems += doubles
    old_jobs, old_runs = archived(archive_roots)
    all_runs = {**old_runs, **runs}
    known_jobs = set(jobs) | set(old_jobs) | {r["job_id"] for r in all_runs.values()}

    dispatches = history.dispatches
    ok_acks = {(a["run_id"], a["fence"]) for a in history.acks if a["outcome"] == "ok"}
    cancelled = {c["job_id"] for c in history.cancels}
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_occurrence: dict[tuple[str, int], set[str]] = defaultdict(set)
    for d in dispatches:
        by_run[d["run_id"]].append(d)
        by_occurrence[(d["job_id"], d["scheduled_us"])].add(d["run_id"])

    for occurrence, run_ids in by_occurrence.items():
        if len(run_ids) > 1:
            problems.append(f"double claim: occurrence {occurrence} dispatched as runs {sorted(run_ids)}")
    redeliveries = 0
    for run_id, ds in by_run.items():
        fences = [d["fence"] for d in ds]
        if len(set(fences)) != len(fences):
            problems.append(f"duplicate dispatch: run {run_id} fence delivered twice: {fences}")
        acked = [f for f in fences if (run_id, f) in ok_acks]
        if acked and max(fences) > min(acked):
            problems.append(f"duplicate dispatch: run {run_id} leased again (fences {fences}) after its ack "
                            f"at fence {min(acked)} was accepted")
        redeliveries += len(ds) - 1

    for c in history.cancels:
        if c["outcome"] != "ok":
            continue
        late = next((d for d in dispatches if d["job_id"] == c["job_id"] and d["attempt"] == 1
                     and d["fence"] > c["applied_hi"] and d["at"] > c["sent_at"]), None)
        if late is not None:
            problems.append(f"ran after cancel: job {c['job_id']} first leased at fence {late['fence']} after "
                            f"its cancel was acknowledged at index <= {c['applied_hi']}")

    for d in dispatches:
        allowed = skew_allowance_us(d["at"])
        if d["wall_us"] < d["scheduled_us"] - allowed - EARLY_SLACK_US:
            problems.append(f"early: run {d['run_id']} dispatched {(d['scheduled_us'] - d['wall_us']) / 1000:.0f} ms "
                            f"before its time (skew allowance {allowed / 1000:.0f} ms)")

    finished = {r["run_id"] for r in all_runs.values() if r["state"] in FINAL_RUN_STATES}
    ran = {run_id for run_id, f in ok_acks}
    accounted_occurrences: dict[tuple[str, int], str] = {}
    for r in all_runs.values():
        if r["run_id"] in finished or r["run_id"] in ran:
            accounted_occurrences[(r["job_id"], r["scheduled_us"])] = r["state"]
    for d in dispatches:
        if d["run_id"] in ran:
            accounted_occurrences.setdefault((d["job_id"], d["scheduled_us"]), "succeeded")

    created = 0
    for c in history.creates:
        answers = c["answers"]
        job_id = next((a[1] for a in answers if a[0] == "ok"), c["raw"].get("job_id"))
        exists = job_id is not None and job_id in known_jobs
        if answers and all(a[0] == "failed" for a in answers) and exists:
            problems.append(f"failed but applied: create of {job_id} was refused ({answers}) yet the job exists")
        must_run = any(a[0] == "ok" for a in answers) or exists
        if not must_run or job_id in cancelled:
            continue
        created += 1
        schedule = c["raw"]["schedule"]
        if "at" in schedule:
            at_us = from_iso(schedule["at"])
            if at_us > end_us:
                continue
            if (job_id, at_us) not in accounted_occurrences:
                state = _run_state(all_runs, job_id, at_us)
                problems.append(f"lost: job {job_id} (create answered {[a[0] for a in answers]}) occurrence at "
                                f"{at_us} never finished (its run: {state})")
        else:
            job = jobs.get(job_id) or old_jobs.get(job_id)
            if job is None:
                problems.append(f"lost: repeating job {job_id} (create answered {[a[0] for a in answers]}) is in no store")
                continue
            every, anchor = job["schedule"]["every_us"], job["schedule"]["anchor_us"]
            fire = anchor + every
            while fire <= end_us:
                if (job_id, fire) not in accounted_occurrences:
                    state = _run_state(all_runs, job_id, fire)
                    problems.append(f"missed: repeating job {job_id} occurrence at {fire} has no final record "
                                    f"(its run: {state})")
                fire += every
    figures = {"creates": len(history.creates), "jobs_checked": created, "dispatches": len(dispatches),
               "redeliveries": redeliveries, "acks_ok": len(ok_acks), "nacks": len(history.nacks),
               "cancels": len(history.cancels),
               "runs_stored": len(runs), "runs_archived": len(old_runs)}
    return problems, figures


def _run_state(runs: dict[str, dict[str, Any]], job_id: str, scheduled_us: int) -> str:
    found = [r for r in runs.values() if r["job_id"] == job_id and r["scheduled_us"] == scheduled_us]
    return ", ".join(f"{r['run_id']} {r['state']}" for r in found) or "none"

