"""Snapshot transfer pacing and restarts (raft/pysyncobj_patches.py) against
pysyncobj's own Serializer; the whole transfer is tested in test_group.py."""
from __future__ import annotations

import pathlib
import socket
import time
from types import SimpleNamespace
from typing import Any

import pytest
from pysyncobj.serializer import Serializer
from pysyncobj.tcp_connection import CONNECTION_STATE

from schedulerd.raft import pysyncobj_patches

PIECE = 1024
WINDOW = 2 * PIECE


class SocketConn:
    """The part of pysyncobj's TcpConnection the pacing uses, over a real socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.queued = b""
        self.state = CONNECTION_STATE.CONNECTED

    def fileno(self) -> int:
        return self.sock.fileno()

    def getSendBufferSize(self) -> int:
        return len(self.queued)

    def _TcpConnection__trySendBuffer(self) -> None:
        try:
            sent = self.sock.send(self.queued)
        except BlockingIOError:
            return
        self.queued = self.queued[sent:]


@pytest.fixture
def sockets():
    a, b = socket.socketpair()
    a.setblocking(False)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    yield a, b
    a.close()
    b.close()


def leader_with(tmp_path: pathlib.Path, conn: Any) -> tuple[Serializer, SimpleNamespace]:
    snapshot = tmp_path / "snap"
    snapshot.write_bytes(bytes(range(256)) * 64)  # 16 pieces
    serializer = Serializer(str(snapshot), PIECE, False, None, None, None)
    replica = SimpleNamespace(_SyncObj__serializer=serializer,
                              _SyncObj__transport=SimpleNamespace(_connections={"follower": conn}))
    pysyncobj_patches.pace_snapshot_sends(replica, WINDOW, wait_s=0.05)
    return serializer, replica


def fill_socket(sock: socket.socket) -> None:
    try:
        while True:
            sock.send(b"x" * 4096)
    except BlockingIOError:
        pass


def test_no_piece_is_handed_out_while_the_window_is_full(tmp_path, sockets) -> None:
    a, _ = sockets
    fill_socket(a)  # the follower reads nothing
    conn = SocketConn(a)
    conn.queued = b"q" * WINDOW
    serializer, _ = leader_with(tmp_path, conn)
    started = time.monotonic()
    assert serializer.getTransmissionData("follower") is None
    assert 0.04 < time.monotonic() - started < 1.0, "waits about wait_s, not longer"
    assert conn.getSendBufferSize() == WINDOW


def test_queued_bytes_are_pushed_out_before_the_next_piece(tmp_path, sockets) -> None:
    a, b = sockets
    conn = SocketConn(a)
    conn.queued = b"q" * (3 * WINDOW)
    serializer, _ = leader_with(tmp_path, conn)
    data, first, last = serializer.getTransmissionData("follower")
    assert (len(data), first, last) == (PIECE, True, False)
    assert conn.getSendBufferSize() < WINDOW
    assert b.recv(65536).startswith(b"q")


def test_a_node_without_a_connection_gets_pieces_as_before(tmp_path) -> None:
    serializer, _ = leader_with(tmp_path, None)
    pieces = [serializer.getTransmissionData("elsewhere") for _ in range(17)]
    assert pieces[0][1] is True and pieces[-1][2] is True


def test_a_forgotten_transfer_starts_again_from_the_first_piece(tmp_path, sockets) -> None:
    a, _ = sockets
    serializer, replica = leader_with(tmp_path, SocketConn(a))
    assert serializer.getTransmissionData("follower")[1] is True
    assert serializer.getTransmissionData("follower")[1] is False
    pysyncobj_patches.forget_snapshot_transfers(replica)
    data, first, _ = serializer.getTransmissionData("follower")
    assert first is True and data == (bytes(range(256)) * 4)[:PIECE]


def test_the_follower_answers_every_piece_but_the_last(tmp_path) -> None:
    serializer = Serializer(str(tmp_path / "received"), PIECE, False, None, None, None)
    sent: list[tuple[str, dict[str, Any]]] = []
    replica = SimpleNamespace(_SyncObj__serializer=serializer, _getLeader=lambda: "leader",
                              _SyncObj__transport=SimpleNamespace(send=lambda node, msg: sent.append((node, msg))))
    pysyncobj_patches.answer_snapshot_pieces(replica)
    assert serializer.setTransmissionData((b"a" * PIECE, True, False)) is False
    assert serializer.setTransmissionData((b"b" * PIECE, False, False)) is False
    assert serializer.setTransmissionData((b"", False, True)) is True
    assert [node for node, _ in sent] == ["leader", "leader"]
    assert all(msg["type"] == "next_node_idx" and not msg["success"] and not msg["reset"] for _, msg in sent)
    assert (tmp_path / "received").read_bytes() == b"a" * PIECE + b"b" * PIECE
