"""storage/meta_voters.py: how many nodes vote in the metadata group, which change comes
next, and which role a node runs its replica in."""
from __future__ import annotations

import pytest

from schedulerd.storage import meta_voters


def alive(n: int) -> dict[str, str]:
    return {f"n{i}": "alive" for i in range(n)}


@pytest.mark.parametrize(("nodes", "meta_replicas", "want"), [
    (1, 5, 1), (2, 5, 2), (3, 5, 3), (4, 5, 3), (5, 5, 5), (9, 5, 5), (4, 3, 3), (7, 3, 3),
])
def test_the_target_is_meta_replicas_or_the_largest_odd_count_below(nodes: int, meta_replicas: int, want: int) -> None:
    assert meta_voters.target(alive(nodes), meta_replicas) == want


def test_suspect_and_draining_nodes_still_count_and_dead_or_removed_ones_do_not() -> None:
    states = {**alive(5), "n4": "suspect", "n3": "draining"}
    assert meta_voters.target(states, 5) == 5
    assert meta_voters.target({**states, "n2": "dead"}, 5) == 3
    assert meta_voters.target({**states, "n2": "removed", "n1": "dead"}, 5) == 3


def test_a_joiner_is_not_given_a_vote_while_the_target_is_met() -> None:
    assert meta_voters.next_change(alive(4), ["n0", "n1", "n2"], 5, "n0") is None


def test_the_fifth_node_brings_two_more_voters_one_at_a_time() -> None:
    assert meta_voters.next_change(alive(5), ["n0", "n1", "n2"], 5, "n0") == ("add", "n3", "fewer voters than the target")
    assert meta_voters.next_change(alive(5), ["n0", "n1", "n2", "n3"], 5, "n0")[:2] == ("add", "n4")
    assert meta_voters.next_change(alive(5), ["n0", "n1", "n2", "n3", "n4"], 5, "n0") is None


def test_a_dead_voter_is_taken_out_first_then_an_observer_takes_its_place() -> None:
    states = {**alive(4), "n1": "dead"}
    assert meta_voters.next_change(states, ["n0", "n1", "n2"], 5, "n0") == ("remove", "n1", "node n1 is dead")
    assert meta_voters.next_change(states, ["n0", "n2"], 5, "n0") == ("add", "n3", "fewer voters than the target")


def test_first_nodes_beyond_the_target_lose_their_vote_highest_id_first_the_leader_last() -> None:
    voters = ["n0", "n1", "n2", "n3"]
    assert meta_voters.next_change(alive(4), voters, 5, "n0") == ("remove", "n3", "more voters than the target of 3")
    assert meta_voters.next_change(alive(4), voters, 5, "n3")[:2] == ("remove", "n2")
    assert meta_voters.next_change(alive(4), voters, 3, "n0")[:2] == ("remove", "n3")


def test_a_draining_voter_is_replaced_then_taken_out_even_when_it_leads() -> None:
    states = {**alive(4), "n1": "draining"}
    assert meta_voters.next_change(states, ["n0", "n1", "n2"], 5, "n1") == ("add", "n3", "a voter is draining")
    assert meta_voters.next_change(states, ["n0", "n1", "n2", "n3"], 5, "n1")[:2] == ("remove", "n1")


def test_a_draining_voter_with_no_replacement_keeps_its_vote() -> None:
    states = {**alive(3), "n1": "draining"}
    assert meta_voters.next_change(states, ["n0", "n1", "n2"], 5, "n0") is None


def test_a_suspect_voter_is_dropped_before_an_alive_one_when_there_are_too_many() -> None:
    states = {**alive(4), "n1": "suspect"}
    assert meta_voters.next_change(states, ["n0", "n1", "n2", "n3"], 3, "n0")[:2] == ("remove", "n1")


def test_nothing_changes_without_a_live_quorum_of_voters() -> None:
    states = {**alive(5), "n1": "dead", "n2": "dead"}
    assert meta_voters.next_change(states, ["n0", "n1", "n2"], 5, "n0") is None


def view(members: list[str], change: dict | None = None, cluster: bool = True) -> dict:
    return {"cluster": {"meta_replicas": 5} if cluster else None, "placement": {"meta": members},
            "changes": {"meta": change} if change else {}}


def test_a_node_votes_when_placed_or_being_added_and_stops_as_soon_as_it_is_being_taken_out() -> None:
    assert meta_voters.votes(view(["n0", "n1"]), "n1") is True
    assert meta_voters.votes(view(["n0", "n1"]), "n2") is False
    assert meta_voters.votes(view(["n0", "n1"], {"kind": "add", "node_id": "n2"}), "n2") is True
    assert meta_voters.votes(view(["n0", "n1"], {"kind": "remove", "node_id": "n1"}), "n1") is False
    assert meta_voters.votes(view(["n0", "n1"], {"kind": "remove", "node_id": "n1"}), "n0") is True
    assert meta_voters.votes(view([], cluster=False), "n0") is None
