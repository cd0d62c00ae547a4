"""A stand-in for pysyncobj's transport, for the riders on Raft's messages (raft/riders.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Peer:
    address: str


class Transport:
    """Records what is sent; `deliver` plays a message in as if it came from node."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, dict[str, Any]]] = []
        self._onMessageReceivedCallback = lambda node, message: None

    def send(self, node: Any, message: dict[str, Any]) -> None:
        self.sent.append((node, message))

    def deliver(self, node: Any, message: dict[str, Any]) -> None:
        self._onMessageReceivedCallback(node, message)
