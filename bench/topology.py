"""`python -m bench topology`: a cluster that grows under load. Three nodes with `--groups G`
run a steady stream of one-off jobs; `--join-after` seconds into it, `--join` more nodes
join. Measured: the time from the joins until groups and leaders per node are within one
of even with nothing under way, lateness while the replicas move, and that every job ran
once (schedulerd alone: the peers have no cluster to grow). `--cost`: the work per node
on 3 and on 6 nodes. `--heal`: a node of five holding `--live` jobs dies for good."""
from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable

from bench import sd_scenarios
from bench.common import BenchError, summarize, uptime_line
from bench.plan import OneOff
from bench.scenarios import SD, Options, Report, _cpu_rows, steady_once
from bench.sd import SdSystem, http_json
from bench.speed import PROBE

BALANCE_S_MAX = 600.0


def balance(system: SdSystem) -> dict[str, Any] | None:
    """Groups per node, leaders per node and the placement epoch once no change is under way,
    every group has its replicas and both counts are within one of even; None before."""
    leaders: dict[int, str] = {}
    view: dict[str, Any] | None = None
    for node in system.cluster.nodes:
        if node.proc is None:
            continue
        try:
            status, body = http_json("GET", node.url + "/v1/cluster", timeout_s=5)
        except OSError:  # a joining node not listening yet
            return None
        if status != 200 or body.get("cluster") is None:
            return None
        view = view or body
        for n in body["nodes"]:
            leaders.update(dict.fromkeys(n["leads"], n["node_id"]))
    if view is None or view["meta"]["changes"]:
        return None
    rf, groups = view["cluster"]["replication_factor"], view["cluster"]["groups"]
    serving = [n for n in view["nodes"] if n["state"] == "alive"]
    held = {n["node_id"]: len(n["groups"]) for n in serving}
    led = {n["node_id"]: sum(1 for leader in leaders.values() if leader == n["node_id"]) for n in serving}
    if sum(held.values()) != rf * groups or len(leaders) != groups:
        return None
    if max(held.values()) - min(held.values()) > 1 or max(led.values()) - min(led.values()) > 1:
        return None
    return {"groups_per_node": sorted(held.values()), "leaders_per_node": sorted(led.values()),
            "epoch": view["placement_epoch"], "moves": view.get("meta", {}).get("changes")}


class Grower(threading.Thread):
    """At `at` (epoch s), join `count` nodes; then wait until the placement is balanced."""

    def __init__(self, system: SdSystem, at: float, count: int) -> None:
        super().__init__(daemon=True)
        self.system, self.at, self.count = system, at, count
        self.joined_at = math.nan
        self.balanced_at = math.nan
        self.final: dict[str, Any] | None = None
        self.error: str | None = None

    def run(self) -> None:
        try:
            time.sleep(max(0.0, self.at - time.time()))
            self.joined_at = time.time()
            for _ in range(self.count):
                self.system.cluster.join_node()
            self.error = _poll_until(self._balanced, f"not balanced within {BALANCE_S_MAX:g} s of the joins")
        except Exception as exc:  # surfaced by grow()
            self.error = repr(exc)

    def _balanced(self) -> bool:
        # The new nodes must be in the registry before "balanced" means anything.
        found = balance(self.system)
        if found is not None and len(found["groups_per_node"]) == len(self.system.cluster.nodes):
            self.balanced_at, self.final = time.time(), found
            return True
        return False


def _poll_until(done: Callable[[], bool], failure: str) -> str | None:
    """Ask `done` every half second for up to BALANCE_S_MAX; `failure` if it never says so."""
    deadline = time.monotonic() + BALANCE_S_MAX
    while time.monotonic() < deadline:
        if done():
            return None
        time.sleep(0.5)
    return failure


def grow(opts: Options, rate: float, duration_s: float, groups: int, join: int, join_after_s: float,
         lead_s: float, drain_s: float) -> Report:
    report = Report(f"topology: {join} nodes join a 3-node cluster ({groups} groups, R = 3) "
                    f"{join_after_s:g} s into a {rate:g} jobs/s steady run", [SD])
    system = SdSystem(opts.run_dir, opts.workers, opts.worker_concurrency, opts.in_flight, groups=groups)
    report.raw["uptime"] = [f"before: {uptime_line()}"]
    try:
        system.setup()
        before = balance(system)
        plan = OneOff.steady("tg", lead_s + 2.0, rate, duration_s, lead_s, time.time())
        grower = Grower(system, plan.t0 + join_after_s, join)
        grower.start()
        records, info = system.oneoff(plan, drain_s)
        info["box_slowdown"] = PROBE.slowdown(plan.t0, plan.t0 + duration_s)
        grower.join(BALANCE_S_MAX)
    finally:
        system.teardown()
        report.raw["uptime"].append(f"after: {uptime_line()}")
    if grower.error:
        raise BenchError(f"growing the cluster failed: {grower.error}")
    j, b = grower.joined_at, grower.balanced_at
    moving = [r for r in records if j <= r.due < b]
    s_all = summarize(records, plan.count, plan.t0)
    s_moving = summarize(moving, len(moving), j)
    report.add("time from the joins until balanced (s)", {SD: b - j}, None)
    report.add("groups per node before / after", {SD: f"{(before or {}).get('groups_per_node')} / "
                                                     f"{grower.final and grower.final['groups_per_node']}"}, None)
    report.add("leaders per node after", {SD: str(grower.final and grower.final["leaders_per_node"])}, None)
    report.add("placement changes (epoch after)", {SD: grower.final and grower.final["epoch"]}, None)
    _outcome_rows(report, {"due while replicas moved": s_moving, "whole run": s_all}, info)
    report.notes.append(f"{join} nodes joined through node 0 ({len(moving)} jobs came due while replicas moved); "
                        "targets: p99 lateness while moving < 1 s, nothing missing, balanced within one.")
    report.raw.update(stats=s_all, moving=s_moving, info=info, before=before, after=grower.final)
    return report


def _outcome_rows(report: Report, windows: dict[str, dict[str, Any]], info: dict[str, Any]) -> None:
    """Lateness of each window (the last one the whole run), missing and doubled runs, CPU."""
    for label, s in windows.items():
        report.add(f"lateness p50, {label}", {SD: s["lateness_p50_s"]}, None, "ms")
        report.add(f"lateness p99, {label}", {SD: s["lateness_p99_s"]}, None, "ms")
        report.add(f"lateness max, {label}", {SD: s["lateness_max_s"]}, None, "ms")
    whole = list(windows.values())[-1]
    report.add("not run by the deadline", {SD: whole["missing"]}, None)
    report.add("run twice", {SD: whole["duplicates"]}, None)
    _cpu_rows(report, {SD: info})


def cost(opts: Options, rate: float, duration_s: float, groups: int, lead_s: float, drain_s: float) -> Report:
    """The same load on 3 nodes x G groups and on 6 nodes x 2G groups (R = 3 both): CPU
    seconds per 1,000 jobs on each node. Each node of six holds half the groups' replicas
    and leads a sixth of them, so its work should fall towards half (target <= 0.6x)."""
    shapes = {"3 nodes": (3, groups), "6 nodes": (6, 2 * groups)}
    report = Report(f"topology cost: {rate:g} jobs/s for {duration_s:g} s on 3 nodes x {groups} groups and "
                    f"on 6 nodes x {2 * groups} groups, R = 3", list(shapes))
    stats: dict[str, dict[str, Any]] = {}
    per_node: dict[str, list[float]] = {}
    for label, (nodes, g) in shapes.items():
        system = SdSystem(opts.run_dir + f"-{nodes}n", opts.workers, opts.worker_concurrency, opts.in_flight,
                          groups=g, nodes=nodes)
        try:
            system.setup()
            stats[label], info = steady_once(system, rate, duration_s, lead_s, drain_s, f"tc{nodes}")
        finally:
            system.teardown()
        done = max(1, stats[label]["ran"])
        per_node[label] = sorted(round(1000 * n["cpu_cores"] * info["wall_s"] / done, 3)
                                 for n in info["nodes"].values() if n.get("cpu_cores") is not None)
    report.add("CPU s per 1,000 jobs, each node", {k: str(v) for k, v in per_node.items()}, None)
    report.add("CPU s per 1,000 jobs, mean per node",
               {k: round(sum(v) / len(v), 3) if v else None for k, v in per_node.items()}, False)
    for key, label in (("lateness_p50_s", "lateness p50"), ("lateness_p99_s", "lateness p99")):
        report.add(label, {k: v[key] for k, v in stats.items()}, False, "ms")
    report.add("not run by the deadline", {k: v["missing"] for k, v in stats.items()}, None)
    report.add("run twice", {k: v["duplicates"] for k, v in stats.items()}, None)
    three, six = (sum(v) / len(v) if v else math.nan for v in per_node.values())
    report.notes.append(f"mean CPU per node on six nodes / on three: {six / three:.2f} (target <= 0.6)")
    report.raw.update(stats=stats, per_node=per_node)
    return report


def under_replicated(system: SdSystem, victim: str) -> dict[str, Any] | None:
    """The registry and placement as a live node has them: the victim's state, and the data
    groups whose members are not all alive (or that have a change under way)."""
    for node in system.cluster.nodes:
        if node.proc is None:
            continue
        try:
            status, body = http_json("GET", node.url + "/v1/cluster", timeout_s=5)
        except OSError:
            continue
        if status != 200 or body.get("cluster") is None:
            continue
        alive = {n["node_id"] for n in body["nodes"] if n["state"] == "alive"}
        state = next((n["state"] for n in body["nodes"] if n["node_id"] == victim), None)
        short = [g["group"] for g in body["data_groups"]
                 if g["change"] is not None or not set(g["members"]) <= alive
                 or len(g["members"]) < body["cluster"]["replication_factor"]]
        return {"victim_state": state, "short": short}
    return None


class Healer(threading.Thread):
    """At `at` (epoch s), kill -9 the last node for good; note when the cluster declares it
    dead and when every group is back at R alive members with nothing under way."""

    def __init__(self, system: SdSystem, at: float) -> None:
        super().__init__(daemon=True)
        self.system, self.at = system, at
        self.killed_at = self.dead_at = self.healed_at = math.nan
        self.error: str | None = None

    def run(self) -> None:
        try:
            node = self.system.cluster.nodes[-1]
            victim = http_json("GET", node.url + "/v1/cluster", timeout_s=5)[1]["node_id"]
            time.sleep(max(0.0, self.at - time.time()))
            node.kill9()
            self.killed_at = time.time()
            self.error = _poll_until(lambda: self._healed(victim), f"not healed within {BALANCE_S_MAX:g} s of the kill")
        except Exception as exc:  # surfaced by heal()
            self.error = repr(exc)

    def _healed(self, victim: str) -> bool:
        seen = under_replicated(self.system, victim)
        if seen is not None and seen["victim_state"] == "dead" and math.isnan(self.dead_at):
            self.dead_at = time.time()
        if seen is not None and not math.isnan(self.dead_at) and not seen["short"]:
            self.healed_at = time.time()
            return True
        return False


def heal(opts: Options, live: int, rate: float, duration_s: float, groups: int, kill_after_s: float,
         dead_after_s: float, lead_s: float, drain_s: float) -> Report:
    """Five nodes holding `live` far-future jobs run a steady stream; `kill_after_s` into it
    one node is killed for good. Measured: the time from the dead-node timeout until every
    group is back at R replicas, lateness meanwhile, and balance after."""
    report = Report(f"topology heal: a node of 5 killed for good ({live:,} live jobs, {groups} groups, R = 3, "
                    f"--dead-node-timeout {dead_after_s:g}s) {kill_after_s:g} s into a {rate:g} jobs/s run", [SD])
    system = SdSystem(opts.run_dir, opts.workers, opts.worker_concurrency, opts.in_flight, groups=groups, nodes=5,
                      node_args=("--dead-node-timeout", f"{dead_after_s:g}s"))
    report.raw["uptime"] = [f"before: {uptime_line()}"]
    try:
        system.setup()
        filled = sd_scenarios.fill(system, "hl", 0, live, opts.in_flight)
        report.raw["uptime"].append(f"after fill: {uptime_line()}")
        plan = OneOff.steady("th", lead_s + 2.0, rate, duration_s, lead_s, time.time())
        healer = Healer(system, plan.t0 + kill_after_s)
        healer.start()
        records, info = system.oneoff(plan, drain_s)
        info["box_slowdown"] = PROBE.slowdown(plan.t0, plan.t0 + duration_s)
        healer.join(BALANCE_S_MAX)
        after = balance(system)
    finally:
        system.teardown()
        report.raw["uptime"].append(f"after: {uptime_line()}")
    if healer.error:
        raise BenchError(f"healing failed: {healer.error}")
    k, d, h = healer.killed_at, healer.dead_at, healer.healed_at
    healing = [r for r in records if k <= r.due < h]
    s_all = summarize(records, plan.count, plan.t0)
    s_healing = summarize(healing, len(healing), k)
    report.add("fill: live jobs created (jobs/s)", {SD: f"{filled['created']:,} ({filled['jobs_per_s']:,.0f}/s)"}, None)
    report.add("kill -> declared dead (s)", {SD: d - k}, None)
    report.add("declared dead -> every group at R replicas (s)", {SD: h - d}, None)
    report.add("groups / leaders per node after", {SD: f"{after and after['groups_per_node']} / "
                                                        f"{after and after['leaders_per_node']}"}, None)
    _outcome_rows(report, {"due from the kill until healed": s_healing, "whole run": s_all}, info)
    report.notes.append("target: every group back at R replicas, balanced within one, nothing missing or doubled.")
    report.raw.update(stats=s_all, healing=s_healing, info=info, fill=filled, after=after)
    return report
