"""Fields the daemon adds to pysyncobj's own Raft traffic, and reads back out of it.

Two messages carry them: a follower's answer to an append (`next_node_idx`), which
reaches the leader from every voter about every append period, and the leader's append
(`append_entries`), which reaches every follower as often. A rider says what it adds to
each and hears what the other side added. pysyncobj ignores keys it does not know, so
a node of an older build ignores the fields and sends none: a rider must treat a
message without its field as saying nothing."""
from __future__ import annotations

from typing import Any, Protocol

ANSWER = "next_node_idx"
APPEND = "append_entries"


class Rider(Protocol):
    def answer_fields(self) -> dict[str, Any]:
        """What this node, as a follower, adds to each answer it sends the leader."""

    def append_fields(self) -> dict[str, Any]:
        """What this node, as the leader, adds to each append it sends a follower."""

    def heard_answer(self, node: Any, message: dict[str, Any]) -> None:
        """A follower's answer arrived (on the leader)."""

    def heard_append(self, message: dict[str, Any]) -> None:
        """The leader's append arrived (on a follower)."""


def install(transport: Any, riders: list[Rider]) -> None:
    """Wrap the transport's send and receive (both run in the tick thread)."""
    send, receive = transport.send, transport._onMessageReceivedCallback

    def send_with_fields(node: Any, message: dict[str, Any]) -> Any:
        kind = message.get("type")
        if kind == ANSWER or kind == APPEND:
            message = dict(message)
            for rider in riders:
                message.update(rider.answer_fields() if kind == ANSWER else rider.append_fields())
        return send(node, message)

    def receive_fields(node: Any, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == ANSWER:
            for rider in riders:
                rider.heard_answer(node, message)
        elif kind == APPEND:
            for rider in riders:
                rider.heard_append(message)
        receive(node, message)

    transport.send = send_with_fields
    transport._onMessageReceivedCallback = receive_fields
