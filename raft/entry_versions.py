"""Which entry version the cluster writes: the newest one every voter reads.

An entry keeps the rules of the version it was written at (storage/ops.py), and a node
stops on an entry newer than its build reads. In a rolling upgrade the upgraded nodes
must therefore go on writing the old version until the last voter runs the new build,
and then switch by themselves: the gate Nomad puts on a feature until every server
runs a version that has it.

A follower adds to each answer the newest version its build reads (`sd_reads`). The
leader keeps each voter's latest figure and writes the lowest of them and its own,
once it has heard every voter; it adds that figure to each append (`sd_writes`), and
a follower proposes at the last figure a leader told it. A node that knows neither
writes `floor`, which every build that may share the cluster reads. A figure is kept,
not aged: a voter that is down still replays what is written meanwhile when it comes
back, so it counts at the version it last said it reads. Going back to an older build
works only while the cluster still writes a version that build reads
(docs/operations.md, "Upgrading node by node")."""
from __future__ import annotations

from typing import Any, Callable, Collection

READS = "sd_reads"
WRITES = "sd_writes"


class EntryVersions:
    def __init__(self, newest: int, floor: int, voters: int, is_leader: Callable[[], bool]) -> None:
        self.newest = newest
        self._floor = floor
        self._voters = voters
        self._is_leader = is_leader
        self._heard: dict[Any, int] = {}  # as the leader, by node: the newest version it reads
        self._told: int | None = None  # as a follower: the version the leader's latest append said to write

    def answer_fields(self) -> dict[str, Any]:
        return {READS: self.newest}

    def append_fields(self) -> dict[str, Any]:
        return {WRITES: self.writes()}

    def heard_answer(self, node: Any, message: dict[str, Any]) -> None:
        reads = message.get(READS)
        if isinstance(reads, int):
            self._heard[node] = reads

    def heard_append(self, message: dict[str, Any]) -> None:
        writes = message.get(WRITES)
        if isinstance(writes, int):
            self._told = writes

    def writes(self) -> int:
        """The version to write an entry at now. On a leader that has heard every other
        voter: the lowest version any of them reads, ours included. Otherwise (a
        follower, or a new leader still waiting for an answer) what the last leader
        told us, never above what we read; with nothing told, the floor."""
        if self._is_leader() and len(self._heard) >= self._voters - 1:
            lowest = min([self.newest, *self._heard.values()])
        elif self._told is not None:
            lowest = min(self.newest, self._told)
        else:
            lowest = self._floor
        return max(self._floor, lowest)

    def members_changed(self, others: Collection[Any]) -> None:
        """The group's members changed (tick thread): count these other voters from now on."""
        self._voters = 1 + len(others)
        self._heard = {node: reads for node, reads in list(self._heard.items()) if node in others}

    def peers_read(self) -> dict[str, int]:
        """The newest version each other voter said it reads, by address (a leader hears them)."""
        return {node.address: reads for node, reads in list(self._heard.items())}
