"""Sending a snapshot to a lagging or wiped follower without stalling the cluster.

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

import select
import time
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.tcp_connection import CONNECTION_STATE


def _serializer(replica: SyncObj) -> Any:
    return replica._SyncObj__serializer


def pace_sends(replica: SyncObj, window_bytes: int, wait_s: float) -> None:
    """Leader: hand out the next piece only while less than window_bytes wait to go to that node."""
    serializer = _serializer(replica)
    transport = replica._SyncObj__transport
    next_piece = serializer.getTransmissionData

    def paced(node: Any) -> Any:
        conn = transport._connections.get(node)
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


def answer_pieces(replica: SyncObj) -> None:
    """Follower: acknowledge every piece received, so the leader keeps the connection."""
    serializer = _serializer(replica)
    transport = replica._SyncObj__transport
    take_piece = serializer.setTransmissionData

    def take_and_answer(data: Any) -> bool:
        complete = take_piece(data)
        leader = replica._getLeader()
        if not complete and data is not None and leader is not None:
            transport.send(leader, {"type": "next_node_idx", "next_node_idx": 0, "reset": False, "success": False})
        return complete

    serializer.setTransmissionData = take_and_answer


def forget_transfers(replica: SyncObj) -> None:
    """Drop every transfer in progress; a new one starts from the first piece (tick thread only)."""
    transfers = _serializer(replica)._Serializer__transmissions
    for transfer in transfers.values():
        if "file" in transfer:
            transfer["file"].close()
    transfers.clear()
