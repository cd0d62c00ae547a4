"""POST /v1/jobs:pause, /v1/jobs:resume, /v1/jobs:cancel: one action on every job a label
selector selects, in every group. Each group's holder lists the matching jobs in a state
the action applies to and proposes them bulk_batch_max at a time, one JOBS_ACTION entry
each (storage/jobs.act_on_jobs); a group held elsewhere is asked to do its share. The
answer counts the jobs selected (`matched`) and those whose state changed (`changed`):
a job changed since it was listed is left as it is."""
from __future__ import annotations

from aiohttp import web

from schedulerd import labels, views
from schedulerd.api import forward, inputs
from schedulerd.api.jobs import listed_groups, namespace_scope
from schedulerd.api.keys import NODE
from schedulerd.auth import audit_note
from schedulerd.errors import InvalidRequest, Unavailable, from_wire
from schedulerd.node import Node
from schedulerd.raft.group import Group
from schedulerd.storage import ops, queries
from schedulerd.storage.model import JobState
from schedulerd.storage.ops import Op

# The state a job must be in for the action to apply (None: any; apply refuses what it must).
LISTED_STATE = {"pause": JobState.SCHEDULED.value, "resume": JobState.PAUSED.value, "cancel": None}


async def pause(request: web.Request) -> web.Response:
    return await _act(request, "pause")


async def resume(request: web.Request) -> web.Response:
    return await _act(request, "resume")


async def cancel(request: web.Request) -> web.Response:
    return await _act(request, "cancel")


async def _act(request: web.Request, action: str) -> web.Response:
    node = request.app[NODE]
    inputs.check_query(request, frozenset({"groups"}))
    body = await inputs.body(request)
    if not isinstance(body, dict) or set(body) != {"selector"} or not isinstance(body["selector"], str):
        raise InvalidRequest('the body must be {"selector": "..."}, a label selector like "team=billing,env!=prod"')
    selector = labels.parse_selector(body["selector"])
    local, elsewhere = listed_groups(request, node)
    if "groups" in request.query and len(local) != len(request.query["groups"].split(",")):
        raise Unavailable("a group this share was sent for is no longer held here; retry")
    matched = changed = 0
    for group in local:
        node.require_entry_version(group, ops.JOBS_ACTION_SINCE, f"a bulk {action}")
        m, c = await _act_on_group(request, node, group, action, selector)
        matched, changed = matched + m, changed + c
    for group_id in elsewhere:
        share = await forward.send_json(request, group_id, f"{request.path}?groups={group_id}", body)
        matched, changed = matched + share["matched"], changed + share["changed"]
    return views.respond({"action": action, "selector": selector.text, "matched": matched, "changed": changed})


async def _act_on_group(request: web.Request, node: Node, group: Group, action: str,
                        selector: labels.Selector) -> tuple[int, int]:
    limits = node.config.limits
    prefix, bare_only = namespace_scope(request)
    matched = changed = 0
    after: str | None = None
    while True:
        with node.read(group) as (txn, tables):
            page, after = queries.list_jobs(txn, tables, state=LISTED_STATE[action], queue=None,
                                            limit=limits.bulk_batch_max, after=after, scan_max=limits.list_scan_max,
                                            now_us=node.now_us(), prefix=prefix, bare_only=bare_only,
                                            labels=selector.matches)
        if page:
            ids = [job["job_id"] for job in page]
            note = audit_note(request, f"{action} {len(ids)} jobs by selector {selector.text!r}", count=len(ids))
            result = await node.propose(group, Op.JOBS_ACTION, {"action": action, "job_ids": ids, "audit": note})
            if not result["ok"]:
                raise from_wire(result["code"], result["message"])
            matched, changed = matched + len(ids), changed + len(result["changed"])
        if after is None:
            return matched, changed

