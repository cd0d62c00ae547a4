"""Browser and network exposure: which requests a node takes from a web page.

A node without tokens trusts every caller that can reach it, and a browser tab
can reach a loopback node. Three rules keep a page from driving it:

- the `Host` must be one of the node's own names, so a DNS-rebinding page (its own
  name resolved to 127.0.0.1) is refused on every route, reads included (421);
- a state-changing request whose `Origin` is another site's (or whose
  `Sec-Fetch-Site` says cross-site) is refused (403): the dashboard, served by
  the node, is same-origin; the CLI, the SDK and curl send no `Origin`;
- a body must be declared JSON (415): a page's no-preflight `text/plain` POST
  cannot pass for a job.

Origins named in `allowed_origins` pass the origin rule and get CORS answers
(preflight included), so a web console elsewhere can be let in on purpose."""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from schedulerd.errors import CrossSiteRefused, MisdirectedHost, UnsupportedMediaType

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

JSON_TYPE = "application/json"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ANY_HOST = "*"
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
# What an allowed origin's page may send: the API's own request headers.
CORS_REQUEST_HEADERS = "Authorization, Content-Type, Idempotency-Key, Prefer, X-Namespace"
CORS_MAX_AGE_S = 600


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


def check_host_pattern(pattern: str) -> str:
    """A valid --allowed-hosts entry, lowercased: a name, `.suffix` for its subdomains, an IP, or `*`.
    Raises ValueError naming what is allowed."""
    text = pattern.strip().lower()
    name = text[1:] if text.startswith(".") else text
    if text == ANY_HOST or _ip(text) is not None:
        return text
    labels = name.split(".")
    if not name or len(name) > 253 or not all(label and len(label) <= 63 and label.replace("-", "").isalnum()
                                              for label in labels):
        raise ValueError(f"allowed host {pattern!r} must be a host name, .domain (its subdomains), "
                         "an IP address, or * (any)")
    return text


def check_origin(origin: str) -> str:
    """A valid --allowed-origins entry, normalized: scheme://host[:port] with nothing after it."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.fragment or parts.username:
        raise ValueError(f"allowed origin {origin!r} must be scheme://host[:port], e.g. https://ops.example.com")
    return _normal_origin(parts.scheme, parts.netloc)


def _normal_origin(scheme: str, netloc: str) -> str:
    default_port = {"http": ":80", "https": ":443"}[scheme]
    host = netloc.lower()
    return f"{scheme}://{host[:-len(default_port)] if host.endswith(default_port) else host}"


def _host_name(header: str) -> str:
    """The Host header without its port, lowercased; IPv6 keeps its brackets off."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


@dataclass(frozen=True)
class ExposurePolicy:
    # The address the API is bound to (--http's host).
    bind_host: str
    # Extra names the node answers to (--allowed-hosts); "*" turns the Host check off.
    allowed_hosts: tuple[str, ...] = ()
    # Origins whose pages may change things and read answers (--allowed-origins).
    allowed_origins: tuple[str, ...] = ()
    # The node's own names: localhost, the loopback addresses, the bind address, and the
    # machine's host name and FQDN, looked up once (getfqdn may ask DNS).
    own_names: frozenset[str] = frozenset()

    @classmethod
    def build(cls, bind_host: str, allowed_hosts: tuple[str, ...], allowed_origins: tuple[str, ...]) \
            -> "ExposurePolicy":
        """Validated and normalized; raises ValueError naming the bad entry."""
        own = {"localhost", "127.0.0.1", "::1", bind_host.lower().strip("[]"),
               socket.gethostname().lower(), socket.getfqdn().lower()}
        return cls(bind_host.lower(), tuple(check_host_pattern(h) for h in allowed_hosts),
                   tuple(check_origin(o) for o in allowed_origins), frozenset(own))

    def host_allowed(self, host_header: str | None) -> bool:
        """Whether a request naming this Host is for this node (no Host: not a browser's)."""
        if host_header is None or ANY_HOST in self.allowed_hosts:
            return True
        host = _host_name(host_header)
        if host in self.own_names or host in self.allowed_hosts:
            return True
        if any(p.startswith(".") and (host.endswith(p) or host == p[1:]) for p in self.allowed_hosts):
            return True
        # A rebinding page always comes by a DNS name it controls; on a wildcard bind an IP
        # literal is one of this machine's own addresses, or reaches nothing.
        return self.bind_host.strip("[]") in WILDCARD_BINDS and _ip(host) is not None

    def origin_listed(self, origin: str | None) -> bool:
        return origin is not None and origin.lower() in self.allowed_origins


def own_origin(request: web.Request) -> str:
    return _normal_origin(request.scheme, request.headers.get("Host", ""))


def _refuse_cross_site(policy: ExposurePolicy, request: web.Request) -> None:
    origin = request.headers.get("Origin")
    if policy.origin_listed(origin):
        return
    if origin is not None and origin.lower() != own_origin(request):
        raise CrossSiteRefused(f"{request.method} {request.path} from a page of {origin} is refused: only the "
                               f"node's own origin ({own_origin(request)}) or one listed with --allowed-origins "
                               "may change things from a browser")
    if request.headers.get("Sec-Fetch-Site") == "cross-site":
        raise CrossSiteRefused(f"{request.method} {request.path} from a cross-site page is refused "
                               "(Sec-Fetch-Site: cross-site); list its origin with --allowed-origins to allow it")


def require_json(request: web.Request) -> None:
    """415 unless the body is declared JSON (in UTF-8, if a charset is named)."""
    charset = request.charset
    if request.content_type != JSON_TYPE or (charset is not None and charset.lower() not in ("utf-8", "utf8")):
        declared = request.headers.get("Content-Type", "none")
        raise UnsupportedMediaType(f"Content-Type {declared!r} is not accepted: send the body as "
                                   f"{JSON_TYPE} (UTF-8)")


def _preflight(request: web.Request) -> web.Response | None:
    """The answer to a listed origin's CORS preflight (its origin header is added on prepare);
    None on a path that does not exist, which answers 404 as to anyone."""
    refusal = getattr(request.match_info, "http_exception", None)
    if not isinstance(refusal, web.HTTPMethodNotAllowed):
        return None
    return web.Response(status=204, headers={
        "Access-Control-Allow-Methods": ", ".join(sorted(refusal.allowed_methods - {"HEAD"})),
        "Access-Control-Allow-Headers": CORS_REQUEST_HEADERS, "Access-Control-Max-Age": str(CORS_MAX_AGE_S)})


def middleware(policy: ExposurePolicy) -> Any:
    """Host, then origin, then body type: each refusal happens before auth and changes nothing."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not policy.host_allowed(request.headers.get("Host")):
            raise MisdirectedHost(f"Host {request.headers['Host']!r} is not a name of this node; add it with "
                                  "--allowed-hosts if clients reach the node by it (a DNS-rebinding page "
                                  "comes this way)")
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers \
                and policy.origin_listed(request.headers.get("Origin")):
            preflight = _preflight(request)
            if preflight is not None:
                return preflight
        if request.method not in SAFE_METHODS:
            _refuse_cross_site(policy, request)
            if request.body_exists:
                require_json(request)
        return await handler(request)

    return check


def cors_on_prepare(policy: ExposurePolicy) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """Every answer to a listed origin, errors included, carries the CORS headers its page needs to read it."""

    async def add(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if policy.origin_listed(origin):
            response.headers["Access-Control-Allow-Origin"] = origin or ""
            response.headers["Vary"] = "Origin"

    return add
