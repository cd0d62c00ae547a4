"""raft/pysyncobj_patches.py is the one place that reaches into pysyncobj, and it
refuses a pysyncobj it was not written against."""
from __future__ import annotations

import hashlib
import pathlib
import re
import subprocess
import sys
from typing import Any, Callable, Iterator

import pysyncobj.pickle
import pytest
from pysyncobj import FAIL_REASON

from schedulerd.raft import journal, membership, pysyncobj_patches
from schedulerd.storage import ops
from tests.pysyncobj_net import Net, Replica, conf

ROOT = pathlib.Path(__file__).resolve().parents[2]
# pysyncobj's private names, as Python mangles them.
PRIVATE = re.compile(r"_(SyncObj|Serializer|TcpConnection|Journal|FileJournal|Poller)__\w+")


def test_no_other_module_touches_pysyncobj_internals() -> None:
    found = []
    for top in ("schedulerd", "storage", "raft", "cli"):
        for path in (ROOT / top).rglob("*.py"):
            if path.name == "pysyncobj_patches.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if PRIVATE.search(line) or re.search(r"pysyncobj\.\w+\.\w+\s*=", line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


def test_another_pysyncobj_version_is_refused_at_import() -> None:
    probe = ("import importlib.metadata as m\n"
             "real = m.version\n"
             "m.version = lambda name: '0.3.18' if name == 'pysyncobj' else real(name)\n"
             "import schedulerd.raft.pysyncobj_patches\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "patches pysyncobj 0.3.17's internals, and pysyncobj 0.3.18 is installed" in out.stderr
    assert "install pysyncobj==0.3.17" in out.stderr


# Each patch below is shown against a cluster of real SyncObjs on a hand-driven network
# (tests/pysyncobj_net.py): the test replays the interleaving that shows the misbehaviour,
# once without the patch (where it must show) and once with it (where it must not). If an
# upgraded pysyncobj fixed one, its unpatched half fails and says which patch may go.

def _cluster(patch: Callable[[Replica], None] | None, **settings: Any) -> tuple[Net, list[Replica]]:
    pysyncobj_patches.use_pickle_protocol()  # as raft/group.py does on import: sizes below assume it
    net = Net()
    replicas = net.start(["n1:1", "n2:1", "n3:1"], lambda addr: conf(**settings))
    for replica in replicas if patch is not None else ():
        patch(replica)
    return net, replicas


@pytest.fixture
def nets() -> Iterator[list[Net]]:
    made: list[Net] = []
    yield made
    for net in made:
        net.close()


def test_entries_cross_the_wire_as_bytes_not_through_codecs() -> None:
    probe = ("import pysyncobj.pickle\n"
             "print(b'_codecs' in pysyncobj.pickle.dumps({'entries': [b'job']}))\n")
    unpatched = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert unpatched.stdout.strip() == "True"  # protocol 2: a latin-1 str, decoded on every read
    pysyncobj_patches.use_pickle_protocol()
    assert b"_codecs" not in pysyncobj.pickle.dumps({"entries": [b"job"]})


def _followers_told_before_leader_applies(nets: list[Net], patched: bool) -> bool:
    """Whether, at the moment the leader applies an entry, its followers were already sent
    a commit index covering it (schedulerd's _Replica announces before it applies)."""
    net, (leader, *followers) = _cluster(None)
    nets.append(net)
    net.elect(leader)
    net.settle(2)
    told_at_apply: list[bool] = []

    def announce() -> None:
        if patched:
            pysyncobj_patches.send_append_entries(leader)
        index = leader.raftLastApplied + 1
        told_at_apply.append(all(
            any(m["type"] == "append_entries" and m["commit_index"] >= index for s, d, m in net.sent[start:]
                if d == f.selfNode.address) for f in followers))

    leader.before_apply = announce
    leader.add("job")
    net.tick(leader)  # appends and sends the entry
    start = len(net.sent)
    net.deliver()  # followers append and ack
    net.tick(leader)  # commits and applies
    return told_at_apply == [True]


def test_a_leader_tells_followers_of_a_commit_before_it_applies_it(nets: list[Net]) -> None:
    assert not _followers_told_before_leader_applies(nets, patched=False)
    assert _followers_told_before_leader_applies(nets, patched=True)


def _cut_off_leader(net: Net, a: Replica, b: Replica, uncommitted: int, committed: int) -> None:
    """`a` leads and commits three entries, is cut off and appends `uncommitted` more that
    nobody else gets; `b` is elected and commits `committed` entries without it."""
    net.elect(a)
    for i in range(3):
        a.add(("a", i))
    net.settle(3)
    net.cut.add(a.selfNode.address)
    for i in range(uncommitted):
        a.add(("uncommitted", i))
    net.tick(a, times=2)
    net.elect(b)
    for i in range(committed):
        b.add(("b", i))
    net.settle(3)


def _stale_follower_catches_up(nets: list[Net], patch: Callable[[Replica], None] | None) -> bool:
    """A cut-off leader holding uncommitted entries rejoins a cluster whose new leader sends
    several small batches per heartbeat: does it catch up within 30 heartbeats?"""
    net, (a, b, c) = _cluster(patch, appendEntriesBatchSizeBytes=64)
    nets.append(net)
    _cut_off_leader(net, a, b, uncommitted=10, committed=30)
    net.cut.clear()
    for _ in range(30):
        pysyncobj_patches.send_append_entries(b)  # a heartbeat
        net.tick(b)
        net.deliver()
        net.tick(a)
        net.deliver()
    return a.applied == b.applied == [("a", 0), ("a", 1), ("a", 2)] + [("b", i) for i in range(30)]


def test_a_follower_with_a_stale_suffix_catches_up(nets: list[Net]) -> None:
    assert not _stale_follower_catches_up(nets, None)
    assert _stale_follower_catches_up(nets, pysyncobj_patches.backtrack_to_commit_index)


def _entries_sent_to_a_follower(nets: list[Net], patch: Callable[[Replica], None] | None) -> list[int]:
    """The leader sends five entries, one per tick; the follower's acks reach it one at a
    time, the leader ticking between them. Which entry indexes does the follower get?"""
    net, (leader, follower, other) = _cluster(patch)
    nets.append(net)
    net.elect(leader)
    net.settle(2)
    start = len(net.sent)
    for i in range(5):
        leader.add(i)
        net.tick(leader)
    to_followers = lambda src, dst, message: dst != "n1:1"  # noqa: E731
    net.deliver(only=to_followers)
    net.tick(follower, other)
    while net.deliver(1, only=lambda src, dst, message: dst == "n1:1"):
        net.tick(leader)
        net.deliver(only=to_followers)
        net.tick(follower, other)
    net.settle(3)
    assert follower.applied == leader.applied == [0, 1, 2, 3, 4]
    return [entry[1] for src, dst, m in net.sent[start:]
            if dst == "n2:1" and m["type"] == "append_entries" for entry in m.get("entries", [])]


def test_a_late_ack_does_not_make_the_leader_resend(nets: list[Net]) -> None:
    unpatched = _entries_sent_to_a_follower(nets, None)
    assert len(unpatched) > len(set(unpatched))  # entries the follower already had, sent again
    patched = _entries_sent_to_a_follower(nets, pysyncobj_patches.keep_next_index_on_late_acks)
    assert sorted(patched) == sorted(set(patched)) == list(range(patched[0], patched[0] + 5))


def _cut_off_leader_applies(nets: list[Net], patch: Callable[[Replica], None] | None) -> list[Any]:
    """A cut-off leader appends entries nobody else has; the new leader compacts its log,
    so the old one is sent a snapshot, a piece at a time. What did the old leader apply?"""
    net, (a, b, c) = _cluster(patch, logCompactionBatchSize=50)
    nets.append(net)
    _cut_off_leader(net, a, b, uncommitted=4, committed=10)
    b.forceLogCompaction()
    net.tick(b, times=3)
    net.cut.clear()
    for _ in range(30):
        pysyncobj_patches.send_append_entries(b)
        net.tick(b)
        while net.deliver(1):
            net.tick(a)
    assert a.applied == b.applied  # the snapshot installed either way
    return a.seen


def test_a_snapshot_piece_does_not_commit_a_followers_stale_entries(nets: list[Net]) -> None:
    assert ("uncommitted", 0) in _cut_off_leader_applies(nets, None)
    seen = _cut_off_leader_applies(nets, pysyncobj_patches.commit_only_what_matched)
    assert not any(item[0] == "uncommitted" for item in seen)


def _vetted(nets: list[Net], patched: bool) -> tuple[list[Any], list[Any]]:
    """A leader whose cluster writes entry version VERSION is given one entry of that
    version and one newer, the second forwarded by a follower: what was applied, and
    what did the proposers hear?"""
    net, (leader, follower, other) = _cluster(None)
    nets.append(net)
    if patched:
        stamp = lambda blob, now_us: blob + b"@%d" % now_us  # noqa: E731
        pysyncobj_patches.vet_as_leader_appends(leader, stamp, lambda: 1_000, lambda: ops.VERSION)
    net.elect(leader)
    net.settle(2)
    answers: list[Any] = []
    current = ops.encode(ops.Op.CREATE_JOBS, {"jobs": []})
    newer = ops.encode(ops.Op.CREATE_JOBS, {"jobs": []}, version=ops.VERSION + 1)
    leader.add(current, callback=lambda result, error: answers.append(error))
    follower.add(newer, callback=lambda result, error: answers.append(error))
    net.settle(5)
    assert other.applied == leader.applied
    return other.applied, answers


def test_the_leader_refuses_an_entry_newer_than_the_cluster_writes_and_stamps_the_rest(nets: list[Net]) -> None:
    current = ops.encode(ops.Op.CREATE_JOBS, {"jobs": []})
    newer = ops.encode(ops.Op.CREATE_JOBS, {"jobs": []}, version=ops.VERSION + 1)
    applied, answers = _vetted(nets, patched=False)
    assert applied == [current, newer]  # a voter of the older version would stop on it
    applied, answers = _vetted(nets, patched=True)
    assert applied == [current + b"@1000"]
    assert sorted(answers) == sorted([FAIL_REASON.SUCCESS, FAIL_REASON.REQUEST_DENIED])


def _acks_of_unsynced_entries(nets: list[Net], tmp_path: pathlib.Path, patched: bool) -> list[str]:
    """Every moment a node counted or reported an entry its journal had not fsynced."""
    journal.install()
    net = Net()
    nets.append(net)
    replicas = net.start(["n1:1", "n2:1", "n3:1"],
                         lambda addr: conf(journalFile=str(tmp_path / f"{patched}-{addr[:2]}.journal")))
    unsynced: list[str] = []
    for replica in replicas:
        log_ = pysyncobj_patches.raft_log(replica)
        link = net.link(replica)
        send = link.send

        def checked_send(node: Any, message: dict[str, Any], log_: Any = log_, send: Any = send,
                         name: str = replica.selfNode.address) -> bool:
            if message["type"] == "next_node_idx" and message["success"] \
                    and message["next_node_idx"] - 1 > log_.durable_index:
                unsynced.append(f"{name} acked {message['next_node_idx'] - 1}, durable {log_.durable_index}")
            return send(node, message)

        link.send = checked_send
        if patched:
            pysyncobj_patches.make_durable(replica, log_)
    leader = replicas[0]
    net.elect(leader)
    for i in range(5):
        leader.add(i)
        net.tick(leader)
        net.deliver()
        net.tick(leader)
        if leader.raftCommitIndex > pysyncobj_patches.raft_log(leader).durable_index:
            unsynced.append(f"leader committed {leader.raftCommitIndex}, "
                            f"durable {pysyncobj_patches.raft_log(leader).durable_index}")
    net.settle(3)
    assert all(r.applied == [0, 1, 2, 3, 4] for r in replicas)
    return unsynced


def test_no_node_counts_or_acks_an_entry_before_it_is_fsynced(nets: list[Net], tmp_path: pathlib.Path) -> None:
    assert _acks_of_unsynced_entries(nets, tmp_path, patched=False) != []
    assert _acks_of_unsynced_entries(nets, tmp_path, patched=True) == []


def _snapshot_to_a_wiped_follower(nets: list[Net], patched: bool) -> tuple[Net, Replica, Replica]:
    """A leader whose log was compacted, and a follower that has none of it: the leader
    must send it the snapshot, 200 bytes a piece. A leader's send loop ends after an
    append period when it has nothing to hand out, so the period is short here."""
    net, (leader, follower, other) = _cluster(None, logCompactionBatchSize=200, appendEntriesPeriod=0.005)
    nets.append(net)
    if patched:
        pysyncobj_patches.pace_snapshot_sends(leader, 400, 0.001)
        pysyncobj_patches.answer_snapshot_pieces(follower)
    net.cut.add("n2:1")
    net.elect(leader)
    for i in range(300):
        leader.add(("job", i, hashlib.sha256(b"%d" % i).hexdigest()))  # hardly compressible
    net.settle(3)
    leader.forceLogCompaction()
    net.tick(leader, times=3)
    net.cut.clear()
    pysyncobj_patches.send_append_entries(leader)
    net.deliver()  # the follower's answer tells the leader how far behind it is
    return net, leader, follower


def _queued_to_follower(nets: list[Net], patched: bool) -> int:
    """The most snapshot bytes ever waiting to go to a follower that reads nothing."""
    net, leader, follower = _snapshot_to_a_wiped_follower(nets, patched)
    most = 0
    for _ in range(5):
        pysyncobj_patches.send_append_entries(leader)
        net.tick(leader)
        pieces = [m["serialized"][0] for src, dst, m in net.in_flight() if dst == "n2:1" and m.get("serialized")]
        most = max(most, sum(len(data) for data in pieces))
    return most


def test_a_leader_queues_a_snapshot_no_faster_than_the_follower_reads(nets: list[Net]) -> None:
    assert _queued_to_follower(nets, patched=False) > 10_000  # the whole snapshot (~13 kB), at once
    assert _queued_to_follower(nets, patched=True) <= 400  # the window: two pieces


def _answers_during_transfer(nets: list[Net], patched: bool) -> tuple[int, int]:
    """The pieces a follower was sent, and how many times it answered before it had them all."""
    net, leader, follower = _snapshot_to_a_wiped_follower(nets, patched)
    start = len(net.sent)
    for _ in range(100):
        pysyncobj_patches.send_append_entries(leader)
        net.tick(leader)
        net.deliver()
        net.tick(follower)
        if follower.applied == leader.applied:
            break
    assert follower.applied == leader.applied
    sent = net.sent[start:]
    pieces = sum(1 for src, dst, m in sent if dst == "n2:1" and m.get("serialized"))
    answers = sum(1 for src, dst, m in sent
                  if src == "n2:1" and m["type"] == "next_node_idx" and not m["success"] and not m["reset"])
    return pieces, answers


def test_a_follower_answers_every_snapshot_piece(nets: list[Net]) -> None:
    pieces, answers = _answers_during_transfer(nets, patched=False)
    assert pieces > 10 and answers == 0  # silent until the end: a leader drops such a connection
    pieces, answers = _answers_during_transfer(nets, patched=True)
    assert pieces > 10 and answers == pieces - 1


def _first_piece_after_regaining_leadership(nets: list[Net], patched: bool) -> bool:
    """A leader sends a follower part of a snapshot, loses leadership to another node and
    wins it back: is the next piece it sends the first of the file?"""
    net, leader, follower = _snapshot_to_a_wiped_follower(nets, True)  # paced: a transfer takes ticks
    other = net.replicas["n3:1"]
    if patched:
        seen = [leader._getLeader()]

        def watch_leader() -> None:  # what raft/group.py does on every tick
            if leader._getLeader() != seen[0]:
                pysyncobj_patches.forget_snapshot_transfers(leader)
                seen[0] = leader._getLeader()

        leader.addOnTickCallback(watch_leader)
    pysyncobj_patches.send_append_entries(leader)  # the first pieces go out
    assert any(m.get("serialized") for src, dst, m in net.in_flight() if dst == "n2:1")
    net.flight.clear()  # and are lost with the connection
    net.elect(other)
    net.tick(leader)
    net.elect(leader)
    start = len(net.sent)
    pysyncobj_patches.send_append_entries(leader)
    pieces = [m["serialized"] for src, dst, m in net.sent[start:] if dst == "n2:1" and m.get("serialized")]
    return pieces[0][1]  # (data, is_first, is_last)


def test_a_new_term_starts_a_snapshot_transfer_from_its_first_piece(nets: list[Net]) -> None:
    assert not _first_piece_after_regaining_leadership(nets, patched=False)
    assert _first_piece_after_regaining_leadership(nets, patched=True)


def _membership_told(nets: list[Net], patched: bool) -> tuple[list[str], list[str]]:
    """A fourth node joins a group and a first follower is removed: what did the owners of
    the leader and of the removed node hear, and who does the removed node think it is with?"""
    net, (leader, removed, other) = _cluster(None, dynamicMembershipChange=True)
    nets.append(net)
    heard: list[str] = []
    if patched:
        for replica in (leader, removed):
            pysyncobj_patches.watch_membership(
                replica, lambda r=replica: heard.append(f"{r.selfNode.address} has {len(r.otherNodes) + 1}"))
    net.elect(leader)
    net.settle(2)
    net.add("n4:1", ["n1:1", "n2:1", "n3:1"], conf(dynamicMembershipChange=True))
    results: list[int] = []
    leader.addNodeToCluster("n4:1", callback=lambda r, e: results.append(e))
    net.settle(3)
    leader.removeNodeFromCluster("n2:1", callback=lambda r, e: results.append(e))
    net.settle(3)
    assert results == [FAIL_REASON.SUCCESS, FAIL_REASON.SUCCESS]
    assert sorted(n.address for n in leader.otherNodes) == ["n3:1", "n4:1"]
    return heard, sorted(n.address for n in removed.otherNodes)


def test_the_owner_hears_of_each_membership_change(nets: list[Net]) -> None:
    heard, _ = _membership_told(nets, patched=False)
    assert heard == []
    heard, removed_sees = _membership_told(nets, patched=True)
    assert heard == ["n1:1 has 4", "n2:1 has 4", "n1:1 has 3"]
    # The leader stops sending to a node as it appends its removal: only the placement can
    # tell that node, which still counts itself a member.
    assert removed_sees == ["n1:1", "n3:1", "n4:1"]


def test_a_restart_takes_the_members_from_the_log_not_from_its_arguments(nets: list[Net]) -> None:
    """pysyncobj builds a restarted node with the members it is given; the ones in its log
    come back only as it applies entries again, up to a commit index stored lazily."""
    net, (leader, b, c) = _cluster(None, dynamicMembershipChange=True)
    nets.append(net)
    net.elect(leader)
    net.add("n4:1", ["n1:1", "n2:1", "n3:1"], conf(dynamicMembershipChange=True))
    leader.addNodeToCluster("n4:1")
    net.settle(3)
    leader.removeNodeFromCluster("n2:1")
    net.settle(3)
    log_ = pysyncobj_patches.raft_log(net.replicas["n4:1"])
    assert membership.members_in_log({"n1:1", "n2:1", "n3:1", "n4:1"}, 0, log_[:]) == {"n1:1", "n3:1", "n4:1"}
    # a snapshot's members stand for every entry up to its last one
    assert membership.members_in_log({"n1:1", "n3:1", "n4:1"}, log_[-1][1], log_[:]) == {"n1:1", "n3:1", "n4:1"}


def _second_change_while_first_uncommitted(nets: list[Net], patched: bool) -> tuple[list[int], int]:
    """A leader whose followers hear nothing is asked to add one node and then another:
    what did the second request get, and how many membership entries does its log hold?"""
    net, (leader, b, c) = _cluster(pysyncobj_patches.one_membership_change_at_a_time if patched else None,
                                   dynamicMembershipChange=True)
    nets.append(net)
    net.elect(leader)
    net.settle(2)
    net.cut.update({"n2:1", "n3:1"})  # nothing the leader appends now commits
    answers: list[int] = []
    leader.addNodeToCluster("n4:1", callback=lambda result, error: answers.append(error))
    net.tick(leader)
    leader.addNodeToCluster("n5:1", callback=lambda result, error: answers.append(error))
    net.tick(leader)
    changes = sum(1 for e in pysyncobj_patches.raft_log(leader)[:] if pysyncobj_patches.membership_change(e[0]))
    return answers, changes


def test_a_leader_starts_no_membership_change_before_the_last_one_committed(nets: list[Net]) -> None:
    answers, changes = _second_change_while_first_uncommitted(nets, patched=False)
    assert changes == 2  # two single-server changes in flight: majorities that need not overlap
    answers, changes = _second_change_while_first_uncommitted(nets, patched=True)
    assert changes == 1 and answers == [FAIL_REASON.REQUEST_DENIED]


def _joiner_votes(nets: list[Net], patched: bool) -> list[str]:
    """A node started to join the group, before the entry adding it reached it, is asked for
    its vote: what does it answer?"""
    net, (leader, b, c) = _cluster(None, dynamicMembershipChange=True)
    nets.append(net)
    net.elect(leader)
    net.settle(2)
    joiner = net.add("n4:1", ["n1:1", "n2:1", "n3:1"], conf(dynamicMembershipChange=True))
    if patched:
        pysyncobj_patches.no_votes_before_joining(joiner)
    start = len(net.sent)
    net.link(b).send(joiner.selfNode, {"type": "request_vote", "term": 99, "last_log_index": 1, "last_log_term": 0})
    net.deliver()
    return [m["type"] for src, dst, m in net.sent[start:] if src == "n4:1"]


def test_a_node_that_has_not_joined_yet_grants_no_vote(nets: list[Net]) -> None:
    assert _joiner_votes(nets, patched=False) == ["response_vote"]  # an empty log judges nothing
    assert _joiner_votes(nets, patched=True) == []


def _cut_off_leader_hears_the_new_one(nets: list[Net], patched: bool) -> bool:
    """A leader cut off from the group appends the removal of a follower, which never
    commits; that follower is elected. Once the network heals, does the old leader follow it?"""
    net, (a, b, c) = _cluster(pysyncobj_patches.hear_removed_nodes_until_committed if patched else None,
                              dynamicMembershipChange=True)
    nets.append(net)
    net.elect(a)
    net.settle(2)
    net.cut.add("n1:1")
    a.removeNodeFromCluster("n2:1")
    net.tick(a)
    net.elect(b)
    for i in range(3):
        b.add(i)
    net.settle(3)
    net.cut.clear()
    for _ in range(5):
        pysyncobj_patches.send_append_entries(b)
        net.tick()
        net.deliver()
    return a.applied == b.applied == [0, 1, 2] and not a._isLeader()


def test_a_removal_that_never_committed_does_not_make_a_node_deaf(nets: list[Net]) -> None:
    assert not _cut_off_leader_hears_the_new_one(nets, patched=False)
    assert _cut_off_leader_hears_the_new_one(nets, patched=True)


def _joiner_after_compaction(nets: list[Net], compacts: str) -> tuple[bool, list[str]]:
    """A patched joiner gets the entry adding it, then that entry leaves its log: its own
    compaction takes it, or the joiner catches up from the leader's snapshot. Does its log
    still hold the entry, and what does it answer when asked for its vote?"""
    net, (leader, b, c) = _cluster(None, dynamicMembershipChange=True)
    nets.append(net)
    net.elect(leader)
    net.settle(2)
    for i in range(3):
        leader.add(i)
    net.settle(2)
    joiner = net.add("n4:1", ["n1:1", "n2:1", "n3:1"], conf(dynamicMembershipChange=True))
    pysyncobj_patches.no_votes_before_joining(joiner)
    joiner.patched()
    if compacts == "leader":
        net.cut.add("n4:1")
    leader.addNodeToCluster("n4:1")
    net.settle(3)
    for i in range(3, 6):
        leader.add(i)
        net.settle(3)
    compacting = joiner if compacts == "joiner" else leader
    compacting.forceLogCompaction()
    net.settle(3)
    net.cut.clear()
    for _ in range(10):
        pysyncobj_patches.send_append_entries(leader)
        net.settle(2)
    assert joiner.applied == [0, 1, 2, 3, 4, 5]
    held = any(pysyncobj_patches.membership_change(e[0]) == ("add", "n4:1") for e in pysyncobj_patches.raft_log(joiner)[:])
    start = len(net.sent)
    net.link(b).send(joiner.selfNode, {"type": "request_vote", "term": 99, "last_log_index": 99, "last_log_term": 99})
    net.deliver()
    return held, [m["type"] for src, dst, m in net.sent[start:] if src == "n4:1" and m["type"].endswith("vote")]


@pytest.mark.parametrize("compacts", ["joiner", "leader"])
def test_a_joiner_votes_once_the_entry_adding_it_was_compacted_away(nets: list[Net], compacts: str) -> None:
    held, answers = _joiner_after_compaction(nets, compacts)
    assert not held and answers == ["response_vote"]


def _follower_log_end_after_a_late_append(nets: list[Net], patch: Callable[[Replica], None] | None) -> int:
    """The leader sends two entries, one append each; the follower takes both, then the
    first append again (a duplicate, or one reordered behind the second). How far does
    the follower's log end move?"""
    net, (leader, follower, other) = _cluster(patch)
    nets.append(net)
    net.elect(leader)
    net.settle(2)
    leader.add("a")
    net.tick(leader)
    leader.add("b")
    net.tick(leader)
    first = next(m for m in net.flight if m[1].address == "n2:1" and pysyncobj.pickle.loads(m[2]).get("entries"))
    net.deliver(only=lambda src, dst, message: dst == "n2:1")
    end = follower._SyncObj__raftLog[-1][1]
    net.flight.append(first)
    net.deliver(only=lambda src, dst, message: dst == "n2:1")
    return int(follower._SyncObj__raftLog[-1][1]) - end


def test_a_late_append_does_not_cut_entries_the_follower_holds(nets: list[Net]) -> None:
    assert _follower_log_end_after_a_late_append(nets, None) == -1  # the entry it acknowledged is gone
    assert _follower_log_end_after_a_late_append(nets, pysyncobj_patches.truncate_only_on_conflict) == 0


def _joiner_answers_after_a_late_heartbeat(nets: list[Net], joiner_first: bool) -> list[str]:
    """A joiner holds the entry adding it; a heartbeat from before that entry arrives late.
    truncate_only_on_conflict keeps the log, and pysyncobj still calls the take-back of the
    add. Asked for its vote then, what does the joiner answer?"""
    net, (leader, b, c) = _cluster(None, dynamicMembershipChange=True)
    nets.append(net)
    net.elect(leader)
    net.settle(2)
    joiner = net.add("n4:1", ["n1:1", "n2:1", "n3:1"], conf(dynamicMembershipChange=True))
    patches = [pysyncobj_patches.no_votes_before_joining, pysyncobj_patches.truncate_only_on_conflict]
    for patch in patches if joiner_first else reversed(patches):
        patch(joiner)
    leader.addNodeToCluster("n4:1")
    net.settle(3)
    held = pysyncobj_patches.raft_log(joiner)[:]
    add_at = next(e[1] for e in held if pysyncobj_patches.membership_change(e[0]) == ("add", "n4:1"))
    before = next(e for e in held if e[1] == add_at - 1)
    late = {"type": "append_entries", "term": leader.raftCurrentTerm, "commit_index": add_at - 1,
            "prevLogIdx": before[1], "prevLogTerm": before[2], "entries": []}
    net.link(leader).send(joiner.selfNode, late)
    net.deliver(only=lambda src, dst, message: dst == "n4:1")
    assert pysyncobj_patches.raft_log(joiner)[-1][1] >= add_at  # kept
    start = len(net.sent)
    net.link(b).send(joiner.selfNode, {"type": "request_vote", "term": 99, "last_log_index": 99, "last_log_term": 99})
    net.deliver(only=lambda src, dst, message: dst == "n4:1")
    return [m["type"] for src, dst, m in net.sent[start:] if src == "n4:1" and m["type"].endswith("vote")]


def test_a_joiner_installed_first_is_not_told_of_a_take_back_that_did_not_happen(nets: list[Net]) -> None:
    assert _joiner_answers_after_a_late_heartbeat(nets, joiner_first=False) == []  # the order the docstrings forbid
    assert _joiner_answers_after_a_late_heartbeat(nets, joiner_first=True) == ["response_vote"]
