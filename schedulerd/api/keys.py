"""What the route handlers find on the app (aiohttp AppKeys): the node and the shared
state make_app builds once, so every handler is a plain module-level function."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from schedulerd.coalescer import Coalescer
from schedulerd.lease_queue import LeaseQueue
from schedulerd.metrics import Metrics
from schedulerd.node import Node

NODE = web.AppKey("node", Node)
LEASES = web.AppKey("leases", LeaseQueue)
CREATES = web.AppKey("creates", Coalescer)
# Acks and heartbeats of every worker on this node, coalesced (api/tasks.py's TaskCommits).
COMMITS: web.AppKey[Any] = web.AppKey("commits")
# This node's OpenAPI document, built once at start.
SPEC: web.AppKey[dict[str, Any]] = web.AppKey("openapi", dict)
METRICS = web.AppKey("metrics", Metrics)
