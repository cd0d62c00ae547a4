"""What the client and the worker SDK share about talking to a node: how an answer
that is not a success becomes a typed error, how long to pause before trying again,
which of the cluster's nodes serve, and the server's limits they size their batches by."""
from __future__ import annotations

import json
import random
from typing import Any, Iterator

from schedulerd.errors import SchedulerError, Unavailable, from_wire
from schedulerd.limits import Limits

# The server's default limits. A node run with smaller ones (--limit) answers a batch
# over them with a 400 naming the limit.
SERVER_LIMITS = Limits()
# Pause before the next round over the nodes: doubles from the first to the cap, each
# drawn from its upper half so clients that lost the same leader do not return as one.
BACKOFF_S_FIRST = 0.05
BACKOFF_S_MAX = 1.0
# How much of an unexpected (non-JSON) body goes into an error's message.
ERROR_TEXT_CHARS_MAX = 200


# A client or worker reads the cluster's nodes (`GET /v1/cluster`) at most this often.
MEMBERS_EVERY_S = 30.0


def serving_urls(cluster: Any, scheme: str) -> list[str] | None:
    """The base URLs of the nodes a `/v1/cluster` answer lists as serving (alive or
    suspect), sorted; None when the answer says nothing of its nodes."""
    nodes = cluster.get("nodes") if isinstance(cluster, dict) else None
    if not isinstance(nodes, list):
        return None
    return sorted({f"{scheme}://{n['http']}" for n in nodes if isinstance(n, dict)
                   and n.get("state") in ("alive", "suspect") and isinstance(n.get("http"), str) and n["http"]})


def backoff_s() -> Iterator[float]:
    """The pauses between attempts: exponential, capped, jittered."""
    ceiling_s = BACKOFF_S_FIRST
    while True:
        yield random.uniform(ceiling_s / 2, ceiling_s)
        ceiling_s = min(ceiling_s * 2, BACKOFF_S_MAX)


def short_text(body: bytes) -> str:
    text = " ".join(body.decode("utf-8", "replace").split())
    return text[:ERROR_TEXT_CHARS_MAX] or "(empty body)"


def wire_error(body: bytes) -> tuple[str, str] | None:
    """The (code, message) of a node's error body, or None if it is not one."""
    try:
        error = json.loads(body)["error"]
        return str(error["code"]), str(error["message"])
    except (ValueError, TypeError, KeyError):
        return None


def error_from(status: int, body: bytes, where: str = "") -> SchedulerError:
    """The typed error of an answer that is not a success: a 4xx's own class and message;
    a 503's Unavailable (its own class when that is one); anything else (a 500, a proxy's
    page) a SchedulerError naming the status. `where` leads the message."""
    prefix = f"{where}: " if where else ""
    error = wire_error(body)
    if error is not None and (400 <= status < 500 or status == 503):
        exc = from_wire(error[0], prefix + error[1])
        return exc if status != 503 or isinstance(exc, Unavailable) else Unavailable(exc.message)
    detail = error[1] if error is not None else short_text(body)
    return (Unavailable if status == 503 else SchedulerError)(f"{prefix}HTTP {status}: {detail}")
