"""The files in deploy/, each checked by the tool that will read it: the alert rules by
`promtool check rules` and their unit tests by `promtool test rules`, the systemd unit by
`systemd-analyze verify`, and every metric that a rule, a dashboard query or a query of
docs/autoscaling.md names against what a real node's /metrics exports. docs/operations.md shows the unit file as it is.

In CI (CI set) a missing tool fails the test: .ci/run installs them (prometheus for
promtool, systemd for systemd-analyze). Elsewhere the test skips."""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import urllib.request
from typing import Any, Iterator

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERT_TESTS = DEPLOY / "prometheus" / "alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "schedulerd.json"
UNIT = DEPLOY / "systemd" / "schedulerd.service"
OPERATIONS = ROOT / "docs" / "operations.md"
AUTOSCALING = ROOT / "docs" / "autoscaling.md"
UNIT_EXEC = "/opt/schedulerd/.venv/bin/schedulerd"  # where docs/operations.md installs the daemon

# Series Prometheus makes itself for each target, not the node: `up` is how a dead node shows.
PROMETHEUS_OWN = {"up"}
PROMQL_WORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right",
    "sum", "max", "min", "avg", "count", "topk", "bottomk", "quantile", "stddev", "abs", "rate", "irate",
    "increase", "delta", "deriv", "changes", "resets", "predict_linear", "histogram_quantile", "clamp_min",
    "clamp_max", "absent", "vector", "scalar", "time", "label_replace", "sort", "sort_desc", "max_over_time",
}


def tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is missing; .ci/run installs it (apt-get install {package})")
        pytest.skip(f"{name} is not installed (apt-get install {package})")
    return path


def run(args: list[str], cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


# ---- the alert rules ----------------------------------------------------------------

def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def test_promtool_checks_the_alert_rules() -> None:
    done = run([tool("promtool", "prometheus"), "check", "rules", str(ALERTS)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout, done.stdout


def test_promtool_unit_tests_of_the_alert_rules_pass() -> None:
    done = run([tool("promtool", "prometheus"), "test", "rules", ALERT_TESTS.name], cwd=ALERT_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout, done.stdout


def test_every_alert_has_a_unit_test_that_sees_it_quiet_and_firing() -> None:
    quiet, firing = set(), set()
    for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names))
    assert sorted(firing) == sorted(names)
    # Each firing case runs a healthy series beside the broken one; those that also break
    # a healthy start are checked quiet before it.
    assert quiet <= firing


def test_every_alert_names_a_severity_and_a_runbook_in_the_docs() -> None:
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^## (.+)$", OPERATIONS.read_text(), flags=re.M)}
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("page", "warning", "ticket"), rule["alert"]
        for anchor in re.findall(r"docs/operations\.md#([a-z0-9-]+)", rule["annotations"]["runbook"]):
            assert anchor in anchors, (rule["alert"], anchor)


# ---- the dashboard ------------------------------------------------------------------

def dashboard_panels() -> Iterator[dict[str, Any]]:
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["id"] is None and board["uid"] and board["title"] and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"job", "instance"} <= variables.keys()
    ids, cells = set(), set()
    for panel in dashboard_panels():
        assert panel["id"] not in ids, panel["title"]
        ids.add(panel["id"])
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]


# ---- every name a query uses is exported --------------------------------------------

def queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every alert expression and dashboard query."""
    found = [(f"alert {rule['alert']}", rule["expr"]) for rule in alert_rules()]
    for panel in dashboard_panels():
        found += [(f"panel {panel['title']!r}", target["expr"]) for target in panel.get("targets", [])]
    for variable in json.loads(DASHBOARD.read_text())["templating"]["list"]:
        if variable["type"] == "query":
            selector = re.fullmatch(r"label_values\((.+), *\w+\)", variable["query"]["query"])
            assert selector, variable["query"]
            found.append((f"variable {variable['name']}", selector.group(1)))
    return found + autoscaling_queries()


def autoscaling_queries() -> list[tuple[str, str]]:
    """Every PromQL query docs/autoscaling.md shows: its promql blocks, and the `query:`,
    `seriesQuery:` and `metricsQuery:` of its manifests (the adapter's template removed)."""
    text = AUTOSCALING.read_text()
    found = [("docs/autoscaling.md promql", block.strip()) for block in re.findall(r"```promql\n(.*?)```", text, re.S)]
    for name, value in re.findall(r"\b(query|seriesQuery|metricsQuery): *'?(.+?)'?$", text, re.M):
        found.append((f"docs/autoscaling.md {name}", value.replace("<<.LabelMatchers>>", "")))
    assert len(found) >= 8, found  # the page's queries, so a change of format cannot silently drop them
    return found


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names its matchers use) for each vector selector of a PromQL
    expression. Anything that is not a known PromQL word counts as a metric name, so a
    misspelt name or an unknown function fails rather than passes unseen."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges, $__rate_interval included
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    found = []
    for match in re.finditer(r"(?<![\w.$])([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?", text):
        name, matchers = match.group(1), match.group(2) or ""
        if name in PROMQL_WORDS and not matchers:
            continue
        found.append((name, set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matchers))))
    return found


def test_the_query_parser_finds_names_and_labels() -> None:
    assert selectors('histogram_quantile(0.99, max by (job, le) (rate(a_bucket{job="$job", le!="1e9"}[5m]))) > 2'
                     ' and on (job) b_total - 1e9 * c') == [("a_bucket", {"job", "le"}), ("b_total", set()),
                                                            ("c", set())]


def exported(url: str) -> dict[str, set[str]]:
    """Every series name the node's /metrics exposes, with the label names seen on it
    (a family with no series yet still names its series: counter _total, histogram parts)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(family.type, [""])
        for suffix in suffixes:
            names.setdefault(family.name + suffix, set())
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


@pytest.mark.integration
def test_every_metric_a_rule_or_panel_queries_is_exported_by_a_node(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    # The registry figures appear once the node's metadata group has elected it.
    names = wait_until(lambda: (lambda n: n if "schedulerd_nodes" in n else None)(exported(node.url)), 15,
                       "the registry figures on /metrics")
    used = {(name, where) for where, expr in queries() for name, _ in selectors(expr)}
    missing = sorted((where, name) for name, where in used if name not in names and name not in PROMETHEUS_OWN)
    assert not missing, f"queried but not exported: {missing}"
    assert {"schedulerd_disk_free_bytes", "schedulerd_raft_has_quorum", "schedulerd_queue_running",
            "schedulerd_dispatch_lateness_seconds_bucket"} <= {name for name, _ in used}
    # Label names are checked where the node already shows series of the metric; Prometheus
    # adds job and instance, and le is a histogram bucket's own.
    for where, expr in queries():
        for name, labels in selectors(expr):
            seen = names.get(name)
            if seen:
                assert labels - {"job", "instance"} <= seen | {"le"}, (where, name, labels, seen)


# ---- the systemd unit ---------------------------------------------------------------

def documented_unit() -> str:
    text = OPERATIONS.read_text()
    block = re.search(r"\(`deploy/systemd/schedulerd\.service`.*?\n\n```ini\n(.*?)```\n", text, flags=re.S)
    assert block, "docs/operations.md shows no unit after its mention of deploy/systemd/schedulerd.service"
    return block.group(1)


def test_the_docs_show_the_unit_file_as_it_is() -> None:
    assert documented_unit() == UNIT.read_text()


def test_systemd_analyze_verifies_the_unit(tmp_path: pathlib.Path) -> None:
    analyze = tool("systemd-analyze", "systemd")
    unit = UNIT.read_text()
    assert unit.count(f"ExecStart={UNIT_EXEC} ") == 1
    # verify wants ExecStart's program to exist: the copy names this checkout's venv's own.
    daemon = pathlib.Path(sys.executable).parent / "schedulerd"
    assert daemon.is_file(), f"{daemon} missing: pip install -e . makes it"
    copy = tmp_path / "schedulerd.service"
    copy.write_text(unit.replace(f"ExecStart={UNIT_EXEC} ", f"ExecStart={daemon} "))
    done = run([analyze, "verify", str(copy)])
    assert done.returncode == 0, done.stdout + done.stderr
    mentions = [line for line in (done.stdout + done.stderr).splitlines() if copy.name in line]
    assert not mentions, "\n".join(mentions)
