"""The cluster's time as a leader estimates it (raft/clocks.py) and the lease entries it
stamps with it (schedulerd/lease_time.py)."""
from __future__ import annotations

import time

from schedulerd import lease_time
from schedulerd.raft import riders
from schedulerd.raft.clocks import CLOCK, CLUSTER_CLOCK, PeerClocks
from schedulerd.storage import ops
from schedulerd.storage.ops import Op
from tests.unit.faketransport import Peer, Transport

S = 1_000_000


def leader_with(offsets_s: dict[str, float], voters: int = 3) -> tuple[PeerClocks, list[int]]:
    """A leader at t=1000 s that has just heard each peer answer with its clock; and its clock,
    to move."""
    now = [1000 * S]
    clocks = PeerClocks(lambda: now[0], voters, fresh_s=1.0, is_leader=lambda: True)
    transport = Transport()
    riders.install(transport, [clocks])
    for address, offset_s in offsets_s.items():
        transport.deliver(Peer(address), {"type": "next_node_idx", CLOCK: now[0] + int(offset_s * S)})
    return clocks, now


def cluster_now(offsets_s: dict[str, float], voters: int = 3) -> int:
    return leader_with(offsets_s, voters)[0].cluster_now_us()


def test_the_median_of_three_clocks_ignores_one_that_runs_ahead() -> None:
    assert 1000 * S <= cluster_now({"b": 0.0, "c": 30.0}) < 1000 * S + 1_000
    assert 1000 * S <= cluster_now({"b": 0.0, "c": -30.0}) < 1000 * S + 1_000


def test_a_leader_whose_clock_runs_ahead_takes_the_followers_time() -> None:
    assert 995 * S <= cluster_now({"b": -5.0, "c": -7.0}) < 995 * S + 1_000


def test_an_unmeasured_voter_counts_as_the_slowest_clock() -> None:
    assert cluster_now({"b": -5.0}) < 995 * S + 1_000
    assert cluster_now({"b": 5.0}) == 1000 * S
    assert cluster_now({}) == 1000 * S  # no majority measured, nothing told: our own
    assert cluster_now({}, voters=1) == 1000 * S


def test_a_new_leader_keeps_the_last_leaders_time_until_it_has_measured_a_majority() -> None:
    leading = [False]
    clocks = PeerClocks(lambda: 1000 * S, 3, fresh_s=1.0, is_leader=lambda: leading[0])
    transport = Transport()
    riders.install(transport, [clocks])
    transport.deliver(Peer("a"), {"type": "append_entries", CLUSTER_CLOCK: 996 * S})  # as a follower
    leading[0] = True
    assert 996 * S <= clocks.cluster_now_us() < 996 * S + 1_000
    transport.deliver(Peer("b"), {"type": "next_node_idx", CLOCK: 997 * S})
    assert 997 * S <= clocks.cluster_now_us() < 997 * S + 1_000  # measured: the median, lower of b's and ours


def test_a_jump_of_the_leaders_own_clock_does_not_move_its_estimates_of_the_others() -> None:
    clocks, now = leader_with({"b": -5.0, "c": -5.0})
    now[0] += 3600 * S
    assert 995 * S <= clocks.cluster_now_us() < 995 * S + 1_000
    assert all(-3605 * S <= offset < -3605 * S + 1_000 for offset in clocks.offsets_us().values())


def test_a_voter_not_heard_within_fresh_s_is_unmeasured() -> None:
    clocks = PeerClocks(lambda: 1000 * S, 3, fresh_s=0.0, is_leader=lambda: True)
    transport = Transport()
    riders.install(transport, [clocks])
    transport.deliver(Peer("b"), {"type": "next_node_idx", CLOCK: 990 * S})
    time.sleep(0.001)
    assert clocks.cluster_now_us() == 1000 * S and clocks.offsets_us() == {}


def test_a_follower_adds_its_clock_to_each_answer_and_takes_the_leaders_time() -> None:
    clocks = PeerClocks(lambda: 7 * S, 3, fresh_s=1.0, is_leader=lambda: False)
    transport = Transport()
    riders.install(transport, [clocks])
    assert clocks.cluster_now_us() == 7 * S  # told nothing yet: its own clock
    transport.send(Peer("a"), {"type": "next_node_idx", "success": True})
    transport.send(Peer("a"), {"type": "request_vote"})
    (_, answer), (_, vote) = transport.sent
    assert answer == {"type": "next_node_idx", "success": True, CLOCK: 7 * S} and CLOCK not in vote
    transport.deliver(Peer("a"), {"type": "append_entries", CLUSTER_CLOCK: 4 * S})
    assert 4 * S <= clocks.cluster_now_us() < 4 * S + 1_000  # aged by the time since it came


def test_a_leader_tells_its_followers_the_cluster_time() -> None:
    clocks, now = leader_with({"b": -5.0, "c": -7.0})
    transport = Transport()
    riders.install(transport, [clocks])
    transport.send(Peer("b"), {"type": "append_entries", "entries": []})
    assert 995 * S <= transport.sent[0][1][CLUSTER_CLOCK] < 995 * S + 1_000


def lease_entry(now: int) -> bytes:
    return ops.encode(Op.LEASE_READY, {"now": now, "lease_until": now + 30 * S, "grants": [["w", ["q"], 5]]})


def test_a_lease_entry_takes_the_cluster_time_and_moves_its_lease_end_as_much() -> None:
    for proposed, cluster in ((103 * S, 100 * S), (97 * S, 100 * S)):  # a clock ahead, a clock behind
        op, version, payload = ops.decode(lease_time.stamp(lease_entry(proposed), cluster))
        assert (op, version) == (Op.LEASE_READY, ops.VERSION)
        assert payload == {"now": 100 * S, "lease_until": 130 * S, "grants": [["w", ["q"], 5]]}


def test_heartbeats_and_expiries_take_the_cluster_time() -> None:
    beat = ops.encode(Op.HEARTBEAT, {"now": 103 * S, "lease_until": 133 * S, "leases": [["r1", 4, "w"]]})
    assert ops.decode(lease_time.stamp(beat, 100 * S))[2] == {"now": 100 * S, "lease_until": 130 * S,
                                                              "leases": [["r1", 4, "w"]]}
    expiry = ops.encode(Op.EXPIRE_LEASES, {"now": 103 * S, "runs": [["r1", 4]]})
    assert ops.decode(lease_time.stamp(expiry, 100 * S))[2] == {"now": 100 * S, "runs": [["r1", 4]]}


def test_other_entries_and_entries_on_time_pass_unchanged() -> None:
    on_time = lease_entry(100 * S)
    assert lease_time.stamp(on_time, 100 * S) is on_time
    create = ops.encode(Op.CREATE_JOBS, {"now": 103 * S, "jobs": []})
    assert lease_time.stamp(create, 100 * S) is create
    for junk in (b"", b"\x93\x0e", b"\x93\x0e\xff", ops.encode(Op.LEASE_READY, {"grants": []}),
                 ops.encode(Op.LEASE_READY, {"now": "soon"})):
        assert lease_time.stamp(junk, 100 * S) is junk  # apply refuses it, on every replica alike
