"""Every place schedulerd reaches into pysyncobj: its private attributes, the objects it
builds and the functions it calls, each changed to fix one misbehaviour of the
version it was written against. Nothing else in schedulerd touches pysyncobj's
internals, and this module refuses to load beside any other version: a patch that
silently stopped applying would weaken Raft, not fail.

The patches, each a function below with the misbehaviour it fixes:
- the pickle protocol of every message (`use_pickle_protocol`);
- a commit announced to followers before the leader applies it (`send_append_entries`);
- a follower whose log diverged catches up in one step (`backtrack_to_commit_index`);
- a late ack never moves the leader's nextIndex back (`keep_next_index_on_late_acks`);
- a follower commits only on an append that matched its log (`commit_only_what_matched`);
- the leader vets and stamps each entry as it appends it (`vet_as_leader_appends`);
- the log is fsynced before a node counts it or answers for it (`make_durable`), in the
  journal pysyncobj is made to create (`replace_journal_factory`);
- snapshot transfers that finish (`pace_snapshot_sends`, `answer_snapshot_pieces`,
  `forget_snapshot_transfers`);
- membership: one change in flight at a time (`one_membership_change_at_a_time`), no vote
  from a replica that has not yet joined (`no_votes_before_joining`), a removed member
  heard until its removal commits (`hear_removed_nodes_until_committed`), what a
  journal entry changes (`membership_change`), and a callback on every change of members
  a replica takes on (`watch_membership`).
tests/unit/test_pysyncobj_patches.py replays each misbehaviour on real SyncObjs over a
hand-driven network, and checks it shows without the patch and not with it.

Snapshot transfers, in detail:
Sending a snapshot to a lagging or wiped follower without stalling the cluster.

pysyncobj 0.3.17 streams the snapshot file in `logCompactionBatchSize` pieces.
Three things in it kept a wiped follower of a 1M-job store (a 711 MB snapshot)
from ever catching up, each seen in the scale bench's logs:

- The follower answers nothing until the last piece, and a leader drops a
  connection it has read nothing from for `connectionTimeout` (3.5 s). Any
  transfer longer than that started again from the first piece, every ~5 s,
  and the cut-off follower called an election each time (term 3 -> 99).
- The leader queues pieces as fast as it reads them into a bytes buffer it
  copies on every socket write: the buffer grows by the tens of MB per tick
  and copying it stalls the tick thread that also sends heartbeats.
- A leader keeps its read position across losing and regaining leadership and
  resumes mid-file into a follower that has since started over with another
  leader: the follower assembles a mixture (refused by the snapshot trailer).

So the follower answers each piece with a no-op `next_node_idx` (success and
reset false: the leader only notes that it heard from it), the leader queues
at most `window_bytes` for one follower (waiting for the socket briefly, never
longer than one append period), and every leader change forgets transfers in
progress."""
from __future__ import annotations

import importlib.metadata
import logging
import os
import select
import time
from typing import TYPE_CHECKING, Any, Callable

import pysyncobj.pickle
import pysyncobj.syncobj
from pysyncobj import FAIL_REASON, SyncObj
from pysyncobj.tcp_connection import CONNECTION_STATE

from schedulerd.storage import ops

if TYPE_CHECKING:
    from schedulerd.raft.journal import DurableJournal

log = logging.getLogger("schedulerd.raft")

WRITTEN_FOR = "0.3.17"
_INSTALLED = importlib.metadata.version("pysyncobj")
if _INSTALLED != WRITTEN_FOR:
    raise ImportError(f"schedulerd's Raft layer patches pysyncobj {WRITTEN_FOR}'s internals, and pysyncobj "
                      f"{_INSTALLED} is installed: install pysyncobj=={WRITTEN_FOR}")

Stamp = Callable[[bytes, int], bytes]  # (entry blob, the cluster's time in µs) -> the blob to append
# Messages that tell a peer what this node holds: its log must be durable first.
# Term and vote are already durable (setCurrentTerm stores them synchronously).
_SYNC_BEFORE_SENDING = frozenset({"next_node_idx", "request_vote", "response_vote"})


def transport(replica: SyncObj) -> Any:
    """The replica's TCP transport (pysyncobj keeps it private)."""
    return replica._SyncObj__transport


def raft_log(replica: SyncObj) -> Any:
    """The journal the replica logs into."""
    return replica._SyncObj__raftLog


def last_log_index(replica: SyncObj) -> int:
    """The index of the replica's last log entry, committed or not."""
    index: int = replica._SyncObj__getCurrentLogIndex()
    return index


def match_index(replica: SyncObj, address: str) -> int:
    """On a leader: the last entry the member at `address` is known to hold (0 if none)."""
    for node, index in list(replica._SyncObj__raftMatchIndex.items()):
        if node.id == address:
            return int(index)
    return 0


# pysyncobj 0.3.17 pickles every message and command at protocol 2, which writes a bytes
# object (each entry is one) as a latin-1 str and reads it back through codecs. For a
# 150-job create entry, protocol 5 pickles the command in 0.7 µs against 15.7, unpickles
# it in 0.6 against 13.4, and pickles and compresses an append carrying it in 28 µs
# against 109. Every reader takes any protocol, so nodes of older builds read these messages
# and journals unchanged.
PICKLE_PROTOCOL = 5


def use_pickle_protocol() -> None:
    """Pickle every message and command at PICKLE_PROTOCOL (see above)."""
    setattr(pysyncobj.pickle, "__protocol", PICKLE_PROTOCOL)


def send_append_entries(replica: SyncObj) -> None:
    """Send each follower its append now, from the leader's tick thread. pysyncobj 0.3.17
    sends the new commit index only once the leader's own apply is done: a leader about
    to apply calls this first, so its followers apply alongside it."""
    replica._SyncObj__sendAppendEntries()


def backtrack_to_commit_index(replica: SyncObj) -> None:
    """Make a follower whose log diverged catch up in one step.

    pysyncobj 0.3.17's leader sends several append batches per tick. A follower
    with a stale suffix (a cut-off leader's uncommitted entries) answers the first
    with "back up one entry" and the rest with "resend from my log end"; the
    leader applies the answers in order, lands on the log end again, and the
    follower never catches up (a livelock once the leader is a batch ahead).
    Every failed answer is rewritten here to "resend from my commit index + 1":
    committed entries always match the leader's, so the next batch's prevLogIdx
    matches and pysyncobj replaces the stale suffix at once."""
    tcp = transport(replica)
    send = tcp.send

    def send_with_backtrack(node: Any, message: dict[str, Any]) -> Any:
        if message.get("type") == "next_node_idx" and message.get("reset") and not message.get("success"):
            message = dict(message, next_node_idx=min(message["next_node_idx"], replica.raftCommitIndex + 1))
        return send(node, message)

    tcp.send = send_with_backtrack


def keep_next_index_on_late_acks(replica: SyncObj) -> None:
    """A follower's ack only ever moves the leader's nextIndex for it forward.

    pysyncobj 0.3.17's leader sends each new entry as it appends it, and set nextIndex
    to whatever the latest ack reported, even with later appends already on their way:
    those were sent again, and the follower truncated and re-added entries it had
    applied ("truncating already-applied log entries"). A rejected append still moves
    nextIndex back (the consistency check and backtrack_to_commit_index), which is all
    Raft needs to repair an append that never arrived."""
    tcp = transport(replica)
    handle = tcp._onMessageReceivedCallback

    def on_message(node: Any, message: dict[str, Any]) -> None:
        if message.get("type") != "next_node_idx" or not message.get("success") or message.get("reset"):
            handle(node, message)
            return
        next_index = replica._SyncObj__raftNextIndex
        before = next_index.get(node)
        handle(node, message)
        if before is not None and next_index.get(node, before) < before:
            next_index[node] = before

    tcp._onMessageReceivedCallback = on_message


def commit_only_what_matched(replica: SyncObj) -> None:
    """A follower moves its commit index only on an append that matched its log.

    pysyncobj 0.3.17 takes the leader's commit index from every append_entries
    message, and one that carries a piece of a snapshot (or nothing) never checked
    the follower's log against the leader's. A cut-off former leader that holds
    uncommitted entries and is sent a snapshot then "committed" and applied those
    stale entries, and the snapshot that followed was older than its store, so the
    replica kept jobs the cluster never committed and missed ones it did
    (test_group, the cut-off leader tests). Such messages now leave the follower's
    commit index where it was; the snapshot install sets what it covers, and the
    next matching append moves the commit index on."""
    tcp = transport(replica)
    handle = tcp._onMessageReceivedCallback

    def on_message(node: Any, message: dict[str, Any]) -> None:
        if message.get("type") == "append_entries" and "prevLogIdx" not in message:
            message = dict(message, commit_index=min(message["commit_index"], replica.raftCommitIndex))
        handle(node, message)

    tcp._onMessageReceivedCallback = on_message


def truncate_only_on_conflict(replica: SyncObj) -> None:
    """A follower drops log entries only where the leader's differ (Raft's rule), never
    because an append it already holds arrived again.

    pysyncobj 0.3.17 deletes everything after an append's prevLogIdx and re-adds the
    append's entries, whatever they are. An append that arrives again after later ones
    (duplicated, or a resend from a nextIndex moved back) and carries fewer entries than
    the follower holds cut off entries the follower had acknowledged: the leader had
    counted them toward a commit, a new leader elected without them overwrote the index,
    and the replica that had applied the old entry diverged (the deterministic
    simulation's chaos network, seed 13). A late heartbeat (no entries) cut the log back
    to its prevLogIdx the same way. The matching head of an append is dropped here; when
    nothing in it is new, the follower keeps its log, answers for what the append
    covered, and takes a commit index no further than that. pysyncobj still calls its
    membership take-backs then, and they are not carried out: a patch that watches them
    must be installed before this one, so that it is not told of them either."""
    tcp = transport(replica)
    handle = tcp._onMessageReceivedCallback
    delete_from = replica._SyncObj__deleteEntriesFrom
    change_cluster = replica._SyncObj__doChangeCluster
    keeping = [False]

    def on_message(node: Any, message: dict[str, Any]) -> None:
        if message.get("type") != "append_entries" or "prevLogIdx" not in message \
                or message.get("transmission") is not None:
            handle(node, message)
            return
        held = replica._SyncObj__raftLog
        first, last = held[0][1], held[-1][1]

        def term_at(idx: int) -> int | None:
            return held[idx - first][2] if first <= idx <= last else None

        matched, term = message["prevLogIdx"], message["prevLogTerm"]
        if term_at(matched) != term:
            handle(node, message)  # pysyncobj answers the mismatch (and truncates nothing)
            return
        entries = message.get("entries", [])
        held_already = 0
        while held_already < len(entries) and term_at(entries[held_already][1]) == entries[held_already][2]:
            _, matched, term = entries[held_already]
            held_already += 1
        rest = entries[held_already:]
        message = dict(message, entries=rest, prevLogIdx=matched, prevLogTerm=term)
        if rest or matched == last:
            handle(node, message)
            return
        message["commit_index"] = min(message["commit_index"], matched)
        keeping[0] = True
        try:
            handle(node, message)
        finally:
            keeping[0] = False

    def delete_unless_keeping(from_idx: int) -> None:
        if not keeping[0]:
            delete_from(from_idx)

    def change_unless_keeping(request: Any, reverse: bool = False) -> Any:
        if keeping[0] and reverse:
            return None
        return change_cluster(request, reverse)

    replica._SyncObj__deleteEntriesFrom = delete_unless_keeping
    replica._SyncObj__doChangeCluster = change_unless_keeping
    tcp._onMessageReceivedCallback = on_message


_REGULAR = b"\x00"  # pysyncobj's command type byte of a replicated call
_MEMBERSHIP = b"\x02"  # ... and of a membership change: pickled [kind ('add' | 'rem'), node id, node]


def membership_change(command: bytes) -> tuple[str, str] | None:
    """("add" | "remove", address) for a journal entry that changes the group's members,
    None for any other entry."""
    if command[:1] != _MEMBERSHIP:
        return None
    kind, node_id = pysyncobj.pickle.loads(command[1:])[:2]
    return ("add" if kind == "add" else "remove"), node_id


def one_membership_change_at_a_time(replica: SyncObj) -> None:
    """A leader refuses a membership change while its previous one is not committed.

    pysyncobj 0.3.17 means to (`__changeCluster` refuses while `__changeClusterIDx` is set
    and not yet applied) but never sets that index, so a leader appended one change after
    another. Two single-server changes in flight at once allow two configurations whose
    majorities do not overlap: in the membership fuzz (tests/unit/test_membership_fuzz.py)
    a leader cut off with one side committed entries with one member while the other side
    elected a leader and committed different ones at the same indexes (Raft's thesis,
    section 4.1: a change may start only once the previous one is committed)."""
    change = replica._SyncObj__changeCluster

    def one_at_a_time(request: Any) -> bool:
        index = replica._SyncObj__getCurrentLogIndex() + 1  # where the leader appends it
        done = change(request)
        if done:
            replica._SyncObj__changeClusterIDx = index
        return done

    replica._SyncObj__changeCluster = one_at_a_time


def no_votes_before_joining(replica: SyncObj) -> None:
    """A replica started to join a running group grants no vote until it holds the entry
    that adds it: in its log, or in a snapshot taken once it was a member.

    pysyncobj knows members by address only. A node removed from a group and later added
    back empty on the same address (a replacement, or a wiped disk) is still a voter in the
    old configuration of any member that missed the changes since, and with an empty log it
    votes for whoever asks: in the membership fuzz such a stale member won an election with
    its vote and committed entries at indexes the group had already committed differently.
    Until the joiner has the entry adding it, it has nothing a vote could be judged by.
    Whether it has is noted as the entry arrives (or a snapshot holding it is installed),
    not looked for when a vote is asked: by then compaction may have taken the entry out
    of the log, and a group whose joiners never vote again elects no leader (the
    deterministic simulation, seed 14: two of three members were joiners). Install it
    before fix_log_replication (see truncate_only_on_conflict)."""
    tcp = transport(replica)
    handle = tcp._onMessageReceivedCallback
    change = replica._SyncObj__doChangeCluster
    serializer = _serializer(replica)
    deserialize = serializer.deserialize
    self_id = replica.selfNode.id
    joined = [any(membership_change(entry[0]) == ("add", self_id) for entry in raft_log(replica)[:])]

    def changed(request: Any, reverse: bool = False) -> Any:
        if request[0] == "add" and request[1] == self_id:
            joined[0] = not reverse  # taken back when a new leader's log overwrites it
        return change(request, reverse)

    def installed() -> Any:
        data = deserialize()
        if any(getattr(node, "id", node) == self_id for node in data[3]):
            joined[0] = True
        return data

    def on_message(node: Any, message: dict[str, Any]) -> None:
        if message.get("type") == "request_vote" and not joined[0]:
            return
        handle(node, message)

    replica._SyncObj__doChangeCluster = changed
    serializer.deserialize = installed
    tcp._onMessageReceivedCallback = on_message


def hear_removed_nodes_until_committed(replica: SyncObj) -> None:
    """A node stops taking a removed member's traffic only once the removal is committed.

    pysyncobj takes on a membership change when it appends it, and its TCP transport then
    hangs up on the removed address at once. A removal that never commits (its leader was
    cut off and a new one does not have it) so left a member deaf to a node that is still a
    member, possibly the next leader: in the membership fuzz a group of four ended with no
    leader it could elect. Raft asks servers to take messages from any server; only a
    removed member's own disruption is to be kept out, and that once it is out for good.
    What such a node sends that only a member may (an answer to an append, a vote) is
    dropped: pysyncobj would count the vote, and fail on the answer. An observer (a
    read-only node, which is in no configuration) is answered like a member: the leader
    moves its next index on its answers, or it never catches up."""
    change = replica._SyncObj__doChangeCluster
    apply_command = replica._SyncObj__doApplyCommand
    tcp = transport(replica)
    drop = tcp.dropNode
    node_class = replica._SyncObj__nodeClass
    handle = tcp._onMessageReceivedCallback

    def on_message(node: Any, message: dict[str, Any]) -> None:
        if message.get("type") in _MEMBERS_ONLY and node not in replica._SyncObj__otherNodes \
                and node not in replica._SyncObj__readonlyNodes:
            return
        handle(node, message)

    def changed(request: Any, reverse: bool = False) -> bool:
        if request[0] != "rem" or reverse:
            return change(request, reverse)
        tcp.dropNode = lambda node: None
        try:
            return change(request, reverse)
        finally:
            tcp.dropNode = drop

    def applied(command: bytes) -> Any:
        result = apply_command(command)
        removal = membership_change(command)
        self_node = replica.selfNode  # None on an observer (a read-only node)
        if removal is not None and removal[0] == "remove" and (self_node is None or removal[1] != self_node.id) \
                and all(node.id != removal[1] for node in replica.otherNodes):
            drop(node_class(removal[1]))
        return result

    replica._SyncObj__doChangeCluster = changed
    replica._SyncObj__doApplyCommand = applied
    tcp._onMessageReceivedCallback = on_message


_MEMBERS_ONLY = frozenset({"next_node_idx", "response_vote"})


def watch_membership(replica: SyncObj, on_change: Callable[[], None]) -> None:
    """Call `on_change` (tick thread) after each change of the replica's members it takes
    on: when it appends one, when it applies one replaying its journal, when a truncation
    takes one back, when a snapshot sets them. pysyncobj tells no one, and who counts
    voters must know. A removed node is not told at all (the leader stops sending to it as
    it appends its removal): the placement tells it, not its log."""
    change = replica._SyncObj__doChangeCluster
    update = replica._SyncObj__updateClusterConfiguration

    def changed(request: Any, reverse: bool = False) -> bool:
        done = change(request, reverse)
        if done:
            on_change()
        return done

    def updated(nodes: Any) -> None:
        update(nodes)
        on_change()

    replica._SyncObj__doChangeCluster = changed
    replica._SyncObj__updateClusterConfiguration = updated


def vet_as_leader_appends(replica: SyncObj, stamp: Stamp | None, cluster_now_us: Callable[[], int],
                           writes: Callable[[], int]) -> None:
    """Let the leader look at each entry at the moment it appends it (in the tick thread,
    right before pysyncobj checks it is the leader and appends): its own proposals and
    those followers forwarded alike.

    An entry of a version newer than the cluster writes is refused, since a voter would
    stop on it: its proposer acted on an older figure (a leader change, a voter restarted
    on an older build), and the API answers it 503, to retry. The others pass through
    `stamp`. Anything else (a follower forwarding, a command of another type) passes as
    it came."""
    queue = replica._SyncObj__commandsQueue
    take = queue.get_nowait
    refuse = replica._SyncObj__callErrCallback

    def get_nowait() -> tuple[bytes, Any]:
        while True:
            command, callback = take()  # raises queue.Empty when none is left, as pysyncobj expects
            if command[:1] != _REGULAR or not replica._isLeader():
                return command, callback
            try:
                func_id, (blob,) = pysyncobj.pickle.loads(command[1:])
                head, cluster_writes = ops.header(blob), writes()
                if head is not None and head[1] > cluster_writes:
                    log.warning("entry_refused version=%d writes=%d", head[1], cluster_writes)
                    refuse(FAIL_REASON.REQUEST_DENIED, callback)
                    continue
                stamped = blob if stamp is None else stamp(blob, cluster_now_us())
            except Exception:  # an exception here would stop the tick thread: append it as it came
                log.exception("leader_vet_failed")
                return command, callback
            if stamped is not blob:
                command = _REGULAR + pysyncobj.pickle.dumps((func_id, (stamped,)))
            return command, callback

    queue.get_nowait = get_nowait


def replace_journal_factory(create: Callable[[str | None], Any]) -> None:
    """Make every SyncObj created from now on log into what `create(journalFile)` returns.
    SyncObj.__init__ calls the name `createJournal` that syncobj.py imported from
    .journal, so that is the one to replace."""
    pysyncobj.syncobj.createJournal = create


def make_durable(syncobj: SyncObj, journal: DurableJournal) -> None:
    """fsync the log before `syncobj` counts its own copy or reports it to a peer.

    Call once, right after constructing the SyncObj: its tick thread starts in
    the constructor, and entries it acknowledges before this call are not fsynced
    first.
    """
    if raft_log(syncobj) is not journal:
        raise ValueError("journal is not this SyncObj's log; call install() before creating it")
    # Leader. The installed 0.3.17 SyncObj._onTick runs, in order: (1) if leader,
    # count followers' matchIndex plus 1 for itself and advance the commit index;
    # (2) apply committed entries; (3) send append_entries; (4)
    # _checkCommandsToApply appends the leader's new entries; (5) log compaction;
    # (6) tick callbacks; (7) poller.poll waits for messages. Syncing at (6) makes
    # the entries of (4) durable before (1) of the next tick counts them. The NO_OP
    # a new leader appends inside (7) counts only with followers' acks, which
    # arrive in a later poll, after (6). Only a 1-node cluster commits its
    # election NO_OP unsynced (elected and counted in one tick): it carries no
    # client write, and the next sync covers it since the file is append-only.
    syncobj.addOnTickCallback(journal.sync)
    # Follower. The append_entries handler adds entries, then answers through
    # self.__transport.send(node, {"type": "next_node_idx", ...}).
    tcp = transport(syncobj)
    send = tcp.send

    def send_after_sync(node: Any, message: dict[str, Any]) -> bool:
        if message.get("type") in _SYNC_BEFORE_SENDING:
            journal.sync()
        return send(node, message)

    tcp.send = send_after_sync


def fix_log_replication(replica: SyncObj, journal: DurableJournal) -> None:
    """The fixes every replica of ours takes, data group or metadata group: a durable log,
    a stale follower caught up in one step, no resends on late acks, commits only on
    appends that matched, one membership change at a time, removed members heard until
    the removal commits."""
    make_durable(replica, journal)
    backtrack_to_commit_index(replica)
    keep_next_index_on_late_acks(replica)
    commit_only_what_matched(replica)
    truncate_only_on_conflict(replica)
    one_membership_change_at_a_time(replica)
    hear_removed_nodes_until_committed(replica)


def close_notifier_on_destroy(replica: SyncObj) -> None:
    """Close the pipe pysyncobj wakes its tick with when the replica is destroyed.

    pysyncobj 0.3.17 opens one per SyncObj (appendEntriesUseBatch off, as ours run) and
    never closes it: every replica a node dropped or restarted in-process (a placement
    change, a metadata role switch) kept two file descriptors, until a simulated day of
    crashes and restarts ran out of them. A late wake-up (a proposal racing the destroy)
    finds a no-op and descriptor -1, never a number the kernel has handed to another file."""
    destroy = replica._doDestroy

    def destroyed() -> None:
        destroy()
        close_notifier(replica)

    replica._doDestroy = destroyed


def close_notifier(replica: SyncObj) -> None:
    """Close the replica's wake-up pipe now (once; see close_notifier_on_destroy)."""
    notifier = getattr(replica, "_SyncObj__pipeNotifier", None)
    if notifier is None or notifier._PipeNotifier__pipeR < 0:
        return
    notifier.notify = lambda: None
    read_fd, write_fd = notifier._PipeNotifier__pipeR, notifier._PipeNotifier__pipeW
    notifier._PipeNotifier__pipeR = notifier._PipeNotifier__pipeW = -1
    replica._poller.unsubscribe(read_fd)
    os.close(read_fd)
    os.close(write_fd)


def _serializer(replica: SyncObj) -> Any:
    return replica._SyncObj__serializer


def pace_snapshot_sends(replica: SyncObj, window_bytes: int, wait_s: float) -> None:
    """Leader: hand out the next piece only while less than window_bytes wait to go to that node."""
    serializer = _serializer(replica)
    tcp = transport(replica)
    next_piece = serializer.getTransmissionData

    def paced(node: Any) -> Any:
        conn = tcp._connections.get(node)
        if conn is not None and not _drained(conn, window_bytes, wait_s):
            return None  # pysyncobj sends an empty message and tries again next tick
        return next_piece(node)

    serializer.getTransmissionData = paced


def _drained(conn: Any, window_bytes: int, wait_s: float) -> bool:
    """Push the connection's queued bytes into its socket until fewer than window_bytes remain."""
    deadline = time.monotonic() + wait_s
    while conn.getSendBufferSize() >= window_bytes:
        left = deadline - time.monotonic()
        if left <= 0 or conn.state != CONNECTION_STATE.CONNECTED:
            return False
        select.select([], [conn.fileno()], [], left)
        conn._TcpConnection__trySendBuffer()
    return True


def answer_snapshot_pieces(replica: SyncObj) -> None:
    """Follower: acknowledge every piece received, so the leader keeps the connection."""
    serializer = _serializer(replica)
    tcp = transport(replica)
    take_piece = serializer.setTransmissionData

    def take_and_answer(data: Any) -> bool:
        complete = take_piece(data)
        leader = replica._getLeader()
        if not complete and data is not None and leader is not None:
            tcp.send(leader, {"type": "next_node_idx", "next_node_idx": 0, "reset": False, "success": False})
        return complete

    serializer.setTransmissionData = take_and_answer


def forget_snapshot_transfers(replica: SyncObj) -> None:
    """Drop every transfer in progress; a new one starts from the first piece (tick thread only)."""
    transfers = _serializer(replica)._Serializer__transmissions
    for transfer in transfers.values():
        if "file" in transfer:
            transfer["file"].close()
    transfers.clear()
