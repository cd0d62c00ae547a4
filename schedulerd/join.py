"""Joining a running cluster (`schedulerd --join URL[,URL…]`): learn its shape from a member
before the node starts, then have a member register the node (a node outside the metadata
group cannot propose to it). The placement driver then adds the node to the metadata group
and gives it replicas."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import aiohttp

from schedulerd.config import NodeConfig

TIMEOUT_S = 10.0


class JoinError(Exception):
    """The cluster could not be reached or refused the node; the message says which."""


@dataclass(frozen=True)
class ClusterShape:
    groups: int
    replication_factor: int
    meta_members: tuple[str, ...]  # the metadata group's Raft addresses


def _headers(token: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def discover(urls: tuple[str, ...], token: str | None) -> ClusterShape:
    """The cluster's shape from the first member that answers (blocking: before the node starts)."""
    problems = []
    for url in urls:
        request = urllib.request.Request(url.rstrip("/") + "/v1/cluster", headers=_headers(token))
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                body = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            problems.append(f"{url}: {exc}")
            continue
        cluster = body.get("cluster")
        if cluster is None:
            problems.append(f"{url}: its cluster is not bootstrapped yet")
            continue
        return ClusterShape(cluster["groups"], cluster["replication_factor"], tuple(body["meta"]["raft_members"]))
    raise JoinError("no member to join: " + "; ".join(problems))


async def register(config: NodeConfig, entry: dict[str, Any]) -> dict[str, Any]:
    """Ask a member to register this node; the registry's answer ({"ok": …}) as the member gives it."""
    body = {k: entry[k] for k in ("node_id", "http", "raft")}
    problems = []
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, headers=_headers(config.join_token)) as session:
        for url in config.join:
            try:
                async with session.post(url.rstrip("/") + "/v1/cluster/nodes", json=body) as response:
                    answer = await response.json(content_type=None)
            except (aiohttp.ClientError, OSError, ValueError, TimeoutError) as exc:
                problems.append(f"{url}: {exc}")
                continue
            if response.status == 201 or response.status == 200:
                return {"ok": True, "joined": answer.get("joined", False)}
            error = answer.get("error", {}) if isinstance(answer, dict) else {}
            if response.status == 409:
                return {"ok": False, "error": error.get("message", "refused")}
            problems.append(f"{url}: {response.status} {error.get('message', '')}")
    raise JoinError("could not register with any member: " + "; ".join(problems))


async def standing(https: list[str], node_id: str, tls: bool) -> str | None:
    """This node's state in the registry as the first of `https` that answers has it."""
    scheme = "https" if tls else "http"
    timeout = aiohttp.ClientTimeout(total=2.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for http in https:
            try:
                async with session.get(f"{scheme}://{http}/v1/cluster/nodes/{node_id}") as response:
                    if response.status == 200:
                        state: str = (await response.json())["state"]
                        return state
            except (aiohttp.ClientError, OSError, ValueError, KeyError, TimeoutError):
                continue
    return None
