"""schedulerd/liveness.py: suspect, dead and alive again, by silence."""
from __future__ import annotations

from schedulerd import liveness


def test_silence_makes_a_node_suspect_then_dead_and_an_answer_brings_a_suspect_back() -> None:
    states = {"a": "alive", "b": "alive", "c": "suspect", "d": "suspect", "e": "dead", "f": "draining"}
    silent = {"a": 1.0, "b": 6.0, "c": 0.5, "d": 700.0, "e": 900.0, "f": 900.0}
    assert liveness.transitions(states, silent, 5.0, 600.0) == [("b", "suspect"), ("c", "alive"), ("d", "dead")]


def test_an_alive_node_silent_past_the_dead_timeout_goes_straight_to_dead() -> None:
    assert liveness.transitions({"a": "alive"}, {"a": 601.0}, 5.0, 600.0) == [("a", "dead")]


def test_nodes_the_leader_does_not_watch_are_not_judged() -> None:
    assert liveness.transitions({"a": "alive", "b": "alive"}, {"a": 0.0}, 5.0, 600.0) == []
