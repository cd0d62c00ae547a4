"""Who may call what: bearer tokens with scopes, from a tokens file.

The file (YAML or JSON) holds only SHA-256 hashes of the tokens, never the
tokens: a stolen file grants nothing. Tokens are 256-bit random strings made by
`schedulerd token create`, so a fast hash is enough (no password to stretch).
The node re-reads the file on SIGHUP; a file that fails to load leaves the
previous tokens in force.

    tokens:
      - name: ci-deploys
        sha256: 5e88...            # of the token
        scopes: [scheduler]
        namespaces: [payments]     # optional; default: every namespace

Scopes: `admin` (everything, cluster operations, the audit log), `scheduler`
(create and manage jobs, and read), `worker` (poll, heartbeat, ack, nack only),
`read` (GET only)."""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from dataclasses import dataclass
from typing import Any

import yaml
from aiohttp import web

from schedulerd import strict_yaml
from schedulerd.errors import Forbidden, Unauthorized

log = logging.getLogger("schedulerd.auth")

SCOPES = ("admin", "scheduler", "worker", "read")
ALL_NAMESPACES = "*"
TOKEN_BYTES = 32


@dataclass(frozen=True)
class Principal:
    """The caller, as the token file names it."""

    name: str
    scopes: frozenset[str]
    namespaces: frozenset[str]  # {"*"}: all

    def may_use(self, namespace: str) -> bool:
        return ALL_NAMESPACES in self.namespaces or namespace in self.namespaces

    def may_use_all(self) -> bool:
        return ALL_NAMESPACES in self.namespaces


OPEN = Principal("anonymous (auth off)", frozenset({"admin"}), frozenset({ALL_NAMESPACES}))
# Who made the request (None on routes that need no token), set by the auth middleware.
PRINCIPAL = web.RequestKey("principal", object)


def may_manage_jobs(request: web.Request) -> bool:
    """Whether the caller could create and change jobs (and so set what a job's view holds)."""
    principal = request.get(PRINCIPAL)
    return not isinstance(principal, Principal) or bool(principal.scopes & {"admin", "scheduler"})


def audit_note(request: web.Request, what: str, **extra: Any) -> dict[str, Any]:
    """The `audit` field of a command proposed for this request (storage/audit.py)."""
    principal = request.get(PRINCIPAL)
    who = principal.name if isinstance(principal, Principal) else "anonymous"
    return {"who": who, "what": what, "via": f"{request.method} {request.path}", **extra}


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "sdt_" + secrets.token_urlsafe(TOKEN_BYTES)


def required_scopes(method: str, route: str) -> frozenset[str] | None:
    """The scopes any one of which allows the call; None: no token needed."""
    if route in ("/healthz", "/readyz", "/ui", "/v1/openapi.json") \
            or route == "/v1/cluster/nodes/{node_id}" and method in ("GET", "HEAD"):
        return None
    if route == "/v1/audit" or route.startswith("/v1/cluster/nodes") and method not in ("GET", "HEAD"):
        return frozenset({"admin"})
    if route.startswith("/v1/tasks/"):
        return frozenset({"admin", "worker"})
    if route == "/v1/cluster" and method in ("GET", "HEAD"):  # workers follow the nodes from it
        return frozenset({"admin", "scheduler", "read", "worker"})
    if method in ("GET", "HEAD"):
        return frozenset({"admin", "scheduler", "read"})
    return frozenset({"admin", "scheduler"})


class TokenFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self._by_hash: dict[str, Principal] = {}
        self.load()

    def load(self) -> int:
        """(Re)read the file; raises ValueError naming the problem (the old tokens stay)."""
        try:
            with open(self.path, encoding="utf-8") as f:
                data = strict_yaml.load(f)
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"tokens file {self.path}: {exc}") from None
        entries = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise ValueError(f"tokens file {self.path}: expected a top-level 'tokens:' list")
        by_hash = {}
        for i, entry in enumerate(entries):
            principal, digest = _entry(entry, f"{self.path}: tokens[{i}]")
            by_hash[digest] = principal
        self._by_hash = by_hash
        return len(by_hash)

    def reload(self) -> None:
        try:
            count = self.load()
        except ValueError as exc:
            log.error("tokens_reload_failed error=%s; the previous tokens stay in force", exc)
            return
        log.info("tokens_reloaded path=%s tokens=%d", self.path, count)

    def authenticate(self, header: str | None) -> Principal:
        if not header or not header.startswith("Bearer "):
            raise Unauthorized("send 'Authorization: Bearer <token>' (schedctl --token, SCHEDCTL_TOKEN)")
        digest = hash_token(header[len("Bearer "):].strip())
        found = None
        # Compare with every entry, in constant time each: the time taken says nothing
        # about which entry (or how much of one) matched.
        for candidate, principal in self._by_hash.items():
            if hmac.compare_digest(candidate, digest):
                found = principal
        if found is None:
            raise Unauthorized("the token is not valid (revoked, mistyped, or for another cluster)")
        return found


# Routes whose answer names jobs or queues of every namespace: a token limited to some
# namespaces would learn of the others' there.
CLUSTER_WIDE_ROUTES = frozenset({"/v1/audit", "/metrics"})
# Routes that change what jobs of every namespace do: a calendar is the whole cluster's.
CLUSTER_WIDE_WRITES = frozenset({"/v1/calendars/{name}"})


def authorize(principal: Principal, method: str, route: str) -> None:
    needed = required_scopes(method, route)
    if needed is None:
        return
    if (route in CLUSTER_WIDE_ROUTES or route in CLUSTER_WIDE_WRITES and method not in ("GET", "HEAD")) \
            and not principal.may_use_all():
        raise Forbidden(f"{method} {route} spans every namespace; token {principal.name!r} is limited to "
                        f"{', '.join(sorted(principal.namespaces))}")
    if principal.scopes & needed:
        return
    raise Forbidden(f"{method} {route} needs scope {' or '.join(s for s in SCOPES if s in needed)}; "
                    f"token {principal.name!r} has {', '.join(sorted(principal.scopes))}")


def _entry(entry: Any, where: str) -> tuple[Principal, str]:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a mapping with name, sha256, scopes")
    name, digest, scopes = entry.get("name"), entry.get("sha256"), entry.get("scopes")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: name must be a non-empty string")
    if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"{where} ({name}): sha256 must be 64 lowercase hex digits (the token's hash)")
    if not isinstance(scopes, list) or not scopes or any(s not in SCOPES for s in scopes):
        raise ValueError(f"{where} ({name}): scopes must be a non-empty list of {', '.join(SCOPES)}")
    namespaces = entry.get("namespaces", [ALL_NAMESPACES])
    if not isinstance(namespaces, list) or not namespaces or not all(isinstance(n, str) for n in namespaces):
        raise ValueError(f"{where} ({name}): namespaces must be a non-empty list of names (or ['*'])")
    return Principal(name, frozenset(scopes), frozenset(namespaces)), digest


def add_token(path: str, name: str, scopes: list[str], namespaces: list[str]) -> str:
    """Append a new token's hash to the file (created 0600 if missing); returns the token."""
    data: dict[str, Any] = {"tokens": []}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            data = strict_yaml.load(f) or {"tokens": []}
    if any(e.get("name") == name for e in data.get("tokens", [])):
        raise ValueError(f"{path} already has a token named {name!r}")
    token = new_token()
    entry: dict[str, Any] = {"name": name, "sha256": hash_token(token), "scopes": scopes}
    if namespaces != [ALL_NAMESPACES]:
        entry["namespaces"] = namespaces
    data.setdefault("tokens", []).append(entry)
    _entry(entry, path)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    os.replace(tmp, path)
    return token
