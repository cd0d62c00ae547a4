"""Namespaces: jobs, their runs and their queues belong to one (`default` unless
the request says otherwise with the `X-Namespace` header).

Storage knows nothing of them: a job `nightly` in namespace `payments` is stored
as `payments/nightly`, its queue `q` as `payments/q` (ids and queue names never
hold a `/`, so the split is unambiguous); the default namespace keeps bare names.
The API translates both ways here. A token limited to some namespaces gets 404
for every other one, exactly as for a name that does not exist: it cannot even
learn which jobs exist elsewhere."""
from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from schedulerd import auth
from schedulerd.errors import InvalidRequest, NotFound

DEFAULT = "default"
HEADER = "X-Namespace"
NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}\Z")
SEP = "/"


def of_request(request: web.Request) -> str:
    """The request's namespace, if its caller may use it (else 404, as for a missing one)."""
    namespace = request.headers.get(HEADER, DEFAULT)
    if not NAME_RE.match(namespace):
        raise InvalidRequest(f"{HEADER} must be 1-64 characters of A-Z a-z 0-9 _ . -")
    principal = request.get(auth.PRINCIPAL)
    if isinstance(principal, auth.Principal) and not principal.may_use(namespace):
        if HEADER not in request.headers:  # the token's own namespaces are no secret to its holder
            raise NotFound(f"this token may not use the {DEFAULT!r} namespace, which a request without an {HEADER} "
                           f"header is in: send {HEADER} with one of {', '.join(sorted(principal.namespaces))}")
        raise NotFound(f"no namespace {namespace!r}")
    return namespace


def inside(namespace: str, name: str) -> str:
    """The stored form of a job id or queue name of this namespace. A name holding the
    separator is refused: `payments/nightly` asked for in the default namespace would
    otherwise be namespace payments' job."""
    if SEP in name:
        raise InvalidRequest(f"{name!r}: job ids and queue names never hold {SEP!r}")
    return name if namespace == DEFAULT else f"{namespace}{SEP}{name}"


def key_inside(namespace: str, key: str) -> str:
    """The stored form of an idempotency key, which may hold the separator: the default
    namespace keeps a key without one bare (as stored before namespaces), and prefixes
    one with it, so no two namespaces' keys can meet."""
    return key if namespace == DEFAULT and SEP not in key else f"{namespace}{SEP}{key}"


def split(stored: str) -> tuple[str, str]:
    """(namespace, name) of a stored job id or queue name."""
    namespace, sep, name = stored.partition(SEP)
    return (namespace, name) if sep else (DEFAULT, stored)


def holds(namespace: str, stored: str) -> bool:
    """Whether a stored job id or queue name belongs to this namespace."""
    return split(stored)[0] == namespace


def outward(view: dict[str, Any]) -> dict[str, Any]:
    """A job/run/task view with its namespace split off its job id and queue."""
    namespace, job_id = split(view["job_id"])
    view = dict(view, job_id=job_id, namespace=namespace)
    if "queue" in view and view["queue"] is not None:
        view["queue"] = split(view["queue"])[1]
    return view
