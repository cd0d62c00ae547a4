"""What time the cluster agrees it is, measured on Raft's own traffic.

A replica stamps its proposals with its own clock; a node whose clock runs ahead of the
others would lease runs before their time. The leader therefore estimates the voters'
clocks and stamps time-bearing entries with the median of them, which one skewed node
(the leader included) cannot move away from the others.

A follower adds its clock, f, to each answer it sends the leader (`sd_clock`). When the
answer arrives, the follower's clock reads at least f, whatever the network did; from
then on it reads at least f plus the time elapsed since, which the leader counts on its
monotonic clock, so a jump of the leader's own wall clock does not move its estimates
of the others. The leader adds the median it computes to each append it sends
(`sd_cluster_clock`), which a follower ages the same way: every node then knows the
cluster's time, to judge when to ask for what the leader will stamp. Every estimate
errs behind the clock it estimates (by a message's transit), never ahead. Both ride on
pysyncobj's messages (raft/riders.py); a node of an older build sends none and counts
as unmeasured."""
from __future__ import annotations

import time
from typing import Any, Callable, Collection

from schedulerd.units import US_PER_S

CLOCK = "sd_clock"
CLUSTER_CLOCK = "sd_cluster_clock"


class PeerClocks:
    def __init__(self, now_us: Callable[[], int], voters: int, fresh_s: float, is_leader: Callable[[], bool]) -> None:
        self._now_us = now_us
        self._voters = voters
        self._fresh_s = fresh_s
        self._is_leader = is_leader
        # As the leader, by node: (the clock a follower answered with in µs, our monotonic s on receipt).
        self._heard: dict[Any, tuple[int, float]] = {}
        # As a follower: (the cluster's time in the leader's latest append, our monotonic s on receipt).
        self._told: tuple[int, float] | None = None

    def answer_fields(self) -> dict[str, Any]:
        return {CLOCK: self._now_us()}

    def append_fields(self) -> dict[str, Any]:
        return {CLUSTER_CLOCK: self.cluster_now_us()}

    def heard_answer(self, node: Any, message: dict[str, Any]) -> None:
        if CLOCK in message:
            self._heard[node] = (message[CLOCK], time.monotonic())

    def heard_append(self, message: dict[str, Any]) -> None:
        if CLUSTER_CLOCK in message:
            self._told = (message[CLUSTER_CLOCK], time.monotonic())

    def members_changed(self, others: Collection[Any]) -> None:
        """The group's members changed (tick thread): count these other voters from now on."""
        self._voters = 1 + len(others)
        self._heard = {node: heard for node, heard in list(self._heard.items()) if node in others}

    def clocks_us(self) -> dict[str, int]:
        """Lower bounds of the other voters' clocks now, by address, heard within fresh_s
        (only a leader hears them)."""
        mono = time.monotonic()
        # A copy first: the tick thread adds to it while /v1/cluster reads it.
        aged = {node.address: self._aged(heard, mono) for node, heard in list(self._heard.items())}
        return {address: clock for address, clock in aged.items() if clock is not None}

    def offsets_us(self) -> dict[str, int]:
        """How far each measured voter's clock is at least ahead of ours (negative: behind)."""
        now = self._now_us()
        return {address: clock - now for address, clock in self.clocks_us().items()}

    def cluster_now_us(self) -> int:
        """The cluster's time, never past it. On the leader, a lower bound of the voters'
        median clock: ours, and each measured voter at the lowest its clock can be, with
        any unmeasured voter counted as the slowest of all. On a follower, and on a
        leader that has measured fewer than a majority (its first heartbeat round, or
        followers of an older build): the last leader's figure, aged since, or without a
        fresh one our own clock."""
        now = self._now_us()
        if self._is_leader():
            known = sorted([now, *self.clocks_us().values()])
            unknown = self._voters - len(known)
            median_rank = (self._voters + 1) // 2 - unknown  # 1-based, among the known, with the unknown below
            if median_rank >= 1:
                return known[median_rank - 1]
        told = None if self._told is None else self._aged(self._told, time.monotonic())
        return now if told is None else told

    def _aged(self, heard: tuple[int, float], mono: float) -> int | None:
        """A clock heard at monotonic time `at`, as it reads at least at `mono`; None once
        older than fresh_s."""
        clock, at = heard
        return clock + int((mono - at) * US_PER_S) if mono - at <= self._fresh_s else None
