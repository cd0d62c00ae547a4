"""storage/meta.py: the metadata group's registry and placement, rule by rule; a refused
command changes nothing."""
from __future__ import annotations

import copy
from typing import Any

import pytest

from schedulerd.storage import meta, placement

T0 = 1_800_000_000_000_000


def nodes(n: int) -> list[dict[str, Any]]:
    return [{"node_id": f"n{i}", "http": f"10.0.0.{i}:8080", "raft": f"10.0.0.{i}:9080"} for i in range(n)]


def bootstrap(n: int, **change: Any) -> dict[str, Any]:
    return {"op": "bootstrap", "cluster_id": "c1", "groups": 6, "replication_factor": 3, "meta_replicas": 3,
            "raft_addrs": [node["raft"] for node in nodes(n)], "now": T0, **change}


def registered(n: int) -> dict[str, Any]:
    state = meta.empty()
    for node in nodes(n):
        assert meta.apply(state, {"op": "register", **node, "now": T0}) == {"ok": True, "joined": True}
    return state


def booted(n: int = 3, rf: int = 3, groups: int = 6) -> dict[str, Any]:
    state = registered(n)
    result = meta.apply(state, bootstrap(n, groups=groups, replication_factor=rf))
    assert result == {"ok": True, "epoch": 1}
    return state


def refused(state: dict[str, Any], command: dict[str, Any], error: str) -> None:
    before = copy.deepcopy(state)
    result = meta.apply(state, command)
    assert not result["ok"] and error in result["error"], result
    assert state == before


def test_bootstrap_places_every_group_on_rf_nodes_as_every_node_computed_it() -> None:
    state = booted(6, 3, 12)
    assert state["cluster"]["replication_factor"] == 3
    layout = meta.data_placement(state)
    assert len(layout) == 12 and all(len(m) == 3 for m in layout.values())
    assert placement.is_balanced(meta.node_states(state), layout, 3)
    by_raft = {n["raft"]: n["node_id"] for n in nodes(6)}
    computed = placement.initial(by_raft, range(12), 3)  # what each node started from its peer list
    assert layout == {g: tuple(sorted(by_raft[a] for a in m)) for g, m in computed.items()}
    assert state["placement"][meta.META] == [f"n{i}" for i in range(6)]  # every first node, then trimmed


def test_bootstrap_waits_for_every_first_node_to_register() -> None:
    state = registered(2)
    refused(state, bootstrap(3), "waiting for 10.0.0.2:9080 to register")


@pytest.mark.parametrize("change, error", [
    ({"replication_factor": 2}, "replication_factor must be one of (1, 3, 5), not 2"),
    ({"replication_factor": 5}, "replication factor 5 needs at least 5 nodes; 3 given"),
    ({"meta_replicas": 4}, "meta_replicas must be one of (3, 5), not 4"),
    ({"groups": 0}, "groups must be within 1..1024, not 0"),
    ({"raft_addrs": ["10.0.0.0:9080", "10.0.0.1:9080", "10.0.0.0:9080"]}, "the Raft addresses must be distinct"),
])
def test_a_bad_bootstrap_is_refused(change: dict[str, Any], error: str) -> None:
    refused(registered(3), bootstrap(3, **change), error)


def test_only_registrations_come_before_the_bootstrap_and_it_comes_once() -> None:
    refused(registered(1), {"op": "set_state", "node_id": "n0", "state": "dead", "now": T0}, "not bootstrapped")
    state = booted()
    refused(state, bootstrap(3, cluster_id="c2"), "already bootstrapped")
    refused(state, {"op": "frobnicate"}, "unknown op 'frobnicate'")


def test_a_node_registers_once_keeps_its_raft_address_and_may_move_its_http_one() -> None:
    state = booted()
    new = {"node_id": "n9", "http": "10.0.0.9:8080", "raft": "10.0.0.9:9080"}
    assert meta.apply(state, {"op": "register", **new, "now": T0 + 1}) == {"ok": True, "joined": True}
    assert state["nodes"]["n9"]["state"] == "alive"
    assert meta.apply(state, {"op": "register", **new, "http": "10.0.0.9:8081", "now": T0 + 2}) == \
        {"ok": True, "joined": False}
    assert state["nodes"]["n9"]["http"] == "10.0.0.9:8081"
    refused(state, {"op": "register", **new, "raft": "10.0.0.9:9999", "now": T0 + 3}, "keeps its Raft address")
    # A new id on n9's Raft address: n9's disk was wiped; it is dead and the new node joins.
    assert meta.apply(state, {"op": "register", "node_id": "n10", "http": "x:1", "raft": "10.0.0.9:9080",
                              "now": T0 + 3}) == {"ok": True, "joined": True}
    assert state["nodes"]["n9"]["state"] == "dead" and state["nodes"]["n10"]["state"] == "alive"


def test_node_states_move_only_along_the_allowed_transitions() -> None:
    state = booted(4, 3, 4)
    assert meta.apply(state, {"op": "set_state", "node_id": "n3", "state": "suspect", "now": T0})["ok"]
    assert meta.apply(state, {"op": "register", **nodes(4)[3], "now": T0 + 1})["ok"]  # heard again
    assert state["nodes"]["n3"]["state"] == "alive"
    assert meta.apply(state, {"op": "set_state", "node_id": "n3", "state": "dead", "now": T0 + 2})["ok"]
    refused(state, {"op": "set_state", "node_id": "n3", "state": "alive", "now": T0 + 3},
            "node n3 is dead and can go to ['removed'], not alive")
    refused(state, {"op": "register", **nodes(4)[3], "now": T0 + 3}, "wipe its data dir and join it as a new node")
    refused(state, {"op": "set_state", "node_id": "n3", "state": "removed", "now": T0 + 3}, "still holds replicas")
    refused(state, {"op": "set_state", "node_id": "n7", "state": "dead", "now": T0 + 3}, "no node 'n7'")
    # The machine, wiped, comes back on the same Raft address as a new node.
    again = {**nodes(4)[3], "node_id": "n3b"}
    assert meta.apply(state, {"op": "register", **again, "now": T0 + 4}) == {"ok": True, "joined": True}


def test_a_change_is_begun_against_the_epoch_it_was_planned_at_one_per_group() -> None:
    state = booted(3, 3, 2)
    assert meta.apply(state, {"op": "register", "node_id": "n3", "http": "h:1", "raft": "r:1", "now": T0})["ok"]
    begin = {"op": "begin_change", "group": 0, "kind": "add", "node_id": "n3", "epoch": 1, "now": T0,
             "reason": "balance"}
    refused(state, {**begin, "epoch": 0}, "placement epoch is 1, the change was planned at 0")
    refused(state, {**begin, "node_id": "n0"}, "node n0 is already in group 0")
    refused(state, {**begin, "kind": "remove", "node_id": "n3"}, "node n3 is not in group 0")
    refused(state, {**begin, "group": 7}, "no group 7")
    assert meta.apply(state, begin)["ok"]
    refused(state, {**begin, "kind": "remove", "node_id": "n0"}, "group 0 has a change under way")
    end = {"op": "end_change", "group": 0, "done": True, "started_us": T0}
    refused(state, {**end, "started_us": T0 - 5, "now": T0 + 1}, f"began at {T0}, not {T0 - 5}")
    assert meta.apply(state, {**end, "now": T0 + 1}) == {"ok": True, "epoch": 2}
    assert state["placement"]["0"] == ["n0", "n1", "n2", "n3"]
    assert meta.apply(state, {**begin, "kind": "remove", "node_id": "n0", "epoch": 2, "now": T0 + 2})["ok"]
    assert meta.apply(state, {**end, "done": False, "started_us": T0 + 2, "now": T0 + 2}) == {"ok": True, "epoch": 2}
    assert state["placement"]["0"] == ["n0", "n1", "n2", "n3"] and state["moves"] == {"done": 1, "failed": 1}
    refused(state, {**end, "now": T0 + 3}, "no change under way")


def test_the_planner_drives_the_registry_to_balance_through_begin_and_end() -> None:
    state = booted(3, 3, 12)
    for n in nodes(6)[3:]:
        assert meta.apply(state, {"op": "register", **n, "now": T0})["ok"]
    for step in range(100):
        changes = placement.plan(meta.node_states(state), meta.data_placement(state), 3)
        if not changes:
            break
        c = changes[0]
        assert meta.apply(state, {"op": "begin_change", "group": c.group, "kind": c.kind, "node_id": c.node_id,
                                  "epoch": state["epoch"], "now": T0 + step, "reason": c.reason})["ok"]
        assert meta.apply(state, {"op": "end_change", "group": c.group, "done": True, "started_us": T0 + step,
                                  "now": T0 + step})["ok"]
    assert placement.is_balanced(meta.node_states(state), meta.data_placement(state), 3)
    assert sorted(placement.loads(meta.node_states(state), meta.data_placement(state)).values()) == [6] * 6


def test_the_planned_placement_counts_changes_under_way_as_done() -> None:
    state = booted(3, 3, 2)
    assert meta.apply(state, {"op": "register", "node_id": "n3", "http": "h:1", "raft": "r:1", "now": T0})["ok"]
    assert meta.apply(state, {"op": "begin_change", "group": 0, "kind": "add", "node_id": "n3", "epoch": 1,
                              "now": T0, "reason": "balance"})["ok"]
    assert meta.apply(state, {"op": "begin_change", "group": 1, "kind": "remove", "node_id": "n0", "epoch": 1,
                              "now": T0, "reason": "balance"})["ok"]
    assert meta.planned_placement(state) == {0: ("n0", "n1", "n2", "n3"), 1: ("n1", "n2")}
    assert meta.data_placement(state) == {0: ("n0", "n1", "n2"), 1: ("n0", "n1", "n2")}
