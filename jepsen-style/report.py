"""The figures of a run, from the indexed facts and the checkers' results:
printed at the end and written to figures.json."""
from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

from checker import expected_occurrences
from facts import Facts
from monitor import lag_figures
from wire import parse_us


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)], 3)


def _dist(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": _pct(values, 50), "p95": _pct(values, 95), "p99": _pct(values, 99),
            "max": round(max(values), 3) if values else None}


def _creates(f: Facts) -> dict[str, int]:
    once = [c for c in f.creates if c["kind"] == "once"]
    by = Counter(c["result"] for c in once)
    unknown = [c for c in once if c["result"] == "unknown"]
    seen = [c for c in unknown if c["key"] in f.jobs_by_key]
    ran = [c for c in seen if any(occ[0] in f.jobs_by_key[c["key"]] for occ in f.execs)]
    return {"attempted": len(once), "ok": by["ok"], "failed": by["failed"], "unknown": by["unknown"],
            "unknown_later_seen": len(seen), "unknown_later_ran": len(ran),
            "recurring_jobs": sum(1 for c in f.creates if c["kind"] == "recurring" and c["result"] == "ok"),
            "cancels_sent": len(f.cancel_tried)}


def _lateness(f: Facts) -> dict[str, Any]:
    """First dispatch start - scheduled time, for every expected occurrence that ran.
    Faulted: a fault window (extended by a lease + 2 s) overlaps [scheduled, first start]."""
    windows = f.all_fault_windows()
    calm: list[float] = []
    faulted: list[float] = []
    for occ in expected_occurrences(f):
        begins = f.begins.get(occ)
        if not begins or not f.ok_execs(occ):
            continue
        sched, first = occ[1] / 1e6, min(b["start"] for b in begins)
        bucket = faulted if any(s <= first and e >= sched for s, e, _ in windows) else calm
        bucket.append(first - sched)
    return {"calm": _dist(calm), "faulted": _dist(faulted)}


def _leader_losses(f: Facts) -> list[dict[str, Any]]:
    """Per leader-losing fault: seconds from its start to the first create attempt
    *sent after it started* that was acknowledged, and to the first dispatch whose
    fence (a Raft index) is above every fence dispatched before the fault."""
    attempts = [a for atts in f.create_attempts.values() for a in atts if a["outcome"] == "ok"]
    begins = [b for bs in f.begins.values() for b in bs]
    out = []
    for fault in (x for x in f.faults if x["leader_loss"]):
        start = fault.get("injected", fault["start"])
        acks = [a["done"] - start for a in attempts if a["sent"] >= start]
        floor = max((b["fence"] for b in begins if b["start"] < start), default=0)
        dispatches = [b["start"] - start for b in begins if b["start"] >= start and b["fence"] > floor]
        out.append({"n": fault["n"], "fault": f"{fault['kind']}/{fault['variant']}", "hold_s":
                    round(fault["end"] - start, 2), "first_ack_s": round(min(acks), 3) if acks else None,
                    "first_dispatch_s": round(min(dispatches), 3) if dispatches else None})
    return out


def _longest_gap(times: list[float], t0: float, t1: float) -> dict[str, Any]:
    points = sorted([t0, *(t for t in times if t0 <= t <= t1), t1])
    gaps = [(b - a, a) for a, b in zip(points, points[1:])]
    gap, at = max(gaps) if gaps else (0.0, t0)
    return {"longest_s": round(gap, 3), "from_t": round(at, 3)}


def figures(f: Facts, results: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    expected = expected_occurrences(f)
    executed = sum(1 for occ in expected if f.ok_execs(occ))
    by_checker = results["by_checker"]
    reasons = results["redelivery_reasons"]
    t0, t1 = meta["workload_start"], meta["workload_end"]
    ack_times = [a["done"] for atts in f.create_attempts.values() for a in atts if a["outcome"] == "ok"]
    dispatch_times = [b["start"] for bs in f.begins.values() for b in bs]
    verdict = "PASS" if not results["violations"] else "FAIL"
    return {
        "seed": meta["seed"], "duration_s": meta["duration_s"], "faults_enabled": meta["faults"],
        "faults_by_kind": dict(Counter(x["kind"] for x in f.faults)),
        "faults_by_variant": dict(Counter(f"{x['kind']}/{x['variant']}" for x in f.faults)),
        "faults_skipped": sum(1 for e in f.history if e["type"] == "nemesis_skipped"),
        "creates": _creates(f),
        "occurrences": {"expected": len(expected), "executed": executed, "lost": by_checker.get("lost", 0),
                        "dispatches": len(dispatch_times),
                        # handlers started after their own lease had run out (a delivery that
                        # reached its worker late): legal at-least-once, an avoidable duplicate
                        "dispatches_after_lease_expired": sum(
                            1 for bs in f.begins.values() for b in bs if b["start"] > parse_us(b["lease_until"]) / 1e6),
                        "executions": sum(len(v) for v in f.execs.values())},
        "redeliveries": {"justified": sum(reasons.values()), "by_reason": reasons,
                         "duplicate_dispatches": by_checker.get("duplicate-dispatch", 0),
                         "double_claims": by_checker.get("double-claim", 0)},
        "ran_after_cancel": by_checker.get("ran-after-cancel", 0), "cancel_stats": results["cancel_stats"],
        "early": by_checker.get("early", 0),
        "early_within_skew_allowance": results["early_within_skew_allowance"],
        "unexpected": by_checker.get("unexpected", 0),
        "idempotency": by_checker.get("idempotency", 0) + by_checker.get("failed-but-applied", 0),
        "lateness_s": _lateness(f), "leader_losses": _leader_losses(f),
        "gaps": {"acks": _longest_gap(ack_times, t0, t1), "dispatches": _longest_gap(dispatch_times, t0, t1)},
        "convergence": {k: v for k, v in f.convergence.items() if k != "nodes"},
        "replica_lag": lag_figures(f.history),
        "node_exits_unplanned": [e for e in f.history if e["type"] == "node" and e["event"] == "died"],
        "settle": meta.get("settle"), "torn_worker_lines": sum(1 for r in f.worker_records if r.get("ev") == "torn"),
        "violations_by_checker": by_checker, "verdict": verdict,
    }


def write(path: str, figs: dict[str, Any], violations: list[dict[str, Any]]) -> None:
    with open(path, "w") as fh:
        json.dump(figs, fh, indent=2, sort_keys=True)
    with open(path.replace("figures.json", "violations.json"), "w") as fh:
        json.dump(violations, fh, indent=2, sort_keys=True, default=str)


def render(figs: dict[str, Any], violations: list[dict[str, Any]], shown_max: int = 5) -> str:
    c, o, r, lat = figs["creates"], figs["occurrences"], figs["redeliveries"], figs["lateness_s"]
    lines = [
        f"seed {figs['seed']}  duration {figs['duration_s']}s  faults {figs['faults_by_kind']}"
        f" (skipped {figs['faults_skipped']})",
        f"  variants: {figs['faults_by_variant']}",
        f"creates: attempted {c['attempted']} ok {c['ok']} failed {c['failed']} unknown {c['unknown']}"
        f" (later seen {c['unknown_later_seen']}, later ran {c['unknown_later_ran']});"
        f" recurring {c['recurring_jobs']}; cancels sent {c['cancels_sent']}",
        f"occurrences: expected {o['expected']} executed {o['executed']} lost {o['lost']}"
        f"  (dispatches {o['dispatches']}, executions {o['executions']},"
        f" started after their lease expired {o['dispatches_after_lease_expired']})",
        f"redeliveries justified {r['justified']} {r['by_reason']}; duplicate dispatches"
        f" {r['duplicate_dispatches']}; double-claims {r['double_claims']}",
        f"ran-after-cancel {figs['ran_after_cancel']} {figs['cancel_stats']}; early {figs['early']}"
        f" (within skew allowance {figs['early_within_skew_allowance']});"
        f" unexpected {figs['unexpected']}; idempotency {figs['idempotency']}",
        f"lateness calm {lat['calm']}",
        f"lateness faulted {lat['faulted']}",
        "leader losses: " + "; ".join(f"#{x['n']} {x['fault']} ack {x['first_ack_s']}s dispatch"
                                      f" {x['first_dispatch_s']}s" for x in figs["leader_losses"]),
        f"longest gap: acks {figs['gaps']['acks']['longest_s']}s dispatches"
        f" {figs['gaps']['dispatches']['longest_s']}s",
        f"replica lag (commit entries behind the most advanced node, sampled 1/s): {figs['replica_lag']}",
        f"convergence {figs['convergence']}  settle {figs['settle']}"
        f"  unplanned node exits {len(figs['node_exits_unplanned'])}",
        f"verdict: {figs['verdict']}" + (f"  {figs['violations_by_checker']}" if violations else ""),
    ]
    for v in violations[:shown_max]:
        lines.append("  VIOLATION " + json.dumps(v, default=str)[:1500])
    if len(violations) > shown_max:
        lines.append(f"  ... {len(violations) - shown_max} more in violations.json")
    return "\n".join(lines)
