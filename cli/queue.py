"""`schedctl queue set|get|list`: a queue's limits, enforced by the cluster as it leases, and
what waits and runs in each queue."""
from __future__ import annotations

from typing import Any, Mapping

import click

from schedulerd.cli.output import format_fields, format_table
from schedulerd.cli.session import OneLineGroup, Session

NONE = "none"  # lifts a limit


@click.group(cls=OneLineGroup)
def queue() -> None:
    """Queue limits: at most N runs of a queue leased at once (max_running), at most R leases
    of it granted per second (max_starts_per_s), cluster-wide. The nodes enforce them as they
    grant leases, whichever worker asks: a fleet that scaled out cannot overrun what the queue's
    runs call.

    \b
    Examples:
        schedctl queue set payments --max-running 20 --max-starts-per-s 50
        schedctl queue get payments
    """


def _parsed(value: str, kind: type[int] | type[float], flag: str) -> int | float | None:
    """A limit as given: a number of `kind`, or `none` (None: lifted)."""
    if value == NONE:
        return None
    try:
        return kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise click.BadParameter(f"{value!r} is not {what} or {NONE!r}", param_hint=f"'{flag}'") from None


@queue.command("set")
@click.argument("name")
@click.option("--max-running", metavar="N|none", help="At most N runs of the queue leased at once; none lifts it.")
@click.option("--max-starts-per-s", metavar="R|none",
              help="At most R leases of the queue granted per second (a second's worth may start at once); "
                   "none lifts it.")
@click.pass_obj
def set_limits(session: Session, name: str, max_running: str | None, max_starts_per_s: str | None) -> None:
    """Set the limits of queue NAME (in the namespace of --namespace). A limit not given keeps
    its value; `none` lifts it. The cluster divides each limit among its groups (`queue get`
    shows the shares).

    \b
    Examples:
        schedctl queue set payments --max-running 20
        schedctl queue set payments --max-starts-per-s 5.5 --max-running none
    """
    if max_running is None and max_starts_per_s is None:
        raise click.UsageError("give --max-running or --max-starts-per-s (or both)")
    given = {**({"max_running": _parsed(max_running, int, "--max-running")} if max_running is not None else {}),
             **({"max_starts_per_s": _parsed(max_starts_per_s, float, "--max-starts-per-s")}
                if max_starts_per_s is not None else {})}
    limits = {**(session.client.get_queue(name) if len(given) < 2 else {}), **given}
    running, rate = limits["max_running"], limits["max_starts_per_s"]
    session.show(session.client.set_queue_limits(name, running, rate), queue_text)


@queue.command("get")
@click.argument("name")
@click.pass_obj
def get_queue(session: Session, name: str) -> None:
    """Show queue NAME: its limits, each group's share of them, and its runs ready, waiting
    and running.

    \b
    Example:
        schedctl queue get payments
    """
    session.show(session.client.get_queue(name), queue_text)


@queue.command("list")
@click.pass_obj
def list_queues(session: Session) -> None:
    """Every queue with runs or limits: ready, waiting, running, and the limits.

    \b
    Example:
        schedctl queue list
    """
    session.show(session.client.queues(), lambda document: format_table(
        ("QUEUE", "NAMESPACE", "READY", "WAITING", "RUNNING", "MAX RUNNING", "MAX STARTS/S"),
        [(q["queue"], q["namespace"], q["ready"], q["waiting"], q["running"], _limit(q["max_running"]),
          _limit(q["max_starts_per_s"])) for q in document["queues"]]))


def _limit(value: Any) -> str:
    return "-" if value is None else f"{value:g}"


def queue_text(document: Mapping[str, Any]) -> str:
    fields: dict[str, Any] = {"queue": document["queue"], "namespace": document["namespace"],
                              "max_running": _limit(document["max_running"]),
                              "max_starts_per_s": _limit(document["max_starts_per_s"]),
                              "running": document["running"], "ready": document["ready"],
                              "waiting": document["waiting"]}
    shares = document.get("max_running_per_group")
    if shares is not None:
        fields["max_running_per_group"] = ", ".join(map(str, shares))
    if document.get("max_starts_per_s_per_group") is not None:
        fields["max_starts_per_s_per_group"] = f"{document['max_starts_per_s_per_group']:g}"
    if document.get("updated_at"):
        fields["updated_at"] = document["updated_at"]
    return format_fields(fields)
