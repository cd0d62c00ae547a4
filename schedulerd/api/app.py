"""The aiohttp application: its middlewares (errors, metrics, browser exposure, auth),
the state its handlers share, and the routes of api/routes.py."""
from __future__ import annotations

import logging
from importlib.metadata import version
from typing import Any

from aiohttp import web

from schedulerd import auth, views
from schedulerd.api import exposure, forward, inputs, jobs, openapi, routes, tasks
from schedulerd.api.keys import COMMITS, CREATES, LEASES, METRICS, NODE, SPEC
from schedulerd.api.routes import Handler
from schedulerd.auth import TokenFile
from schedulerd.errors import SchedulerError, status_of
from schedulerd.lease_queue import LeaseQueue
from schedulerd.limits import Limits
from schedulerd.metrics import Metrics
from schedulerd.node import Node

log = logging.getLogger("schedulerd.api")

RETRY_AFTER_S = "1"


def error_response(status: int, code: str, message: str) -> web.Response:
    resp = views.respond({"error": {"code": code, "message": message}}, status=status)
    if status == 503:
        resp.headers["Retry-After"] = RETRY_AFTER_S
    if status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="schedulerd"'
    return resp


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except SchedulerError as exc:
        return error_response(status_of(exc), exc.code, exc.message)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(413, "too_large", f"request body is too large: {exc.text}")
    except web.HTTPNotFound:
        return error_response(404, "not_found", f"no route {request.method} {request.path}")
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        resp = error_response(405, "method_not_allowed", f"{request.method} not allowed; use {allowed}")
        resp.headers["Allow"] = allowed  # RFC 9110 15.5.6: a 405 names the methods that are
        return resp
    except Exception:
        log.exception("request_failed method=%s path=%s", request.method, request.path)
        return error_response(500, "internal", "internal error; see the server log")


def auth_middleware(tokens: TokenFile | None) -> Any:
    """Authenticate and authorize by route; without a tokens file every caller is admin."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        if resource is None:
            return await handler(request)  # no such route: the 404 says nothing worth hiding
        route = resource.canonical
        if tokens is None or auth.required_scopes(request.method, route) is None:
            request[auth.PRINCIPAL] = auth.OPEN if tokens is None else None
            return await handler(request)
        principal = tokens.authenticate(request.headers.get("Authorization"))
        auth.authorize(principal, request.method, route)
        request[auth.PRINCIPAL] = principal
        return await handler(request)

    return check


def server_options(limits: Limits) -> dict[str, Any]:
    """What aiohttp's server enforces before any handler runs: line, header and header-time limits."""
    return {"access_log": None, "max_line_size": limits.header_line_bytes_max,
            "max_field_size": limits.header_line_bytes_max, "max_headers": limits.headers_max,
            "keepalive_timeout": limits.header_read_s_max}


def make_app(node: Node, leases: LeaseQueue, tokens: TokenFile | None = None) -> web.Application:
    metrics = Metrics(node, lambda: leases.waiters)
    metrics.attach()
    policy = exposure.ExposurePolicy.build(node.config.http_host, node.config.allowed_hosts,
                                           node.config.allowed_origins)
    app = web.Application(middlewares=[metrics.middleware, errors_middleware, exposure.middleware(policy),
                                       auth_middleware(tokens), forward.middleware],
                          client_max_size=node.config.limits.request_bytes_max)
    app.on_response_prepare.append(exposure.cors_on_prepare(policy))
    app[inputs.LIMITS] = node.config.limits
    app[NODE] = node
    app[LEASES] = leases
    app[METRICS] = metrics
    app[CREATES] = jobs.creates_coalescer(node)
    app[COMMITS] = tasks.TaskCommits(node)
    app[SPEC] = openapi.document(version("schedulerd"), node.config.limits, tokens=tokens is not None)
    app.on_startup.append(forward.open_client)
    app.on_cleanup.append(forward.close_client)
    app.add_routes([web.route(method, path, handler) for method, path, handler in routes.ROUTES])
    return app
