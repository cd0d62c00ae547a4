"""Workloads as data, the same for every system under test.

A `OneOff` plan is `count` one-off jobs, job k due at `t0 + k * spacing_s`
(spacing 0 = all due at the same instant: the spike), each created no earlier
than `lead_s` before its due time (a steady stream of creates, as in real use),
or all at once when the lead covers the whole plan. It is JSON-serializable so
a peer process (APScheduler) can run the same plan itself.

A plan may hold a backlog for the retention bench: its first `backlog_count` jobs
carry a `finished_ttl_s` that makes them all expire together at `backlog_expire_at`
(schedulerd only: the peers ignore it)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class OneOff:
    prefix: str  # job ids are f"{prefix}-{k}"; distinct per run so records never mix
    t0: float  # epoch seconds, due time of job 0
    count: int
    spacing_s: float
    lead_s: float
    backlog_count: int = 0
    backlog_expire_at: float = 0.0

    def due(self, k: int) -> float:
        return self.t0 + k * self.spacing_s

    def submit_at(self, k: int) -> float:
        return self.due(k) - self.lead_s

    def job_id(self, k: int) -> str:
        return f"{self.prefix}-{k}"

    def fields(self, k: int) -> dict[str, Any]:
        """Job k's fields beside its id and schedule."""
        if k >= self.backlog_count:
            return {}
        return {"finished_ttl_s": max(1, math.ceil(self.backlog_expire_at - self.due(k)))}

    def with_backlog(self, backlog_s: float, expire_after_s: float) -> "OneOff":
        """The jobs due in the first backlog_s seconds all expire expire_after_s after t0."""
        if backlog_s <= 0:
            return self
        count = min(self.count, math.ceil(backlog_s / self.spacing_s)) if self.spacing_s else self.count
        return replace(self, backlog_count=count, backlog_expire_at=self.t0 + expire_after_s)

    @property
    def last_due(self) -> float:
        return self.due(max(0, self.count - 1))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def steady(cls, prefix: str, start_in_s: float, rate_per_s: float, duration_s: float, lead_s: float,
               now: float) -> "OneOff":
        return cls(prefix, now + start_in_s, max(1, round(rate_per_s * duration_s)), 1.0 / rate_per_s, lead_s)

    @classmethod
    def spike(cls, prefix: str, due_in_s: float, count: int, now: float) -> "OneOff":
        return cls(prefix, now + due_in_s, count, 0.0, due_in_s + 1.0)
