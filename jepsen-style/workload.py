"""Client threads: one-off jobs due within 1-10 s, a few every-second jobs and
some cancels, each request recorded in the history with its node, send and
answer times and outcome (ok / fail / unknown).

Choices (due offsets, pauses, which jobs to cancel and when, which node to ask
first) come from a per-thread Random seeded from the run seed, drawn the same
way whatever the timing, so a rerun with the same seed makes the same choices."""
from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable

from schedulerd.storage.keys import shard_of

import wire
from history import History

QUEUE = "jepsen"
CREATE_ATTEMPTS = 4  # one key, up to this many tries on timeout / 503 / connection error
REQUEST_TIMEOUT_S = 8.0  # above the daemon's 5 s propose timeout, so its own 503 usually wins
DUE_S_MIN, DUE_S_MAX = 1.0, 10.0
PAUSE_S_MIN, PAUSE_S_MAX = 0.25, 0.6
CANCEL_P = 0.08
RECURRING = 3
# Fast retries: a run redelivered after a lost lease should not wait minutes.
BACKOFF = {"base_ms": 200, "factor": 1.5, "max_ms": 2000}
MAX_ATTEMPTS = 100  # deliveries before dead letter: faults must not exhaust them
SLOW_NODE_S = 10.0  # how long a node whose request timed out is tried last
PROBE_ATTEMPTS = 2  # a probe retries its key on its own node only
PROBE_TIMEOUT_S = 3.0  # probes measure availability: they give up on a frozen node sooner
PROBE_PAUSE_S = (0.8, 1.2)  # about one write per node per second: a signal, not load


def job_body(schedule: dict[str, Any], key: str, **extra: Any) -> dict[str, Any]:
    return {"schedule": schedule, "queue": QUEUE, "payload": {"key": key}, "max_attempts": MAX_ATTEMPTS,
            "backoff": BACKOFF, **extra}


class Workload:
    def __init__(self, urls: list[str], history: History, seed: int, threads: int,
                 incarnation: Callable[[int], int], groups: int) -> None:
        self.urls, self.history, self.seed, self.threads = urls, history, seed, threads
        self.groups = groups
        self.incarnation = incarnation  # node index -> restart counter (see cancel())
        self.stop_event = threading.Event()
        self._threads: list[threading.Thread] = []
        # node -> time until which it counts as hung (a request to it timed out): like
        # any client library, try the others first rather than wait on a frozen node again.
        self._slow_until: dict[int, float] = {}
        self.recurring: list[str] = []

    # -- operations -------------------------------------------------------

    def _pick(self, first: int, tried: list[int]) -> int:
        """The next node to try: in rotation from the seeded first one, untried ones
        before tried ones, hung ones last."""
        now = time.time()
        rotation = [(first + k) % len(self.urls) for k in range(len(self.urls))]
        node = min(rotation, key=lambda n: (tried.count(n), self._slow_until.get(n, 0.0) > now))
        tried.append(node)
        return node

    def _note(self, node: int, reply: wire.Reply) -> None:
        if reply.status is None and reply.connected:
            self._slow_until[node] = time.time() + SLOW_NODE_S

    def create(self, key: str, body: dict[str, Any], first_node: int, kind: str,
               pinned: bool = False) -> dict[str, Any]:
        """POST /v1/jobs with one Idempotency-Key, retried (on another node, unless
        pinned) while the outcome is not ok. Records every attempt and the result."""
        replies: list[wire.Reply] = []
        tried: list[int] = []
        for attempt in range(PROBE_ATTEMPTS if pinned else CREATE_ATTEMPTS):
            node = first_node if pinned else self._pick(first_node, tried)
            reply = wire.request("POST", self.urls[node] + "/v1/jobs", body, {"Idempotency-Key": key},
                                 timeout_s=PROBE_TIMEOUT_S if pinned else REQUEST_TIMEOUT_S)
            self._note(node, reply)
            job_id = reply.body.get("job_id") if reply.outcome == wire.OK else None
            self.history.add("create_attempt", key=key, node=node, attempt=attempt, sent=reply.sent,
                             done=reply.done, status=reply.status, error=reply.error, outcome=reply.outcome,
                             job_id=job_id)
            replies.append(reply)
            if reply.outcome == wire.OK or (reply.status is not None and 400 <= reply.status < 500):
                break
            time.sleep(0.3 * (attempt + 1))
        ok = next((r for r in replies if r.outcome == wire.OK), None)
        result = "ok" if ok else ("unknown" if any(r.outcome == wire.UNKNOWN for r in replies) else "failed")
        return self.history.add("create", key=key, kind=kind, schedule=body["schedule"], result=result,
                                job_id=ok.body.get("job_id") if ok else None,
                                ok_status=ok.status if ok else None,
                                prior_outcomes=[r.outcome for r in replies[:-1]] if ok else None,
                                sent=replies[0].sent, done=replies[-1].done, attempts=len(replies))

    def cancel(self, job_id: str, first_node: int, tries: int = CREATE_ATTEMPTS) -> dict[str, Any]:
        """DELETE the job (idempotent, so retried like a create). On success, read the
        answering node's last_applied at once: it is at least the cancel's Raft index
        (the node applied the cancel before answering) — unless the node restarted in
        between, which the incarnation check rules out."""
        reply, node = None, first_node
        tried: list[int] = []
        for attempt in range(tries):
            node = self._pick(first_node, tried)
            before = self.incarnation(node)
            reply = wire.request("DELETE", f"{self.urls[node]}/v1/jobs/{job_id}", timeout_s=REQUEST_TIMEOUT_S)
            self._note(node, reply)
            self.history.add("cancel_attempt", job_id=job_id, node=node, sent=reply.sent, done=reply.done,
                             status=reply.status, error=reply.error, outcome=reply.outcome)
            if reply.outcome == wire.OK:
                return self.history.add("cancel", job_id=job_id, result="ok", node=node, ack=reply.done,
                                        applied_hi=self._applied_after(node, before, job_id))
            if reply.status is not None and 400 <= reply.status < 500:
                break
            time.sleep(0.3 * (attempt + 1))
        outcome = reply.outcome if reply else wire.FAIL
        return self.history.add("cancel", job_id=job_id, result="unknown" if outcome != wire.FAIL else "failed",
                                node=node, ack=None, applied_hi=None,
                                status=reply.status if reply else None)

    def _applied_after(self, node: int, incarnation: int, job_id: str) -> int | None:
        """The answering node's last_applied in the job's group (its own index space), or
        None when the node holds no replica of that group (it forwarded the cancel)."""
        reply = wire.request("GET", self.urls[node] + "/v1/cluster", timeout_s=3.0)
        if reply.status != 200 or self.incarnation(node) != incarnation:
            return None
        group = shard_of(job_id) % self.groups
        held = [g for g in reply.body.get("groups") or [] if g.get("group") == group]
        return int(held[0]["last_applied"]) if held else None

    # -- threads ----------------------------------------------------------

    def start(self) -> None:
        targets = [(self._client, i, f"client-{i}") for i in range(self.threads)]
        targets += [(self._probe, i, f"probe-{i}") for i in range(len(self.urls))]
        for fn, i, name in targets:
            t = threading.Thread(target=fn, args=(i,), name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _probe(self, node: int) -> None:
        """A client bound to one node, Jepsen-style, with a short timeout: when the
        leader is lost, the probes on healthy nodes show when writes work again
        (roaming clients may all be waiting on the frozen node at that moment)."""
        rng = random.Random(f"{self.seed}:probe:{node}")
        n = 0
        while not self.stop_event.is_set():
            n += 1
            due_s, pause_s = rng.uniform(DUE_S_MIN, DUE_S_MAX), rng.uniform(*PROBE_PAUSE_S)
            key = f"s{self.seed}-p{node}-{n}"
            at_us = int((time.time() + due_s) * 1_000_000)
            self.create(key, job_body({"at": wire.iso_us(at_us)}, key), node, "once", pinned=True)
            self.stop_event.wait(pause_s)

    def stop(self, timeout_s: float = 60.0) -> None:
        self.stop_event.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.1, deadline - time.monotonic()))

    def _client(self, idx: int) -> None:
        rng = random.Random(f"{self.seed}:client:{idx}")
        pending: list[tuple[float, str, int]] = []  # (when, job_id, node) cancels to send
        n = 0
        while not self.stop_event.is_set():
            n += 1
            # Draw everything every round, whatever happens: the sequence stays seed-determined.
            due_s, pause_s = rng.uniform(DUE_S_MIN, DUE_S_MAX), rng.uniform(PAUSE_S_MIN, PAUSE_S_MAX)
            cancel, cancel_after_s = rng.random() < CANCEL_P, rng.uniform(0.0, due_s + 1.0)
            first = rng.randrange(len(self.urls))
            key = f"s{self.seed}-c{idx}-{n}"
            at_us = int((time.time() + due_s) * 1_000_000)
            result = self.create(key, job_body({"at": wire.iso_us(at_us)}, key), first, "once")
            if cancel and result["result"] == "ok":
                # Some land before the due time, some race it, some come after it ran.
                pending.append((time.time() + cancel_after_s, result["job_id"], first))
            for item in [p for p in pending if p[0] <= time.time()]:
                pending.remove(item)
                self.cancel(item[1], item[2])
            self.stop_event.wait(pause_s)
        for _, job_id, node in pending:  # cancels promised before the stop still go out
            self.cancel(job_id, node)

    def create_recurring(self) -> None:
        for i in range(RECURRING):
            key = f"s{self.seed}-rec-{i}"
            # history_limit at its maximum: the checkers read every run of the job back.
            body = job_body({"every": "1s"}, key, history_limit=10_000)
            deadline = time.monotonic() + 60
            # Retried with the same key until it is known: a job that exists but is not
            # known here would never be cancelled and keep the cluster from going quiet.
            while True:
                result = self.create(key, body, i % len(self.urls), "recurring")
                if result["result"] == "ok":
                    self.recurring.append(result["job_id"])
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not create recurring job {key}: {result}")

    def cancel_recurring(self, deadline_s: float) -> None:
        """Stop the every-second jobs so the cluster can go quiet (convergence)."""
        deadline = time.monotonic() + deadline_s
        for job_id in self.recurring:
            while time.monotonic() < deadline:
                if self.cancel(job_id, 0, tries=len(self.urls))["result"] == "ok":
                    break
                time.sleep(1.0)
